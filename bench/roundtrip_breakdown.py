"""Where a ``shell`` round trip's time goes, execgate against the reference, in one run.

Runs ``compare_reference.py``'s interleaved round trips of ``true`` (non-login, no sandbox by
default) while ``perf record`` watches the scheduler's fork, exec and exit events of the whole
machine, then splits each server's median call into the shell's own life (its fork to its exec,
its exec to its exit: the same bash work in both) and everything else (the client, the server,
and the hand-offs between them: what a server adds). Needs ``perf`` and the right to trace the
machine (root, or ``kernel.perf_event_paranoid`` ≤ -1); says so and exits 0 otherwise.

    python bench/roundtrip_breakdown.py [--calls 60] [--sandbox off|workspace-write] [--login]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import compare_reference as cr  # a sibling script (bench/ is sys.path[0])

EVENTS = ["sched:sched_process_fork", "sched:sched_process_exec", "sched:sched_process_exit"]
LINE = re.compile(r"\s*(.+?)\s+(\d+)/\d+\s+\[\d+\]\s+([\d.]+):\s+sched:(\w+):\s+(.*)")


def shell_lives(script: str) -> dict[str, list[tuple[float, float]]]:
    """(fork to exec, exec to exit) in seconds of every shell each server started: execgate's
    are the launcher's children, the reference's its runtime's."""
    forked: dict[int, tuple[str, float]] = {}
    execed: dict[int, float] = {}
    lives: dict[str, list[tuple[float, float]]] = {"execgate": [], "reference": []}
    for line in script.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        comm, pid, when, event, rest = m[1], int(m[2]), float(m[3]), m[4], m[5]
        if event == "sched_process_fork":
            child = re.search(r"child_pid=(\d+)", rest)
            if child:
                forked[int(child[1])] = (comm, when)
        elif event == "sched_process_exec" and comm == "bash":
            execed[pid] = when
        elif event == "sched_process_exit" and pid in execed and pid in forked:
            parent, start = forked.pop(pid)
            server = "execgate" if parent == "execgate-launch" else "reference"
            lives[server].append((execed[pid] - start, when - execed.pop(pid)))
    return lives


async def measure(args: argparse.Namespace, ref: cr.Reference, data: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="execgate-bench-") as tmp:
        place = cr.Place(Path(tmp))
        rules = place.rules_file("none", cr.NO_MATCH)
        servers = [
            cr.execgate_server(place, args.sandbox, rules),
            cr.reference_server(place, ref, args.sandbox, cr.NO_MATCH),
        ]
        perf = subprocess.Popen(
            ["perf", "record", "-q", "-a", "-o", str(data), *(f"-e{e}" for e in EVENTS)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)  # perf is tracing before the first call
        try:
            return await cr.round_trips(servers, place, args.calls, args.login)
        finally:
            perf.send_signal(signal.SIGINT)
            perf.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--sandbox", choices=["off", "workspace-write"], default="off")
    parser.add_argument("--login", action="store_true")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        print("roundtrip_breakdown: skipped: perf is not installed")
        return
    ref = cr.find_reference(install=True)
    if ref is None:
        print("roundtrip_breakdown: skipped: the reference server could not be installed")
        return
    with tempfile.TemporaryDirectory(prefix="execgate-perf-") as tmp:
        data = Path(tmp) / "perf.data"
        calls = asyncio.run(measure(args, ref, data))
        script = subprocess.run(
            ["perf", "script", "-i", str(data), "-F", "comm,pid,tid,cpu,time,event,trace"],
            capture_output=True,
            text=True,
        ).stdout
    lives = shell_lives(script)
    if not all(lives.values()):
        print("roundtrip_breakdown: skipped: perf saw no shells (tracing not permitted?)")
        return
    shell = "login" if args.login else "non-login"
    print(f"`shell` round trip of `true`, {shell}, sandbox {args.sandbox}: medians in µs")
    print(f"{'':12}{'call':>8}{'fork→exec':>11}{'exec→exit':>11}{'the rest':>10}")
    for name in ("execgate", "reference"):
        spawn = statistics.median(a for a, _ in lives[name]) * 1e6
        run = statistics.median(b for _, b in lives[name]) * 1e6
        call = calls[name] * 1e6
        print(f"{name:12}{call:8.0f}{spawn:11.0f}{run:11.0f}{call - spawn - run:10.0f}")
    print("the rest: the client, the server and the hand-offs (the same client for both)")


if __name__ == "__main__":
    sys.exit(main())
