"""Helpers for end-to-end tests of ``execgate mcp``: a real server started as a subprocess and
driven by the MCP SDK's client over stdio, in homes of its own."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.client.client import Client
from mcp.client.session import ClientRequestContext
from mcp.client.stdio import StdioServerParameters, stdio_client

EXECGATE = [sys.executable, "-m", "execgate"]
#: Confine to the workdir only (pytest's tmp dirs live under /tmp, writable by default).
WS = ["--sandbox", "workspace-write", "--exclude-tmp", "--exclude-tmpdir"]

Elicit = Callable[[ClientRequestContext, types.ElicitRequestParams], Any]


@dataclass
class Elicitations:
    """An elicitation callback that answers from a script and records what it was asked."""

    answers: list[types.ElicitResult | Callable[[], Any]] = field(default_factory=list)
    asked: list[types.ElicitRequestFormParams] = field(default_factory=list)
    default: types.ElicitResult | None = None

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams), params
        self.asked.append(params)
        answer = self.answers.pop(0) if self.answers else self.default
        if answer is None:
            raise AssertionError(f"unexpected elicitation: {params.message}")
        if callable(answer):
            answer = await answer()
        assert isinstance(answer, types.ElicitResult)
        return answer


def accept(decision: str | None = "once", reason: str | None = None) -> types.ElicitResult:
    content: dict[str, Any] = {}
    if decision is not None:
        content["decision"] = decision
    if reason is not None:
        content["reason"] = reason
    return types.ElicitResult(action="accept", content=content)


@dataclass
class Mcp:
    """One test's world: isolated homes, a workdir, a rules file, tagged programs."""

    root: Path
    work: Path
    outside: Path  # a directory the sandbox does not let the shell write
    env: dict[str, str]
    rules: Path
    bin: Path
    tag: str  # unique per test: every long-running test program carries it in its name
    logs: list[Path] = field(default_factory=list)

    def write_rules(self, text: str, path: Path | None = None) -> Path:
        path = path or self.rules
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path

    @property
    def sleeper(self) -> str:
        """A copy of sleep named with the tag (rules can allow it: it then escalates)."""
        return f"{self.tag}-sleep"

    @property
    def napper(self) -> str:
        """A copy of sleep named with the tag, matched by no rule (runs in the sandbox)."""
        return f"{self.tag}-nap"

    def server_args(self, *options: str, rules: bool = True) -> list[str]:
        return ["-m", "execgate", "mcp", *(["--rules", str(self.rules)] if rules else []), *options]

    @contextlib.asynccontextmanager
    async def client(
        self,
        *options: str,
        mode: str = "legacy",
        elicit: Elicit | None = None,
        rules: bool = True,
        **kwargs: Any,
    ) -> AsyncIterator[Client]:
        """``execgate mcp [--rules RULES] OPTIONS`` driven by the SDK's client; its stderr goes to
        :meth:`log`."""
        params = StdioServerParameters(
            command=sys.executable,
            args=self.server_args(*options, rules=rules),
            env=self.env,
            cwd=self.work,
        )
        log_path = self.root / f"server-{len(self.logs)}.log"
        self.logs.append(log_path)
        with log_path.open("w") as errlog:
            transport = stdio_client(params, errlog=errlog)
            async with Client(
                transport, mode=mode, elicitation_callback=elicit, **kwargs
            ) as client:
                yield client

    def log(self) -> str:
        return "\n".join(p.read_text() for p in self.logs if p.exists())

    def leftovers(self) -> list[str]:
        """Processes whose command line carries this test's tag."""
        found = subprocess.run(["pgrep", "-af", self.tag], capture_output=True, text=True)
        return [line for line in found.stdout.splitlines() if "pgrep" not in line]

    def wait_for(
        self, condition: Callable[[], Any], what: str, timeout: float = 30.0
    ) -> Any:  # a failure guard, not a synchronisation delay
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def approvals(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*EXECGATE, "approvals", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=check,
        )

    def control_dir(self) -> Path:
        """Where this test's servers keep their control sockets (``paths.control_dir``)."""
        code = "from execgate.paths import control_dir; print(control_dir())"
        found = subprocess.run(
            [sys.executable, "-c", code], env=self.env, capture_output=True, text=True, check=True
        )
        return Path(found.stdout.strip())

    def pending(self) -> list[dict[str, Any]]:
        listing = json.loads(self.approvals("list", "--json", check=True).stdout)
        return [q for server in listing["servers"] for q in server["pending"]]


def make_world(tmp_path: Path) -> Mcp:
    root = tmp_path
    work = root / "work"
    outside = root / "outside"
    for d in (work, outside):
        d.mkdir()
    homes = {
        "HOME": root / "home",
        "EXECGATE_HOME": root / "execgate-home",
        "EXECGATE_SYSTEM_DIR": root / "etc-execgate",
        "CODEX_HOME": root / "codex-home",
        "EXECGATE_CODEX_SYSTEM_DIR": root / "etc-codex",
    }
    for path in homes.values():
        path.mkdir()
    bin_dir = root / "bin"
    bin_dir.mkdir()
    tag = f"egtag{uuid.uuid4().hex[:12]}"
    sleep = shutil.which("sleep")
    true = shutil.which("true")
    assert sleep and true
    for name in (f"{tag}-sleep", f"{tag}-nap"):
        shutil.copy(sleep, bin_dir / name)
    for name in ("askme", "marker", "other"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} ran:$*"\n')
        (bin_dir / name).chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "LANG": "C.UTF-8",
        **{k: str(v) for k, v in homes.items()},
    }
    m = Mcp(root=root, work=work, outside=outside, env=env, rules=root / "test.rules", bin=bin_dir,
            tag=tag)  # fmt: skip
    m.write_rules(
        """\
        prefix_rule(["marker"], "forbidden", justification="marker must not run")
        prefix_rule(["askme"], "prompt", justification="askme needs a human")
        """
    )
    return m


def clean_up(m: Mcp) -> None:
    for line in m.leftovers():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(line.split()[0]), 9)
    remove_control_dir(m.env, m.root)


def remove_control_dir(env: dict[str, str], root: Path) -> None:
    """Remove the test's control folder when it lies outside ``root`` (a long ``root`` puts it
    in /tmp) and servers left it empty."""
    from unittest import mock

    from execgate.paths import control_dir

    with mock.patch.dict(os.environ, env, clear=True):
        folder = control_dir()
    if root not in folder.parents:
        with contextlib.suppress(OSError):
            folder.rmdir()


def payload(result: types.CallToolResult) -> dict[str, Any]:
    """The Codex JSON of a successful ``shell`` result (and a check that both forms agree)."""
    assert not result.is_error, result.content
    text = result.content[0]
    assert isinstance(text, types.TextContent)
    data: dict[str, Any] = json.loads(text.text)
    assert list(data) == ["exit_code", "output", "duration", "timed_out"]
    structured = result.structured_content
    assert isinstance(structured, dict)
    assert {k: v for k, v in structured.items() if k != "truncated_bytes"} == data
    return data


def error_text(result: types.CallToolResult) -> str:
    assert result.is_error, result
    text = result.content[0]
    assert isinstance(text, types.TextContent)
    return text.text


def shell_args(m: Mcp, command: str, **extra: Any) -> dict[str, Any]:
    """Arguments for ``shell`` in the test's workdir. Non-login by default: a login shell's
    /etc/profile resets PATH, and the tests' programs live in a PATH directory of their own."""
    return {"command": command, "workdir": str(m.work), "login": False, **extra}


def run_python(args: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EXECGATE, *args], capture_output=True, text=True, **kwargs)


class PipeLines:
    """The lines of a child's output pipe, each read within a hang guard.

    ``select`` on a buffered reader sees the pipe, not what ``readline`` already read ahead:
    two answers that arrive in one chunk leave the second in the reader's buffer, and a
    ``select`` for it waits for ever. So lines are split here, from raw reads."""

    def __init__(self, stream: Any) -> None:
        self._fd: int = stream.fileno()
        self._buffer = b""

    def next(self, timeout: float = 120) -> bytes:
        """The next line with its newline; b"" at end of file (or what was left before it)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = max(0.0, deadline - time.monotonic())
            assert select.select([self._fd], [], [], left)[0], "no answer"  # a hang guard only
            chunk = os.read(self._fd, 1 << 16)
            if not chunk:
                line, self._buffer = self._buffer, b""
                return line
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line + b"\n"

    def message(self, timeout: float = 120) -> dict[str, Any]:
        """The next line as a JSON-RPC message (the pipe must not end first)."""
        line = self.next(timeout)
        assert line, "the server closed its output"
        message: dict[str, Any] = json.loads(line)
        return message


class RawServer:
    """``execgate mcp OPTIONS`` (default ``--sandbox off``) run as the unprivileged user in
    ``folder`` (with an empty rules file there), driven over raw stdio JSON-RPC: for tests that
    need no SDK client."""

    def __init__(self, unprivileged: Any, folder: Path, *options: str) -> None:
        rules = folder / "empty.rules"
        rules.write_text("")
        unprivileged.chown_tree(folder)
        argv = [*EXECGATE, "mcp", *(options or ("--sandbox", "off")), "--rules", str(rules)]
        self._server = subprocess.Popen(
            unprivileged.argv(argv),
            env=unprivileged.env(),
            cwd=folder,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._ids = 1
        self._lines = PipeLines(self._server.stdout)

    def __enter__(self) -> RawServer:
        self.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}})  # fmt: skip
        assert self.receive()["id"] == 1
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server.stdin is not None and self._server.stdout is not None
        self._server.stdin.close()
        self._server.stdout.close()
        assert self._server.wait(timeout=60) == 0

    def send(self, message: dict[str, Any]) -> None:
        assert self._server.stdin is not None
        self._server.stdin.write(json.dumps(message).encode() + b"\n")
        self._server.stdin.flush()

    def receive(self) -> dict[str, Any]:
        return self._lines.message()

    def shell(self, **arguments: Any) -> dict[str, Any]:
        """One ``shell`` call's whole JSON-RPC answer."""
        self._ids += 1
        self.send({"jsonrpc": "2.0", "id": self._ids, "method": "tools/call",
                   "params": {"name": "shell", "arguments": arguments}})  # fmt: skip
        return self.receive()
