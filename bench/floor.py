"""execgate's per-exec costs against the least its design can cost, on this machine, in one run.

``floor.c``, built here with ``cc``, models the two paths with nothing decided or checked:

* a gated exec: every program loads a preloaded library whose ``execve`` only passes the exec
  on. What execgate adds to it is the snapshot decision (docs/protocol.md §6) and the
  interposer's own size;
* an escalation (docs/protocol.md §4): the shell's fork child sends the program and
  descriptors 0-2 to a launcher, which vforks, execs and waits for it and answers the status;
  the claimer waits and exits with it, and the program loads the library too (descendants stay
  gated). It checks nothing: no stand-in, no judged file, no working directory or repository,
  no report to the server, no descriptor table, no sandbox.

A bash loop of ``/bin/true``, timed inside bash, interleaved round-robin; each ratio is the
median of the per-round ratios:

  plain                 bash, no execgate
  preload only          bash with the floor's library, no launcher: every exec passed on
  run (snapshot)        execgate run, `true` named by no rule (exec_overhead.py's row)
  escalation floor      bash with the floor's library and launcher: every exec claimed
  escalate              execgate run --sandbox workspace-write, `true` allowed: every exec a
                        standing claim (exec_overhead.py's row)

``preload only ÷ plain`` and ``escalation floor ÷ plain`` are what no check can take away;
``run ÷ preload only`` and ``escalate ÷ escalation floor`` are what execgate adds to them.

    python bench/floor.py [--execs 1000] [--rounds 15]
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

from exec_overhead import loop_env, measure  # a sibling script (bench/ is sys.path[0])

SOURCE = Path(__file__).with_name("floor.c")
NO_RULE = 'prefix_rule(["git", "push"], "prompt")\n'
ALLOW_TRUE = 'prefix_rule(["true"], "allow")\n'
ROWS = ("plain", "preload only", "run (snapshot)", "escalation floor", "escalate")
# (ratio shown, its top row, its bottom row, what it says)
RATIOS = (
    ("preload only ÷ plain", "preload only", "plain", "any interposer"),
    ("run (snapshot) ÷ plain", "run (snapshot)", "plain", "goal ≤ 1.10x, issue 14"),
    ("run (snapshot) ÷ preload only", "run (snapshot)", "preload only", "execgate's part"),
    ("escalation floor ÷ plain", "escalation floor", "plain", "the structure"),
    ("escalate ÷ plain", "escalate", "plain", "goal ≤ 1.5x, issue 14"),
    ("escalate ÷ escalation floor", "escalate", "escalation floor", "execgate's checks"),
)


def build(out: Path) -> tuple[Path, Path]:
    """The floor's preload library and launcher, compiled into ``out``."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("floor: needs a C compiler (cc)")
    library, launcher = out / "floor.so", out / "floor-launch"
    flags = ["-O2", "-Wall", "-Wextra"]
    subprocess.run([cc, *flags, "-shared", "-fPIC", "-DFLOOR_PRELOAD", str(SOURCE), "-o",
                    str(library)], check=True)  # fmt: skip
    subprocess.run([cc, *flags, str(SOURCE), "-o", str(launcher)], check=True)
    return library, launcher


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
                    sys.exit("floor: its launcher did not start")
                time.sleep(0.01)
            (home / "none.rules").write_text(NO_RULE)
            (home / "allow.rules").write_text(ALLOW_TRUE)
            preloaded = {**env, "LD_PRELOAD": str(library)}
            # name: (rules file or None for no execgate, `execgate run` options, environment)
            configs: dict[str, tuple[Path | None, list[str], dict[str, str]]] = {
                "plain": (None, [], env),
                "preload only": (None, [], preloaded),
                "run (snapshot)": (home / "none.rules", [], env),
                "escalation floor": (None, [], {**preloaded, "EXECGATE_FLOOR_SOCK": str(sock)}),
                "escalate": (home / "allow.rules", ["--sandbox", "workspace-write"], env),
            }
            true = Path("/bin/true")
            rounds = [
                {
                    name: measure(rules, options, args.execs, run_env, true)
                    for name, (rules, options, run_env) in configs.items()
                }
                for _ in range(args.rounds)
            ]
        finally:
            launcher.kill()
            launcher.wait()
    print(f"µs per exec, bash loop of {args.execs} /bin/true, {args.rounds} interleaved rounds")
    print(f"machine: {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}")
    for name in ROWS:
        print(f"  {name:31} {statistics.median(r[name] for r in rounds):6.0f} µs")
    for shown, top, bottom, says in RATIOS:
        ratio = statistics.median(r[top] / r[bottom] for r in rounds)
        print(f"  {shown:31} {ratio:6.2f}x  ({says})")


if __name__ == "__main__":
    main()
