"""An escalated exec against the least its design can cost: the claim path with nothing checked.

execgate escalates a program out of the sandbox by a claim (docs/protocol.md §4): the shell's
fork child asks the launcher, which starts the program as its own child on the claimer's
descriptors, and the claimer waits for it and exits with its status. ``escalation_floor.c``
is that structure and nothing else, built here with ``cc``: a preloaded execve that sends the
program and descriptors 0-2 to a launcher that vforks, execs, waits and answers (the program
loads the preload library too, as execgate's descendants load the interposer). It checks
nothing: no stand-in, no judged file, no working directory or repository, no report to the
server, no descriptor table, no sandbox.

A bash loop of ``/bin/true``, timed inside bash, interleaved round-robin with the median of
the per-round ratios reported:

  plain        bash, no execgate
  floor        bash with the floor's preload library: every exec claimed at its launcher
  escalate     execgate run --sandbox workspace-write, `true` allowed (exec_overhead.py's
               row: every exec a standing claim)

``escalate ÷ floor`` is what execgate's checks and bookkeeping add to what the structure
costs; ``floor ÷ plain`` is the part no check can take away on this machine.

    python bench/escalation_floor.py [--execs 1000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from exec_overhead import LOOP, gated, loop_env  # a sibling script (bench/ is sys.path[0])

SOURCE = Path(__file__).with_name("escalation_floor.c")
RULES = 'prefix_rule(["true"], "allow")\n'


def build(out: Path) -> tuple[Path, Path]:
    """The floor's preload library and launcher, compiled into ``out``."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("escalation_floor: needs a C compiler (cc)")
    library, launcher = out / "floor.so", out / "floor-launch"
    flags = ["-O2", "-Wall", "-Wextra"]
    subprocess.run([cc, *flags, "-shared", "-fPIC", "-DFLOOR_PRELOAD", str(SOURCE), "-o",
                    str(library)], check=True)  # fmt: skip
    subprocess.run([cc, *flags, str(SOURCE), "-o", str(launcher)], check=True)
    return library, launcher


def per_exec(cmd: list[str], env: dict[str, str], execs: int) -> int:
    """Microseconds per exec of one run of the loop under ``cmd``."""
    loop = ["bash", "--norc", "--noprofile", "-c", LOOP.format(n=execs, program="/bin/true")]
    out = subprocess.run([*cmd, *loop], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="execgate-bench-") as tmp:
        home = Path(tmp)
        env = loop_env(home)
        library, launcher_program = build(home)
        sock = home / "floor.sock"
        launcher = subprocess.Popen([str(launcher_program), str(sock)], env=env)
        try:
            while not sock.exists():
                if launcher.poll() is not None:
                    sys.exit("escalation_floor: its launcher did not start")
                time.sleep(0.01)
            floor_env = {**env, "LD_PRELOAD": str(library), "EXECGATE_FLOOR_SOCK": str(sock)}
            rules = home / "allow.rules"
            rules.write_text(RULES)
            escalate = gated([], rules, ["--sandbox", "workspace-write"])
            rows: list[tuple[int, int, int]] = []
            for _ in range(args.rounds):
                plain = per_exec([], env, args.execs)
                floor = per_exec([], floor_env, args.execs)
                rows.append((plain, floor, per_exec(escalate, env, args.execs)))
        finally:
            launcher.kill()
            launcher.wait()

    def median_ratio(top: int, bottom: int) -> float:
        return statistics.median(row[top] / row[bottom] for row in rows)

    print(f"µs per exec, bash loop of {args.execs} /bin/true, {args.rounds} interleaved rounds")
    print(f"machine: {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}")
    for i, name in enumerate(("plain", "floor", "escalate (workspace-write)")):
        print(f"  {name:27} {statistics.median(row[i] for row in rows):6.0f} µs")
    print(f"  floor ÷ plain               {median_ratio(1, 0):6.2f}x  (the structure)")
    print(f"  escalate ÷ plain            {median_ratio(2, 0):6.2f}x  (goal ≤ 1.5x, issue 14)")
    print(f"  escalate ÷ floor            {median_ratio(2, 1):6.2f}x  (execgate's checks)")


if __name__ == "__main__":
    main()
