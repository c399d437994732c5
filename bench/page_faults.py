"""Page faults per exec of a gated bash loop, against plain bash: what a fork child pays.

A gated exec runs in a child bash has just forked, where each page first written and each text
page first run is a page fault (docs/architecture.md, "What every gated process pays"); on a
VM each costs about 2 µs. The loop reads its own and its reaped children's minor faults from
``/proc/$$/stat`` before and after (bash builtins only, so the reading faults nothing it
counts), per configuration:

  plain                 bash, no execgate
  run (snapshot)        execgate run, `true` named by no rule: decided in the fork child
  run, workspace-write  the same inside the workspace-write sandbox
  escalate              `true` allowed, in workspace-write: every exec a standing claim; the
                        children counted are the claimers (the escalated programs are the
                        launcher's children)

Fault counts move by a few between runs (fault-around, the page cache), far less than times
do with load: a change to the exec path shows here as whole pages.

    python bench/page_faults.py [--execs 1000]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from exec_overhead import CONFIGS, gated, loop_env  # a sibling script (bench/ is sys.path[0])

# /proc/PID/stat split on spaces (the comm has none here): minflt is field 10, cminflt 11.
LOOP = r"""
me() {{ read -r -a s < /proc/$$/stat; echo $(( s[9] )) $(( s[10] )); }}
read -r m0 c0 <<< "$(me)"
i=0; while [ $i -lt {n} ]; do /bin/true; i=$((i+1)); done
read -r m1 c1 <<< "$(me)"
echo $(( (m1 - m0) / {n} )) $(( (c1 - c0) / {n} ))
"""

#: exec_overhead.py's configurations of the same names (its docstring says what each is).
SHOWN = ("plain", "run (snapshot)", "run, workspace-write", "escalate")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execs", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="execgate-bench-") as tmp:
        home = Path(tmp)
        env = loop_env(home)
        loop = LOOP.format(n=args.execs)
        print(f"minor page faults per exec, bash loop of {args.execs} /bin/true")
        print(f"  {'':22} {'the shell':>9} {'its children':>12}")
        for i, name in enumerate(SHOWN):
            rules, options = CONFIGS[name]
            path = None
            if rules is not None:
                path = home / f"rules{i}.rules"
                path.write_text(rules)
            cmd = gated(["bash", "--norc", "--noprofile", "-c", loop], path, options)
            out = subprocess.run(
                cmd, env=env, cwd=home, capture_output=True, text=True, check=True
            ).stdout
            shell, children = out.split()[-2:]
            print(f"  {name:22} {shell:>9} {children:>12}")


if __name__ == "__main__":
    main()
