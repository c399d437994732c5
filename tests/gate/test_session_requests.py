"""The session's gate socket answers only its own processes, and answers them by policy."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

from execgate.config import Config
from execgate.gate import protocol
from execgate.gate.askers import DenyingAsker
from execgate.gate.livepolicy import GatePolicy, PolicySource
from execgate.gate.session import EscalationSession, SessionCaller, SessionConfig


def _ask(path: Path, token: str, program: str, *argv: str) -> list[bytes]:
    request = protocol.ExecRequest(
        token=token.encode(), via="execve", pid=os.getpid(), ppid=os.getppid(), cwd=b"/",
        path=program.encode(), interpreters=(), argv=tuple(a.encode() for a in argv),
    )  # fmt: skip
    fd = os.open(program, os.O_RDONLY | os.O_CLOEXEC)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(path))
        socket.send_fds(s, [protocol.encode_exec_request(request)], [fd])
        os.close(fd)
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    return protocol.split_payload(answer[protocol.HEADER.size :])


def test_answers_by_policy_and_refuses_foreign_tokens(tmp_path: Path) -> None:
    rules = tmp_path / "r.rules"
    rules.write_text('prefix_rule(["false"], "forbidden", justification="no")\n')
    gate = GatePolicy(
        PolicySource((rules,), tmp_path, Config()).load(), search_path="/usr/bin:/bin"
    )

    async def main() -> None:
        session = await EscalationSession.open(
            SessionConfig(live=gate.live, escalation=gate.escalation),
            SessionCaller(DenyingAsker("test")),
        )
        try:
            sock = session.socket_path
            run = await asyncio.to_thread(_ask, sock, session.token, "/usr/bin/true", "true")
            assert run == [b"run"]
            denied = await asyncio.to_thread(_ask, sock, session.token, "/usr/bin/false", "false")
            assert denied[0] == b"deny" and denied[1].startswith(b"execgate: denied: false: no")
            forged = await asyncio.to_thread(_ask, sock, "0" * 32, "/usr/bin/true", "true")
            assert forged == [b"deny", b"execgate: denied: true: request not from this session"]
        finally:
            await session.aclose()

    asyncio.run(main())
