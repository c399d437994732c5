"""Forge standing claims (docs/protocol.md §4 "Standing claims") from inside a gated session.

Run by the tests in the session, as the attacker: ``python standing_claim.py SPEC…``, each
SPEC a JSON object ``{"name", "argv", "path", "program", "token", "cwd", "race"}`` (all but
``name`` and ``argv`` optional: ``path`` defaults to the program, ``program`` to the path,
``token`` to the session's, ``cwd`` to the current one; ``race``: that many claims while a
thread keeps changing the working directory to ``race_cwd`` and back). Prints one line per
claim: ``NAME ANSWER`` (``miss``, or ``go`` followed by the program's exit).
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
import sys
import threading


def frame(fields: list[bytes]) -> bytes:
    payload = b"".join(f + b"\0" for f in fields)
    return struct.pack("<I", len(payload)) + payload


def recv_frame(sock: socket.socket) -> list[bytes] | None:
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            return None
        head += chunk
    (size,) = struct.unpack("<I", head)
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            return None
        body += chunk
    return body.rstrip(b"\0").split(b"\0")


def claim(token: bytes, path: str, argv: list[str], program: int) -> str:
    claim_path = os.path.join(os.path.dirname(os.environ["EXECGATE_SOCKET"]), "claim.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(claim_path)
    env = [f"{k}={v}".encode() for k, v in os.environ.items()]
    fields = [b"EG1", b"standing", token, path.encode(), str(len(argv)).encode()]
    fields += [*map(os.fsencode, argv), b"3", b"0", b"1", b"2", str(len(env)).encode(), *env]
    rights = array.array("i", [0, 1, 2, program])
    sock.sendmsg([frame(fields)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
    first = recv_frame(sock)
    if first is None:
        return "closed"
    if first[1] != b"go":
        return first[1].decode()
    end = recv_frame(sock)
    if end is None:
        return "go closed"
    # The launcher closes an answered connection a little later (launch.c close_lingering),
    # never not at all: end-of-file follows the answer.
    sock.settimeout(30)
    after = sock.recv(1)
    return "go " + b" ".join(end[1:]).decode() + ("" if after == b"" else " +more")


def hop(stop: threading.Event, a: str, b: str) -> None:
    """Keep changing the working directory between a and b (a racing thread)."""
    while not stop.is_set():
        os.chdir(b)
        os.chdir(a)


def main() -> None:
    token = os.environ["EXECGATE_TOKEN"].encode()
    for spec in map(json.loads, sys.argv[1:]):
        path = spec.get("path") or spec["program"]
        fd = os.open(spec.get("program") or path, os.O_RDONLY | os.O_CLOEXEC)
        here = os.getcwd()
        if "cwd" in spec:
            os.chdir(spec["cwd"])
        stop = threading.Event()
        racer = None
        if spec.get("race"):
            args = (stop, os.getcwd(), spec["race_cwd"])
            racer = threading.Thread(target=hop, args=args, daemon=True)
            racer.start()
        for _ in range(spec.get("race") or 1):
            answer = claim(spec.get("token", "").encode() or token, path, spec["argv"], fd)
            print(spec["name"], answer, flush=True)
        stop.set()
        if racer is not None:
            racer.join()
        os.chdir(here)
        os.close(fd)


if __name__ == "__main__":
    main()
