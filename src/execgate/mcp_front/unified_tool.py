"""The unified exec tools ``exec_command`` and ``write_stdin``: schemas, arguments, results.

Argument names and defaults are the reference's (Codex's unified exec; see docs/mcp.md):
``exec_command`` starts a long-lived process (on a PTY when ``tty``) and returns what it wrote
within ``yield_time_ms``, with its exit code or a ``session_id`` to continue with
``write_stdin`` (which writes ``chars``, empty to only poll, and returns the next output).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from execgate.mcp_front.tool import ToolArgumentError, call_result, json_type

EXEC_TOOL: Final = "exec_command"
WRITE_TOOL: Final = "write_stdin"

DEFAULT_YIELD_MS: Final = 10_000
MIN_YIELD_MS: Final = 250
MAX_YIELD_MS: Final = 30_000
#: write_stdin: a write waits briefly for the echo; an empty poll waits longer.
DEFAULT_WRITE_YIELD_MS: Final = 250
MIN_POLL_YIELD_MS: Final = 5_000
MAX_POLL_YIELD_MS: Final = 300_000
DEFAULT_MAX_OUTPUT_TOKENS: Final = 10_000
#: The reference's estimate: a token is about four bytes of output.
BYTES_PER_TOKEN: Final = 4
DEFAULT_SHELL: Final = "/bin/bash"

_COMMON_OUTPUT = {
    "yield_time_ms": {
        "type": "number",
        "description": "How long to wait (in milliseconds) for output before yielding.",
    },
    "max_output_tokens": {
        "type": "number",
        "description": "Maximum number of tokens to return. Excess output will be truncated.",
    },
}

EXEC_INPUT_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "cmd": {"type": "string", "description": "Shell command to execute."},
        "workdir": {
            "type": "string",
            "description": "Optional working directory to run the command in; defaults to the "
            "server's working directory.",
        },
        "shell": {
            "type": "string",
            "description": f"Shell binary to launch. Defaults to {DEFAULT_SHELL}.",
        },
        "login": {
            "type": "boolean",
            "description": "Whether to run the shell with -l/-i semantics. Defaults to true.",
        },
        "tty": {
            "type": "boolean",
            "description": "Whether to allocate a TTY for the command. Defaults to false (plain "
            "pipes); set to true to open a PTY and access TTY process.",
        },
        **_COMMON_OUTPUT,
    },
    "required": ["cmd"],
    "additionalProperties": False,
}

WRITE_INPUT_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "session_id": {
            "type": "number",
            "description": "Identifier of the running unified exec session.",
        },
        "chars": {
            "type": "string",
            "description": "Bytes to write to stdin (may be empty to poll).",
        },
        **_COMMON_OUTPUT,
    },
    "required": ["session_id"],
    "additionalProperties": False,
}

RESULT_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "output": {"type": "string", "description": "Output written since the last result."},
        "wall_time_seconds": {"type": "number", "minimum": 0},
        "exit_code": {"type": "integer", "description": "Set once the process has exited."},
        "session_id": {
            "type": "integer",
            "description": "Set while the process runs: pass it to write_stdin.",
        },
        "original_token_count": {"type": "integer", "minimum": 0},
        "truncated_bytes": {"type": "integer", "minimum": 0},
    },
    "required": ["output", "wall_time_seconds", "original_token_count"],
}


def tool_definitions(extra_properties: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    schema = EXEC_INPUT_SCHEMA
    if extra_properties:
        schema = {**schema, "properties": {**schema["properties"], **extra_properties}}
    return [
        {
            "name": EXEC_TOOL,
            "description": "Runs a command in a PTY or with pipes, returning output or a "
            "session ID for ongoing interaction.",
            "inputSchema": schema,
            "outputSchema": RESULT_SCHEMA,
        },
        {
            "name": WRITE_TOOL,
            "description": "Writes characters to an existing unified exec session and returns "
            "recent output.",
            "inputSchema": WRITE_INPUT_SCHEMA,
            "outputSchema": RESULT_SCHEMA,
        },
    ]


# -- arguments ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExecArgs:
    cmd: str
    workdir: str
    tty: bool
    yield_ms: int
    max_output_tokens: int
    shell: str
    login: bool

    @property
    def argv(self) -> list[str]:
        return [self.shell, "-lc" if self.login else "-c", self.cmd]


@dataclass(frozen=True, slots=True)
class WriteArgs:
    session_id: int
    chars: str
    yield_ms: int
    max_output_tokens: int


def _number(arguments: Mapping[str, Any], key: str) -> float | None:
    value = arguments.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ToolArgumentError(f"`{key}` must be a number, got {json_type(value)}")
    return float(value)


def _clamped(value: float | None, default: int, low: int, high: int) -> int:
    return int(min(high, max(low, default if value is None else value)))


def _tokens(arguments: Mapping[str, Any]) -> int:
    value = _number(arguments, "max_output_tokens")
    if value is None:
        return DEFAULT_MAX_OUTPUT_TOKENS
    if value < 1:
        raise ToolArgumentError(f"`max_output_tokens` must be at least 1, got {value:g}")
    return int(value)


def _flag(arguments: Mapping[str, Any], key: str, default: bool) -> bool:
    value = arguments.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ToolArgumentError(f"`{key}` must be true or false, got {json_type(value)}")
    return value


def parse_exec_arguments(
    arguments: Mapping[str, Any] | None, *, default_workdir: str, default_shell: str
) -> ExecArgs:
    """Check ``exec_command``'s arguments; :class:`ToolArgumentError` says what is wrong."""
    arguments = arguments or {}
    cmd = arguments.get("cmd")
    if not isinstance(cmd, str) or not cmd.strip():
        raise ToolArgumentError(
            "`cmd` is required: the shell command line to run"
            if cmd is None or isinstance(cmd, str)
            else f"`cmd` must be a string, got {json_type(cmd)}"
        )
    workdir = arguments.get("workdir")
    if workdir is None or workdir == "":
        workdir = default_workdir
    elif not isinstance(workdir, str):
        raise ToolArgumentError(f"`workdir` must be a string, got {json_type(workdir)}")
    workdir = os.path.join(default_workdir, workdir)  # relative to the server's directory
    if not os.path.isdir(workdir):
        raise ToolArgumentError(f"`workdir` {workdir} is not a directory")
    shell = arguments.get("shell")
    if shell is None or shell == "":
        shell = default_shell
    elif not isinstance(shell, str):
        raise ToolArgumentError(f"`shell` must be a string, got {json_type(shell)}")
    return ExecArgs(
        cmd=cmd,
        workdir=os.path.normpath(workdir),
        tty=_flag(arguments, "tty", False),
        yield_ms=_clamped(
            _number(arguments, "yield_time_ms"), DEFAULT_YIELD_MS, MIN_YIELD_MS, MAX_YIELD_MS
        ),
        max_output_tokens=_tokens(arguments),
        shell=shell,
        login=_flag(arguments, "login", True),
    )


def parse_write_arguments(arguments: Mapping[str, Any] | None) -> WriteArgs:
    """Check ``write_stdin``'s arguments; :class:`ToolArgumentError` says what is wrong."""
    arguments = arguments or {}
    session_id = _number(arguments, "session_id")
    if session_id is None or not session_id.is_integer():
        raise ToolArgumentError(
            "`session_id` is required: the number an exec_command result gave"
            if session_id is None
            else f"`session_id` must be a whole number, got {session_id:g}"
        )
    chars = arguments.get("chars", "")
    if chars is None:
        chars = ""
    if not isinstance(chars, str):
        raise ToolArgumentError(f"`chars` must be a string, got {json_type(chars)}")
    value = _number(arguments, "yield_time_ms")
    if chars:
        yield_ms = _clamped(value, DEFAULT_WRITE_YIELD_MS, MIN_YIELD_MS, MAX_YIELD_MS)
    else:
        yield_ms = _clamped(value, MIN_POLL_YIELD_MS, MIN_POLL_YIELD_MS, MAX_POLL_YIELD_MS)
    return WriteArgs(
        session_id=int(session_id),
        chars=chars,
        yield_ms=yield_ms,
        max_output_tokens=_tokens(arguments),
    )


# -- results --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExecOutput:
    """What one exec_command / write_stdin call returns."""

    output: str
    wall_time: float
    exit_code: int | None  # None: still running
    session_id: int | None  # set while running
    original_tokens: int
    truncated_bytes: int = 0


def limit_tokens(text: str, max_tokens: int) -> tuple[str, int]:
    """``text`` cut to about ``max_tokens`` tokens (head and tail kept, a marker between);
    also returns how many bytes were cut."""
    data = text.encode("utf-8", "replace")
    limit = max_tokens * BYTES_PER_TOKEN
    if len(data) <= limit:
        return text, 0
    head = data[: limit // 2].decode("utf-8", "ignore")
    tail = data[len(data) - (limit - limit // 2) :].decode("utf-8", "ignore")
    cut = len(data) - len(head.encode()) - len(tail.encode())
    marker = f"\n[... execgate: {cut} bytes cut here (max_output_tokens {max_tokens}) ...]\n"
    return head + marker + tail, cut


def exec_result(result: ExecOutput) -> dict[str, Any]:
    lines = [f"Wall time: {result.wall_time:.4f} seconds"]
    if result.exit_code is not None:
        lines.append(f"Process exited with code {result.exit_code}")
    if result.session_id is not None:
        lines.append(f"Process running with session ID {result.session_id}")
    lines += [f"Original token count: {result.original_tokens}", "Output:", result.output]
    structured: dict[str, Any] = {
        "output": result.output,
        "wall_time_seconds": round(result.wall_time, 4),
        "original_token_count": result.original_tokens,
        "truncated_bytes": result.truncated_bytes,
    }
    if result.exit_code is not None:
        structured["exit_code"] = result.exit_code
    if result.session_id is not None:
        structured["session_id"] = result.session_id
    return call_result("\n".join(lines), structured)
