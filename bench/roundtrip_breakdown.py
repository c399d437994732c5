"""Where a ``shell`` round trip's time goes, execgate against the reference, in one run.

Runs interleaved round trips of ``true`` (non-login, no sandbox by default; the client of
``compare_reference.py``) while ``perf record`` watches the scheduler's fork, exec and exit
events of the whole machine (on CLOCK_MONOTONIC, the calls' clock), then splits each server's
median call into the part of its shell's life inside the call (from the call's start, or the
shell's fork if later, to its exit: execgate's shell was forked and exec'd before the call,
and waited, held) and everything else (the client, the server and the hand-offs between them:
what a server adds). Needs ``perf`` and the right to trace the
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
import tempfile
import time
from pathlib import Path

import compare_reference as cr  # a sibling script (bench/ is sys.path[0])

EVENTS = ["sched:sched_process_fork", "sched:sched_process_exec", "sched:sched_process_exit"]
LINE = re.compile(r"\s*(.+?)\s+(\d+)/\d+\s+\[\d+\]\s+([\d.]+):\s+sched:(\w+):\s+(.*)")


def shells(script: str) -> list[tuple[str, float, float]]:
    """(server, fork time, exit time) of every shell each server started: execgate's are the
    launcher's children, the reference's its runtime's."""
    forked: dict[int, tuple[str, float]] = {}
    bash: set[int] = set()
    found: list[tuple[str, float, float]] = []
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
            bash.add(pid)
        elif event == "sched_process_exit" and pid in bash and pid in forked:
            parent, start = forked.pop(pid)
            server = "execgate" if parent == "execgate-launch" else "reference"
            found.append((server, start, when))
    return found


async def measure(
    args: argparse.Namespace, ref: cr.Reference, data: Path
) -> dict[str, list[tuple[float, float]]]:
    """Each server's calls, as (start, end) on CLOCK_MONOTONIC."""
    with tempfile.TemporaryDirectory(prefix="execgate-bench-") as tmp:
        place = cr.Place(Path(tmp))
        rules = place.rules_file("none", cr.NO_MATCH)
        servers = [
            cr.execgate_server(place, args.sandbox, rules),
            cr.reference_server(place, ref, args.sandbox, cr.NO_MATCH),
        ]
        clients = [await s.start(place.work) for s in servers]
        perf = subprocess.Popen(
            # -N: no build-id cache, whose hard links to the programs seen (~/.debug) would
            # make each of them a file of several links, which always asks (protocol §6)
            ["perf", "record", "-q", "-N", "-a", "-k", "CLOCK_MONOTONIC", "-o", str(data),
             *(f"-e{e}" for e in EVENTS)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(0.5)  # perf is tracing before the first call
        calls: dict[str, list[tuple[float, float]]] = {s.name: [] for s in servers}
        try:
            for client in clients:
                await client.shell("true", place.work, args.login)
            for _ in range(args.calls):
                for server, client in zip(servers, clients, strict=True):
                    started = time.monotonic()
                    await client.shell("true", place.work, args.login)
                    calls[server.name].append((started, time.monotonic()))
        finally:
            perf.send_signal(signal.SIGINT)
            perf.wait()
            for client in clients:
                await client.aclose()
        return calls


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
    found = shells(script)
    shell = "login" if args.login else "non-login"
    print(f"`shell` round trip of `true`, {shell}, sandbox {args.sandbox}: medians in µs")
    print(f"{'':12}{'call':>8}{'shell in the call':>19}{'the rest':>10}")
    for name in ("execgate", "reference"):
        whole, inside = [], []
        for start, end in calls[name]:
            lives = [(f, x) for s, f, x in found if s == name and start <= x <= end]
            if len(lives) != 1:
                continue  # not seen (or not alone) in this call
            fork, exit_ = lives[0]
            whole.append((end - start) * 1e6)
            inside.append((exit_ - max(fork, start)) * 1e6)
        if not whole:
            print("roundtrip_breakdown: skipped: perf saw no shells (tracing not permitted?)")
            return
        call, part = statistics.median(whole), statistics.median(inside)
        print(f"{name:12}{call:8.0f}{part:19.0f}{call - part:10.0f}")
    print("the rest: the client, the server and the hand-offs (the same client for both)")


if __name__ == "__main__":
    main()
