"""Per-exec cost of the interposer: a bash loop of N `/bin/true`, plain vs gated.

    .venv/bin/python tests/native/bench_exec.py [N] [ROUNDS]

Cases, interleaved ROUNDS times, medians reported:
  plain     bash without the interposer
  fast      gated, snapshot present and not naming `true`: decided locally (no round trip)
  ask       gated, snapshot ASK_ALWAYS: one round trip per exec to a lean raw-fd server
            (single thread: accept, read the request, answer `run`, close)
  escalate  gated, `true` escalated: round trip + claim (in-process, by bash's child) + the
            stand-in spawning it (Python with posix_spawn in a thread per claim, playing the
            launcher's claim socket: an upper bound; bench/exec_overhead.py measures the real one)
Not a pytest test (no assertions): a measurement tool.
"""

from __future__ import annotations

import os
import resource
import secrets
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
BIN = HERE.parent.parent / "src" / "execgate" / "_bin"

from gateserver import Escalate, GateServer, encode_snapshot  # noqa: E402

from execgate.gate import protocol as P  # noqa: E402

RUN = P.RUN


def lean_server(path: str, stop: threading.Event) -> threading.Thread:
    lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lst.bind(path)
    lst.listen(128)
    lfd = lst.fileno()

    def serve() -> None:
        while not stop.is_set():
            try:
                fd, _ = socket.socket.accept(lst)  # type: ignore[misc]
            except OSError:
                return
            c = fd
            try:
                hdr = b""
                while len(hdr) < 4:
                    k = c.recv(4 - len(hdr))
                    if not k:
                        break
                    hdr += k
                if len(hdr) == 4:
                    (n,) = struct.unpack("<I", hdr)
                    got = 0
                    while got < n:
                        k = c.recv(n - got)
                        if not k:
                            break
                        got += len(k)
                    c.sendall(RUN)
            finally:
                c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    t.lst = lst  # type: ignore[attr-defined]
    _ = lfd
    return t


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    d = Path(tempfile.mkdtemp(prefix="egb", dir="/tmp"))
    token = secrets.token_hex(16)
    loop = f"for ((i=0;i<{n};i++)); do /bin/true; done"

    def env_for(sock: Path) -> dict[str, str]:
        e = dict(os.environ)
        e.update(
            LD_PRELOAD=str(BIN / "libexecgate.so"),
            EXECGATE_SOCKET=str(sock),
            EXECGATE_TOKEN=token,
            EXECGATE_WRAPPER=str(BIN / "execgate-wrapper"),
            EXEC_WRAPPER=str(BIN / "execgate-wrapper"),
            BASH_EXEC_WRAPPER=str(BIN / "execgate-wrapper"),
        )
        return e

    # fast path: a snapshot naming other programs
    fast_dir = d / "fast"
    fast_dir.mkdir()
    (fast_dir / "policy.snap").write_bytes(encode_snapshot([b"rm", b"curl", b"/usr/bin/rm"]))
    fast_env = env_for(fast_dir / "gate.sock")  # no server: nothing must ask
    # ask: ASK_ALWAYS + lean server
    ask_dir = d / "ask"
    ask_dir.mkdir()
    (ask_dir / "policy.snap").write_bytes(encode_snapshot(flags=1))
    stop = threading.Event()
    lean_server(str(ask_dir / "gate.sock"), stop)
    ask_env = env_for(ask_dir / "gate.sock")
    # escalate: the stand-in server escalates everything
    esc = GateServer(d / "esc")
    esc.token = token
    esc.ask_always()
    esc.rule = lambda req: Escalate()
    esc_env = env_for(esc.sock_path)
    esc_loop = f"for ((i=0;i<{max(n // 10, 50)};i++)); do /bin/true; done"

    cases = {
        "plain": (dict(os.environ), loop, n),
        "fast": (fast_env, loop, n),
        "ask": (ask_env, loop, n),
        "escalate": (esc_env, esc_loop, max(n // 10, 50)),
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for name, (env, script, count) in cases.items():
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            r = subprocess.run(["bash", "-c", script], env=env, capture_output=True)
            dt = time.perf_counter() - t0
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            assert r.returncode == 0, (name, r.stderr[:500])
            times[name].append(dt / count * 1e6)
            used = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
            cpu[name].append(used / count * 1e6)
    stop.set()
    esc.close()
    base = statistics.median(times["plain"])
    cbase = statistics.median(cpu["plain"])
    print(
        f"bash loop of {n} /bin/true, {rounds} interleaved rounds, median per exec "
        "(wall clock; CPU time of bash and its children, server excluded):"
    )
    for name, ts in times.items():
        med = statistics.median(ts)
        cmed = statistics.median(cpu[name])
        print(
            f"  {name:9s} wall {med:8.1f} us  x{med / base:.2f}   "
            f"cpu {cmed:8.1f} us  x{cmed / cbase:.2f}   "
            f"(wall min {min(ts):.1f}, max {max(ts):.1f})"
        )


if __name__ == "__main__":
    main()
