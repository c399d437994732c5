"""Throughput and concurrency of the session proxy, as a ratio against a direct transfer.

A source server (its own process) sends BYTES on every connection. The same client reads
them once directly and once through the proxy's ``CONNECT`` (the proxy in its own process,
as it runs in the session's server, admitting 127.0.0.1); configurations alternate for
``--rounds`` rounds and the medians are compared. Then ``--concurrent`` tunnels are opened at
once and each carries a small echo.

    python bench/proxy.py [--bytes 1G] [--rounds 3] [--concurrent 200]

Target (issue 15): proxied throughput >= 80% of direct; all concurrent tunnels succeed.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import statistics
import subprocess
import sys
import time

CHUNK = 1 << 20


def _parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].isalpha() else int(text)


# -- the processes ------------------------------------------------------------------------------


def serve_source(port_out: int) -> None:
    """Each connection: read one line (a byte count, or ``echo``), then send that many bytes
    (or echo what comes until EOF)."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
    os.write(port_out, f"{listener.getsockname()[1]}\n".encode())
    os.close(port_out)
    block = memoryview(b"x" * CHUNK)
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            line = b""
            while not line.endswith(b"\n"):
                got = conn.recv(64)
                if not got:
                    os._exit(0)
                line += got
            if line.strip() == b"echo":
                while data := conn.recv(65536):
                    conn.sendall(data)
            else:
                left = int(line)
                while left > 0:
                    left -= conn.send(block[: min(left, CHUNK)])
            conn.close()
            os._exit(0)
        conn.close()
        while True:  # reap finished children without blocking
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break


def serve_proxy(port_out: int) -> None:
    """The real NetProxy, with a gatekeeper that admits 127.0.0.1."""
    import anyio

    from execgate.netproxy.server import Admission, Connection, NetProxy, Origin

    class AdmitLoopback:
        async def admit(self, connection: Connection) -> Admission:
            return Admission(addresses=(ipaddress.ip_address(connection.target.host),))

        def connected(self, connection: Connection, address: object, error: str) -> None:
            pass

    listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
    os.write(port_out, f"{listener.getsockname()[1]}\n".encode())
    os.close(port_out)
    anyio.run(NetProxy(AdmitLoopback()).serve_listener, listener, Origin(0, os.getpid()))


def _start(role: str) -> tuple[subprocess.Popen[bytes], int]:
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, __file__, f"--{role}", str(write_end)], pass_fds=[write_end]
    )
    os.close(write_end)
    with os.fdopen(read_end) as f:
        port = int(f.readline())
    return proc, port


# -- the client -----------------------------------------------------------------------------------


def _connect(source: int, proxy: int | None) -> socket.socket:
    if proxy is None:
        return socket.create_connection(("127.0.0.1", source))
    sock = socket.create_connection(("127.0.0.1", proxy))
    sock.sendall(f"CONNECT 127.0.0.1:{source} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        got = sock.recv(1)
        if not got:
            raise RuntimeError("the proxy closed the connection")
        head += got
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"CONNECT refused: {head!r}")
    return sock


def transfer(source: int, proxy: int | None, size: int) -> float:
    """Seconds to read ``size`` bytes from the source (directly or through the proxy)."""
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    start = time.perf_counter()
    with _connect(source, proxy) as sock:
        sock.sendall(f"{size}\n".encode())
        got = 0
        while got < size:
            n = sock.recv_into(view)
            if not n:
                raise RuntimeError(f"short transfer: {got} of {size} bytes")
            got += n
    return time.perf_counter() - start


def concurrent_tunnels(source: int, proxy: int, count: int) -> tuple[int, float]:
    """Open ``count`` tunnels at once, then echo a line through each; (successes, seconds)."""
    start = time.perf_counter()
    socks = []
    for _ in range(count):
        sock = _connect(source, proxy)
        sock.sendall(b"echo\n")
        socks.append(sock)
    ok = 0
    for i, sock in enumerate(socks):
        payload = f"tunnel {i}\n".encode()
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        ok += data == payload
        sock.close()
    return ok, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bytes", default="1G", help="bytes per transfer (default 1G)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrent", type=int, default=200)
    parser.add_argument("--source", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--proxy", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.source is not None:
        serve_source(args.source)
        return 0
    if args.proxy is not None:
        serve_proxy(args.proxy)
        return 0
    size = _parse_size(args.bytes)
    source, source_port = _start("source")
    proxy, proxy_port = _start("proxy")
    try:
        direct, proxied = [], []
        for _ in range(args.rounds):
            direct.append(transfer(source_port, None, size))
            proxied.append(transfer(source_port, proxy_port, size))
        d, p = statistics.median(direct), statistics.median(proxied)
        mib = size / (1 << 20)
        rounds = args.rounds
        print(f"direct   {mib / d:9.0f} MiB/s  ({mib:.0f} MiB in {d:.2f} s, median of {rounds})")
        print(f"proxied  {mib / p:9.0f} MiB/s  ({mib:.0f} MiB in {p:.2f} s, through CONNECT)")
        ratio = d / p
        print(f"ratio    {ratio:9.2f}  (proxied / direct throughput; target >= 0.80)")
        ok, seconds = concurrent_tunnels(source_port, proxy_port, args.concurrent)
        print(f"concurrent {ok}/{args.concurrent} tunnels echoed correctly in {seconds:.2f} s")
        return 0 if ratio >= 0.8 and ok == args.concurrent else 1
    finally:
        for proc in (source, proxy):
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())
