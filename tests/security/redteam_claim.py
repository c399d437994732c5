"""Malformed and sly standing claims (docs/protocol.md §4 "Standing claims"), sent from inside a
gated session by the tests in test_redteam_fastpaths.py: ``python redteam_claim.py MODE…``.

Each MODE claims exactly the exec named by ``RT_PATH`` and ``RT_ARGV`` (JSON) the way the
launcher would take it, but for one twist, and prints ``MODE ANSWER`` (``miss``, ``go …``,
``closed``):

* ``exact``: no twist (the control: it must be taken).
* ``orphan``: a child connects and exits; the parent, sharing the socket, sends the claim (the
  claimer the launcher sees is gone, its pid may be reused).
* ``opath``/``memfd``: the program's descriptor is an ``O_PATH`` one of the judged file / a memfd
  holding its bytes, not the stand-in.
* ``truncated``: the frame ends in the middle of argv.
* ``argc``: argc says 2^40 entries.
* ``nfds``: the frame lists one descriptor more than it carries.
* ``nofds``: no descriptor at all.
* ``header``: a header announcing 4 GiB and nothing after it.
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
import sys


def _frame(fields: list[bytes]) -> bytes:
    payload = b"".join(f + b"\0" for f in fields)
    return struct.pack("<I", len(payload)) + payload


def _answer(sock: socket.socket) -> str:
    sock.settimeout(20)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if len(data) >= 4:
                (size,) = struct.unpack("<I", data[:4])
                if len(data) >= 4 + size:
                    fields = data[4 : 4 + size].rstrip(b"\0").split(b"\0")
                    if fields[1:2] != [b"go"]:
                        return fields[1].decode() if len(fields) > 1 else "empty"
                    rest = data[4 + size :]
                    while True:  # the program's end
                        more = sock.recv(65536)
                        if not more:
                            break
                        rest += more
                    return "go " + rest[4:].rstrip(b"\0").replace(b"\0", b" ").decode()
    except (TimeoutError, ConnectionError):
        return "timeout"
    return "closed"


def _fields(token: bytes, path: str, argv: list[str]) -> list[bytes]:
    env = [f"{k}={v}".encode() for k, v in os.environ.items()]
    fields = [b"EG1", b"standing", token, path.encode(), str(len(argv)).encode()]
    return [*fields, *map(os.fsencode, argv), b"3", b"0", b"1", b"2", str(len(env)).encode(), *env]


def claim(mode: str, token: bytes, path: str, argv: list[str]) -> str:
    claim_path = os.path.join(os.path.dirname(os.environ["EXECGATE_SOCKET"]), "claim.sock")
    fields = _fields(token, path, argv)
    program = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # the stand-in, inside the sandbox
    if mode == "opath":
        os.close(program)
        program = os.open(os.path.realpath(path), os.O_PATH | os.O_CLOEXEC)
    elif mode == "memfd":
        with open(path, "rb") as f:
            data = f.read()
        os.close(program)
        program = os.memfd_create("copy")
        os.write(program, data)
    rights = [0, 1, 2, program]
    payload = _frame(fields)
    if mode == "truncated":
        payload = _frame(fields[:6])
    elif mode == "argc":
        payload = _frame([*fields[:4], str(1 << 40).encode(), *fields[5:]])
    elif mode == "nfds":
        rights = [0, 1, program]
    elif mode == "nofds":
        rights = []
    elif mode == "header":
        payload = struct.pack("<I", 0xFFFFFFF0)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if mode == "orphan":
        child = os.fork()
        if child == 0:
            sock.connect(claim_path)
            os._exit(0)
        os.waitpid(child, 0)
    else:
        sock.connect(claim_path)
    try:
        if rights:
            msg = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", rights))]
            sock.sendmsg([payload], msg)
        else:
            sock.sendall(payload)
        if mode == "header":
            sock.shutdown(socket.SHUT_WR)
    except OSError as exc:
        return f"refused {exc.errno}"
    finally:
        os.close(program)
    return _answer(sock)


def main() -> None:
    token = os.environ["EXECGATE_TOKEN"].encode()
    path, argv = os.environ["RT_PATH"], json.loads(os.environ["RT_ARGV"])
    for mode in sys.argv[1:]:
        print(mode, claim(mode, token, path, argv), flush=True)


if __name__ == "__main__":
    main()
