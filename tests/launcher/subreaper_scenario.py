"""Run one end-of-session scenario as a child subreaper and report what survived, as JSON.

    python subreaper_scenario.py SCENARIO [--sandboxed]

This process makes itself a subreaper before starting the launcher, so anything the launcher
fails to kill or reap (a live process or a zombie) is reparented here, where we can see it in
/proc/self/task/*/children. Scenarios:

    shutdown   Launcher.shutdown() (the control message)
    eof        the control channel is closed under the launcher (the server died)
    sigterm    SIGTERM to the launcher
    forkbomb   shutdown while descendants fork continuously and respawn on SIGTERM
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from egtest_launch import alive, env_list, kill_quietly

from execgate.gate.launcher import Launcher
from execgate.sandbox import build_spec

PR_SET_CHILD_SUBREAPER = 36

TREE = r"""
rec() { echo "$1" >> "$PIDS"; }
sleep 1000 & rec $!                                   # a plain background child
setsid sleep 1000 & rec $!                            # its own session
( sleep 1000 & rec $! ) &                             # double fork: orphaned to the launcher
( trap '' TERM; exec sleep 1000 ) & rec $!            # ignores SIGTERM
( setsid bash -c 'trap "" TERM HUP; rec() { echo "$1" >> "$PIDS"; }; rec $$;
   while :; do sleep 1000 & rec $!; wait; done' & ) & # a daemon loop ignoring SIGTERM
nohup sleep 1000 >/dev/null 2>&1 & rec $!
rec $$
wait
"""
TREE_COUNT = 8  # lines TREE writes before it waits

FORKBOMB = r"""
rec() { echo "$1" >> "$PIDS"; }
( trap '' TERM; rec $BASHPID; for i in $(seq 30000); do sleep 1000 & done; wait ) &
( trap 'setsid sleep 1000 & setsid sleep 1000 & setsid bash -c "trap \"\" TERM; sleep 1000" &' TERM
  rec $BASHPID; while :; do sleep 0.01; done ) &
rec $$
wait
"""
FORKBOMB_COUNT = 3
FORKBOMB_POPULATION = 50  # processes alive before the session ends


def children_of_self() -> list[int]:
    kids: list[int] = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            kids += [int(p) for p in f.read().split()]
    return kids


def descendants(root: int) -> int:
    """How many processes currently descend from root (scanning /proc)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    count = 0
    for pid in parent:
        p, seen = pid, 0
        while p in parent and p > 1 and seen < 10000:
            p = parent[p]
            seen += 1
            if p == root:
                count += 1
                break
    return count


def reap_all() -> list[int]:
    reaped: list[int] = []
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append(pid)


async def scenario(name: str, sandboxed: bool) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="egsr-"))
    pids_file = work / "pids"
    pids_file.touch()
    spec = build_spec("workspace-write", cwd=work) if sandboxed else None
    launcher = await Launcher.start(spec, new_session=True)
    script, count = (FORKBOMB, FORKBOMB_COUNT) if name == "forkbomb" else (TREE, TREE_COUNT)
    with open(os.devnull, "r+b") as null:
        process = await launcher.spawn(
            path=b"/bin/bash",
            argv=[b"bash", b"-c", script.encode()],
            env=env_list(PIDS=str(pids_file)),
            cwd=os.fsencode(work),
            fds={0: null.fileno(), 1: null.fileno(), 2: null.fileno()},
            sandboxed=sandboxed,
            pgid=0,
        )
    deadline = time.monotonic() + 20
    while len(pids_file.read_text().split()) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"tree not ready: {pids_file.read_text()!r}")
        await asyncio.sleep(0.01)
    population = descendants(launcher.pid)
    while name == "forkbomb" and population <= FORKBOMB_POPULATION:  # however slow the machine
        if time.monotonic() > deadline:
            raise RuntimeError(f"the fork bomb reached only {population} processes")
        await asyncio.sleep(0.05)
        population = descendants(launcher.pid)
    recorded = [int(p) for p in pids_file.read_text().split()]
    pidfds = {pid: os.pidfd_open(pid) for pid in recorded if alive(pid)}

    started = time.monotonic()
    if name in ("shutdown", "forkbomb"):
        await launcher.shutdown(grace=0.2)
    elif name == "eof":
        launcher._reader.cancel()
        launcher._channel.close()
        await asyncio.wait_for(launcher._exit, 30)
    elif name == "sigterm":
        os.kill(launcher.pid, signal.SIGTERM)
        await asyncio.wait_for(launcher._exit, 30)
    elapsed = time.monotonic() - started
    launcher_status = await launcher._exit

    main_status: object
    try:
        main_status = await asyncio.wait_for(process.wait(), 5)
    except Exception as exc:  # eof/sigterm: nobody to report to, the wait fails
        main_status = type(exc).__name__

    # Everything recorded is gone (the pidfd proves it is the same process we saw).
    import select

    survivors = []
    for pid, fd in pidfds.items():
        if not select.select([fd], [], [], 0)[0]:
            survivors.append(pid)
        os.close(fd)
    time.sleep(0.05)
    left = [pid for pid in children_of_self() if pid != os.getpid()]
    kill_quietly(left + survivors)
    zombies_or_orphans = sorted(set(left))
    reap_all()
    return {
        "recorded": len(recorded),
        "descendants": population,
        "survivors": survivors,
        "left_to_us": zombies_or_orphans,
        "launcher_status": launcher_status,
        "main_status": main_status,
        "elapsed": elapsed,
    }


def main() -> None:
    name = sys.argv[1]
    sandboxed = "--sandboxed" in sys.argv
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl")
    result = asyncio.run(scenario(name, sandboxed))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
