"""What execgate adds to a real build: ``make`` of a generated project of 31 small C files.

The whole wall time a user waits for counts: execgate's start-up, the interposer loaded into
every process (``make`` → ``cc`` → ``cc1``, ``as``, ``collect2``, ``ld``), every decision and
the teardown. Each round cleans the project, then builds it once plainly and once under
``execgate run`` per sandbox mode, in turn; the figure is the median over rounds of gated ÷
the plain build of the same round. The machine is shared: read medians, not single runs.

Each round also splits the added time per mode: the same build timed inside a session that
has been up for half a second (what every exec of the build pays: the interposer, the
sandbox), and ``execgate run -- sleep 0.3`` less a plain ``sleep 0.3`` (start-up and teardown
of a session whose server has come up: ``execgate run -- true`` ends before it has, and its
server's own start is not waited for). What neither holds is the server's start beside the
build's first fraction of a second (its CPU, about 150 ms, on the other core).

    python bench/build_overhead.py [--rounds 5] [--jobs 1] [--sandbox off,workspace-write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FILES = 31
RULES = 'prefix_rule(pattern = ["git", "push"], decision = "prompt")\n'


def write_project(root: Path) -> None:
    """``FILES`` C files (30 small modules and a main that calls them) and a Makefile."""
    src = root / "src"
    src.mkdir(parents=True)
    calls = []
    for i in range(FILES - 1):
        (src / f"mod{i}.c").write_text(
            "#include <stdio.h>\n#include <string.h>\n"
            f"static int table{i}[64];\n"
            f"int mod{i}(int x) {{\n"
            f"    for (int k = 0; k < 64; k++) table{i}[k] = (x * k + {i}) % 97;\n"
            f'    char buf[32]; snprintf(buf, sizeof buf, "%d", table{i}[x % 64]);\n'
            "    return (int)strlen(buf) + x;\n}\n"
        )
        calls.append(f"    total += mod{i}(total);")
    prototypes = "".join(f"int mod{i}(int);\n" for i in range(FILES - 1))
    (src / "main.c").write_text(
        f"#include <stdio.h>\n{prototypes}int main(void) {{\n    int total = 1;\n"
        + "\n".join(calls)
        + '\n    printf("%d\\n", total);\n    return 0;\n}\n'
    )
    (root / "Makefile").write_text(
        "CC = cc\nCFLAGS = -O1\n"
        "OBJS = $(patsubst src/%.c,build/%.o,$(wildcard src/*.c))\n"
        "app: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n"
        "build/%.o: src/%.c | build\n\t$(CC) $(CFLAGS) -c -o $@ $<\n"
        "build:\n\tmkdir -p build\n"
        "clean:\n\trm -rf build app\n"
    )


def execgate_command() -> list[str]:
    """``execgate`` as a user runs it: the installed command beside this Python (native,
    native/entry.c), or ``python -m execgate`` where none is installed."""
    entry = Path(sys.executable).parent / "execgate"
    return [str(entry)] if entry.is_file() else [sys.executable, "-m", "execgate"]


def isolated_env(root: Path) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(root / "home"),
        "EXECGATE_HOME": str(root / "execgate-home"),
        "EXECGATE_SYSTEM_DIR": str(root / "etc-execgate"),
        "EXECGATE_CODEX_SYSTEM_DIR": str(root / "etc-codex"),
        "CODEX_HOME": str(root / "codex-home"),
    }
    for key in ("HOME", "EXECGATE_HOME", "CODEX_HOME"):
        os.makedirs(env[key], exist_ok=True)
    return env


def build(project: Path, env: dict[str, str], gate: list[str], jobs: int) -> float:
    """Seconds of one clean build (``gate``: the ``execgate run …`` prefix, or none)."""
    subprocess.run(["make", "-s", "clean"], cwd=project, env=env, check=True)
    started = time.perf_counter()
    subprocess.run(
        [*gate, "make", "-s", f"-j{jobs}"], cwd=project, env=env, check=True,
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return time.perf_counter() - started


SLEEP = 0.3


def start_up(env: dict[str, str], gate: list[str], cwd: Path) -> float:
    """Seconds ``execgate run -- sleep 0.3`` takes beyond a plain ``sleep 0.3`` (start-up and
    teardown of a session whose server has come up)."""
    took = []
    for command in ([*gate, "sleep", str(SLEEP)], ["sleep", str(SLEEP)]):
        started = time.perf_counter()
        subprocess.run(command, cwd=cwd, env=env, check=True)
        took.append(time.perf_counter() - started)
    return took[0] - took[1]


def build_inside(project: Path, env: dict[str, str], gate: list[str], jobs: int) -> float:
    """Seconds of one clean build timed half a second after it was cleaned, inside a session
    that has been up since (``gate``; none: plainly): its start and end left out, what the
    build's execs pay."""
    subprocess.run(["make", "-s", "clean"], cwd=project, env=env, check=True)
    script = (
        f"sleep 0.5; s=$(date +%s%N); make -s -j{jobs} >/dev/null; e=$(date +%s%N); echo $((e - s))"
    )
    done = subprocess.run(
        [*gate, "sh", "-c", script], cwd=project, env=env, check=True, capture_output=True,
        text=True,
    )  # fmt: skip
    return int(done.stdout.split()[-1]) / 1e9


def measure(
    modes: list[str], rounds: int, jobs: int, *, breakdown: bool = True
) -> dict[str, list[float]]:
    """Per mode (and "plain"), the seconds of each round's build; with ``breakdown``, per
    ``inside MODE`` the build timed inside a running session and per ``start-up MODE`` what
    a session adds to ``sleep 0.3``."""
    with tempfile.TemporaryDirectory(prefix="eg-build-") as tmp:
        root = Path(tmp)
        project = root / "project"
        write_project(project)
        env = isolated_env(root)
        rules = root / "bench.rules"
        rules.write_text(RULES)
        gates = {
            mode: [*execgate_command(), "run", "--rules", str(rules), "--sandbox", mode, "--"]
            for mode in modes
        }  # fmt: skip
        build(project, env, [], jobs)  # warm the page cache and the compiler
        times: dict[str, list[float]] = {"plain": [], **{mode: [] for mode in modes}}
        if breakdown:
            times["inside plain"] = []
            times.update({f"inside {mode}": [] for mode in modes})
            times.update({f"start-up {mode}": [] for mode in modes})
        for gate in gates.values():
            start_up(env, gate, project)  # the compiled-policy cache is warm from here on
        for _ in range(rounds):
            times["plain"].append(build(project, env, [], jobs))
            if breakdown:
                times["inside plain"].append(build_inside(project, env, [], jobs))
            for mode, gate in gates.items():
                times[mode].append(build(project, env, gate, jobs))
                if breakdown:
                    times[f"inside {mode}"].append(build_inside(project, env, gate, jobs))
                    times[f"start-up {mode}"].append(start_up(env, gate, project))
        return times


def ratios(times: dict[str, list[float]], mode: str) -> list[float]:
    return [g / p for g, p in zip(times[mode], times["plain"], strict=True)]


def measure_ratio(mode: str, *, rounds: int = 3, jobs: int = 1) -> float:
    """The median whole-build ratio gated ÷ plain for one sandbox mode."""
    return statistics.median(ratios(measure([mode], rounds, jobs, breakdown=False), mode))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--sandbox", default="off,workspace-write")
    args = parser.parse_args()
    modes = [m for m in args.sandbox.split(",") if m]
    times = measure(modes, args.rounds, args.jobs)
    plain = statistics.median(times["plain"])
    print(
        f"make -j{args.jobs} of {FILES} C files, median of {args.rounds} interleaved rounds "
        f"({os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f})"
    )
    print(f"  plain                 {plain:6.3f} s")
    for mode in modes:
        each = ratios(times, mode)
        print(
            f"  sandbox {mode:<15} {statistics.median(times[mode]):6.3f} s  "
            f"{statistics.median(each):5.3f}x plain  (rounds {min(each):.3f} to {max(each):.3f})"
        )
        added = statistics.median(g - p for g, p in zip(times[mode], times["plain"], strict=True))
        inside = statistics.median(
            i - p for i, p in zip(times[f"inside {mode}"], times["inside plain"], strict=True)
        )
        fixed = statistics.median(times[f"start-up {mode}"])
        print(
            f"    added {added * 1000:.0f} ms; of it (each a median of per-round differences: "
            "on a shared machine they need not add up): every exec of the build "
            f"{inside * 1000:.0f} ms (timed inside a running session, against a plain build "
            f"timed alike), start-up and teardown {fixed * 1000:.0f} ms (execgate run -- "
            f"sleep {SLEEP} less sleep {SLEEP}); the server's start beside the build is in "
            "neither"
        )


if __name__ == "__main__":
    main()
