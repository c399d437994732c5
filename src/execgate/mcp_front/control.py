"""The approvals control socket of a running ``execgate mcp`` server.

Each server listens on a Unix socket ``mcp-<pid>.sock`` (mode 0600) and describes itself in
``mcp-<pid>.json``, both in the control folder (``paths.control_dir``: ``$EXECGATE_HOME/control``,
0700, hidden from every sandbox); ``execgate approvals`` finds running servers there and
removes the entries of servers that are gone. Every connection is checked by
``peercheck.why_refused``: other users' processes and every process of a gated session (sandbox
off too) are refused, so nothing a server gates can list or answer its questions.

Protocol: one JSON object per line each way.

=====================================================================  ==========================
request                                                                reply
=====================================================================  ==========================
``{"op": "list"}``                                                     ``{"ok": true, "server":
                                                                       {...}, "pending": [...]}``
``{"op": "answer", "id": ID, "answer": "once|session|always|deny",      ``{"ok": true}`` or
"reason": TEXT?}``                                                     ``{"ok": false, "error":
                                                                       TEXT}``
=====================================================================  ==========================
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from execgate import paths
from execgate.errors import ExecgateError
from execgate.gate.escalation import Answer
from execgate.mcp_front.elicitation import ApprovalError, ApprovalRegistry
from execgate.mcp_front.listening import BoundControl
from execgate.peercheck import why_refused

log = logging.getLogger("execgate.mcp")

_MAX_LINE = 1 << 16
ANSWERS = {a.value: a for a in Answer}


class ControlServer:
    """Serves ``registry`` to ``execgate approvals`` while the MCP server runs."""

    def __init__(
        self,
        registry: ApprovalRegistry,
        info: Callable[[], dict[str, Any]],
        revoke: Callable[[tuple[str, ...]], bool] = lambda _: False,
    ) -> None:
        self.registry = registry
        self._info = info
        self._revoke = revoke  # withdraws a "for this session" grant (execgate approvals revoke)
        self._server: asyncio.AbstractServer | None = None
        self.socket_path: Path | None = None
        self._bound: BoundControl | None = None

    async def start(self, bound: BoundControl) -> None:
        """Serve ``bound`` (connections made since it was bound are waiting in its backlog)
        and describe the server in full."""
        self._bound = bound
        self._server = await asyncio.start_unix_server(
            self._serve, sock=bound.sock, limit=_MAX_LINE
        )
        self.socket_path = bound.path
        bound.describe(self._info())
        bound.announce()
        clean_stale_servers()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
        if self._bound is not None:
            self._bound.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        refused = why_refused(sock) if sock is not None else "no peer credentials"
        try:
            if refused is not None:
                log.warning("control socket: refused a connection: %s", refused)
                await self._reply(writer, {"ok": False, "error": f"permission denied ({refused})"})
                return
            while True:
                try:
                    line = await reader.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    await self._reply(writer, {"ok": False, "error": "request too long"})
                    return
                if not line:
                    return
                await self._reply(writer, self.handle(line))
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    @staticmethod
    async def _reply(writer: asyncio.StreamWriter, reply: dict[str, Any]) -> None:
        writer.write(json.dumps(reply, ensure_ascii=False).encode() + b"\n")
        await writer.drain()

    def handle(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
        except ValueError:
            return {"ok": False, "error": "not JSON"}
        if not isinstance(request, dict):
            return {"ok": False, "error": "a request is a JSON object"}
        op = request.get("op")
        if op == "revoke":
            prefix = request.get("prefix")
            if not isinstance(prefix, list) or not all(isinstance(w, str) for w in prefix):
                return {"ok": False, "error": "revoke needs a prefix (a list of strings)"}
            if not self._revoke(tuple(prefix)):
                return {"ok": False, "error": "no such grant for this session"}
            log.info("session grant withdrawn from the control socket: %s", prefix)
            return {"ok": True}
        if op == "list":
            return {
                "ok": True,
                "server": {"pid": os.getpid(), **self._info()},
                "pending": [q.summary() for q in self.registry.pending()],
            }
        if op == "answer":
            qid, word, reason = request.get("id"), request.get("answer"), request.get("reason")
            answer = ANSWERS.get(word) if isinstance(word, str) else None
            if not isinstance(qid, str) or answer is None:
                return {"ok": False, "error": "answer needs an id and once|session|always|deny"}
            if reason is not None and not isinstance(reason, str):
                return {"ok": False, "error": "reason must be a string"}
            try:
                question = self.registry.answer(
                    qid, answer, (reason or "").strip() or None, by="execgate approvals"
                )
            except ApprovalError as exc:
                return {"ok": False, "error": str(exc)}
            log.info("approval %s answered from the control socket: %s", qid, answer.value)
            return {"ok": True, "id": question.id, "command": question.request.exec.display()}
        return {"ok": False, "error": f"unknown op {op!r}"}


# -- the client side (execgate approvals) ------------------------------------------------------


@dataclass(frozen=True)
class RunningServer:
    pid: int
    socket: Path
    info: dict[str, Any]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _connect(path: Path, timeout: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
    except BaseException:
        sock.close()
        raise
    return sock


def _remove(descriptor: Path, info: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        descriptor.unlink()
    sock = info.get("socket")
    if isinstance(sock, str) and sock:
        path = Path(sock)
        with contextlib.suppress(OSError):
            path.unlink()


def clean_stale_servers() -> None:
    """Remove the descriptors (and sockets) of servers that are gone."""
    running_servers()


def running_servers() -> list[RunningServer]:
    """Every live server of this user (entries of dead ones are removed on the way)."""
    found: list[RunningServer] = []
    folder = paths.control_dir()
    try:
        descriptors = sorted(folder.glob("mcp-*.json"))
    except OSError:
        return []
    for descriptor in descriptors:
        try:
            info = json.loads(descriptor.read_text(encoding="utf-8"))
            pid = int(info["pid"])
            sock = Path(info["socket"])
        except (OSError, ValueError, KeyError, TypeError):
            if time.time() - _mtime(descriptor) > 60:  # not one being written right now
                _remove(descriptor, {})
            continue
        if pid != os.getpid() and not _alive(pid):
            _remove(descriptor, info)
            continue
        try:
            _connect(sock, 2.0).close()
        except (ConnectionRefusedError, FileNotFoundError):
            if pid != os.getpid():
                _remove(descriptor, info)
            continue
        except OSError:
            continue
        found.append(RunningServer(pid=pid, socket=sock, info=info))
    return found


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def request(
    server: RunningServer, message: dict[str, Any], timeout: float = 10.0
) -> dict[str, Any]:
    """Send one request to ``server`` and return its reply."""
    try:
        sock = _connect(server.socket, timeout)
    except OSError as exc:
        raise ExecgateError(
            f"cannot reach the execgate mcp server {server.pid} at {server.socket}: "
            f"{exc.strerror or exc}"
        ) from None
    with sock:
        try:
            sock.sendall(json.dumps(message).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
        except OSError as exc:
            raise ExecgateError(
                f"the execgate mcp server {server.pid} did not answer: {exc.strerror or exc}"
            ) from None
    try:
        reply = json.loads(data)
    except ValueError:
        raise ExecgateError(
            f"the execgate mcp server {server.pid} sent a malformed reply"
        ) from None
    if not isinstance(reply, dict):
        raise ExecgateError(f"the execgate mcp server {server.pid} sent a malformed reply")
    return reply
