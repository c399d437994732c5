"""Where an escalated exec's time goes: CPU per exec of each process involved, against plain bash.

A bash loop of ``/bin/true`` under ``execgate run --sandbox workspace-write`` with ``true``
allowed (every exec escalated, as ``exec_overhead.py``'s ``escalate`` row). The loop reads the
CPU times of the processes of its session from ``/proc`` before and after (bash builtins only,
so the reading execs nothing): the server (Python: the launcher's parent, or its sibling when
the native front started the session), the launcher, the escalated programs (the launcher's
reaped children) and the loop's own children (the fork, the interposer's request and the
claimer waiting for the program). Plain bash's children are measured the same way in the same
rounds. CPU times are less moved by other load than wall times, but still moved: compare
medians of rounds run together.

    python bench/escalation_breakdown.py [--execs 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# Fields of /proc/PID/stat after the comm, 0-based: utime 11, stime 12, cutime 13, cstime 14.
LOOP = r"""
n={n}
me() {{ read -r -a s < /proc/$1/stat; echo $(( s[13] + s[14] )) $(( s[15] + s[16] )); }}
L=$PPID; read -r -a l < /proc/$L/stat; S=${{l[3]}}
# Started by the native front, the launcher's parent is the front and the server its sibling.
for c in $(< /proc/$S/task/$S/children); do [ "$c" != "$L" ] && S=$c; done
if [ "{gated}" = 0 ]; then L=$$; S=$$; fi
read -r s0 _ <<< "$(me $S)"; read -r l0 c0 <<< "$(me $L)"; read -r _ k0 <<< "$(me $$)"
t0=$EPOCHREALTIME
i=0; while [ $i -lt $n ]; do /bin/true; i=$((i+1)); done
t1=$EPOCHREALTIME
read -r s1 _ <<< "$(me $S)"; read -r l1 c1 <<< "$(me $L)"; read -r _ k1 <<< "$(me $$)"
echo wall $(( (${{t1/./}} - ${{t0/./}}) / n ))
echo server $(( (s1 - s0) * 1000000 / {hz} / n ))
echo launcher $(( (l1 - l0) * 1000000 / {hz} / n ))
echo escalated $(( (c1 - c0) * 1000000 / {hz} / n ))
echo shell-children $(( (k1 - k0) * 1000000 / {hz} / n ))
"""

PARTS = ("wall", "server", "launcher", "escalated", "shell-children")


def sample(cmd: list[str], env: dict[str, str]) -> dict[str, int]:
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines() if line.strip())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    hz = os.sysconf("SC_CLK_TCK")
    with tempfile.TemporaryDirectory(prefix="execgate-bench-") as tmp:
        home = Path(tmp)
        rules = home / "allow.rules"
        rules.write_text('prefix_rule(["true"], "allow")\n')
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "EXECGATE_HOME": str(home / "execgate"),
            "LANG": "C.UTF-8",
        }
        gate = [sys.executable, "-m", "execgate", "run", "--rules", str(rules)]
        gate += ["--sandbox", "workspace-write", "--"]
        runs = {
            "plain": ["bash", "--norc", "--noprofile", "-c"],
            "escalate": [*gate, "bash", "--norc", "--noprofile", "-c"],
        }
        samples: dict[str, list[dict[str, int]]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, cmd in runs.items():
                loop = LOOP.format(n=args.execs, hz=hz, gated=int(name != "plain"))
                samples[name].append(sample([*cmd, loop], env))
    print(f"µs per exec, bash loop of {args.execs} /bin/true, median of {args.rounds} rounds")
    print(f"machine: {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}")
    for name, rows in samples.items():
        parts = ("wall", "shell-children") if name == "plain" else PARTS
        shown = "  ".join(f"{p} {statistics.median(r[p] for r in rows):6.0f}" for p in parts)
        print(f"  {name:9} {shown}")


if __name__ == "__main__":
    main()
