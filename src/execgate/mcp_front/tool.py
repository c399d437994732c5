"""The ``shell`` tool: its schema (Codex's, verbatim), its arguments, and its result.

The input schema is the one ``codex-exec-mcp-server`` publishes, property names and descriptions
unchanged, so an agent prompted for Codex's tool calls ours the same way. ``timeout_ms`` and
``login`` use the JSON Schema spelling of "optional, may be null" (``["integer", "null"]``, as
newer Codex versions do) instead of 0.97's OpenAPI-style ``nullable``.

The result is Codex's: one text item holding ``{"exit_code", "output", "duration": {"secs",
"nanos"}, "timed_out"}`` (that key order, compact JSON), and the same object, plus
``truncated_bytes``, as ``structuredContent`` described by :data:`OUTPUT_SCHEMA`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

TOOL_NAME: Final = "shell"
TOOL_DESCRIPTION: Final = (
    "Runs a shell command and returns its output. You MUST provide the workdir as an absolute path."
)
DEFAULT_TIMEOUT_MS: Final = 10_000
#: Output kept per call: the first and the last half of this, with a marker line between.
OUTPUT_CAP: Final = 1 << 20
#: ``exit_code`` of a command stopped by its timeout (as GNU ``timeout`` and Codex report it).
TIMEOUT_EXIT_CODE: Final = 124


def exit_code_of(status: int) -> int:
    """A wait(2) status as a shell reports it: the exit code, or 128 + the killing signal."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


INPUT_SCHEMA: Final[dict[str, Any]] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "ExecParams",
    "type": "object",
    "properties": {
        "command": {"description": "The bash string to execute.", "type": "string"},
        "workdir": {
            "description": "The working directory to execute the command in. Must be an "
            "absolute path.",
            "type": "string",
        },
        "timeout_ms": {
            "description": "The timeout for the command in milliseconds.",
            "type": ["integer", "null"],
            "format": "uint64",
            "minimum": 0,
        },
        "login": {
            "description": "Launch Bash with -lc instead of -c: defaults to true.",
            "type": ["boolean", "null"],
        },
    },
    "required": ["command", "workdir"],
}

OUTPUT_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "exit_code": {
            "type": "integer",
            "description": "The shell's exit status (128+N when killed by signal N, "
            f"{TIMEOUT_EXIT_CODE} when stopped by the timeout).",
        },
        "output": {
            "type": "string",
            "description": "stdout and stderr, interleaved in the order they were written.",
        },
        "duration": {
            "type": "object",
            "properties": {
                "secs": {"type": "integer", "minimum": 0},
                "nanos": {"type": "integer", "minimum": 0},
            },
            "required": ["secs", "nanos"],
        },
        "timed_out": {"type": "boolean"},
        "truncated_bytes": {
            "type": "integer",
            "minimum": 0,
            "description": "Bytes of output cut from the middle (the output is capped at 1 MiB).",
        },
    },
    "required": ["exit_code", "output", "duration", "timed_out"],
}


def tool_definition(extra_properties: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The tool as ``tools/list`` lists it."""
    schema = INPUT_SCHEMA
    if extra_properties:
        schema = {**schema, "properties": {**schema["properties"], **extra_properties}}
    return {
        "name": TOOL_NAME,
        "description": TOOL_DESCRIPTION,
        "inputSchema": schema,
        "outputSchema": OUTPUT_SCHEMA,
    }


# -- arguments ------------------------------------------------------------------------------


# Linux's MAX_ARG_STRLEN (32 pages), NUL included: the most one argument of an exec can hold.
MAX_COMMAND_BYTES = 32 * 4096


class ToolArgumentError(Exception):
    """Arguments the tool cannot run with; the message is shown to the model as is."""


@dataclass(frozen=True, slots=True)
class ShellArgs:
    command: str
    workdir: str
    timeout_ms: int
    login: bool


def parse_arguments(arguments: Mapping[str, Any] | None, *, default_login: bool) -> ShellArgs:
    """Check the ``shell`` arguments; :class:`ToolArgumentError` says what is wrong.

    Unknown extra arguments are ignored, as Codex's deserializer ignores them.
    """
    arguments = arguments or {}
    command = arguments.get("command")
    if not isinstance(command, str):
        raise ToolArgumentError(
            "`command` is required and must be a string (the bash command to run)"
            if command is None
            else f"`command` must be a string, got {json_type(command)}"
        )
    size = len(command.encode("utf-8", "surrogatepass"))
    if size >= MAX_COMMAND_BYTES:
        raise ToolArgumentError(
            f"`command` is too long: {size} bytes (bash gets it as one argument, and an "
            f"argument holds at most {MAX_COMMAND_BYTES - 1} bytes); write a script file and "
            "run that"
        )
    workdir = arguments.get("workdir")
    if workdir is None:
        raise ToolArgumentError(
            "`workdir` is required: the absolute path of the directory to run the command in"
        )
    if not isinstance(workdir, str):
        raise ToolArgumentError(f"`workdir` must be a string, got {json_type(workdir)}")
    if not os.path.isabs(workdir):
        raise ToolArgumentError(
            f"`workdir` must be an absolute path, got {workdir!r} (relative paths are not "
            "resolved: say which directory you mean)"
        )
    if not os.path.exists(workdir):
        raise ToolArgumentError(f"`workdir` {workdir} does not exist")
    if not os.path.isdir(workdir):
        raise ToolArgumentError(f"`workdir` {workdir} is not a directory")
    timeout = arguments.get("timeout_ms")
    if timeout is None:
        timeout_ms = DEFAULT_TIMEOUT_MS
    elif isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ToolArgumentError(
            f"`timeout_ms` must be a whole number of milliseconds, got {json_type(timeout)}"
        )
    elif isinstance(timeout, float) and not (math.isfinite(timeout) and timeout.is_integer()):
        raise ToolArgumentError(
            f"`timeout_ms` must be a whole number of milliseconds, got {timeout}"
        )
    elif timeout < 1:
        raise ToolArgumentError(f"`timeout_ms` must be at least 1 (milliseconds), got {timeout}")
    else:
        timeout_ms = int(timeout)
    login = arguments.get("login")
    if login is None:
        login = default_login
    elif not isinstance(login, bool):
        raise ToolArgumentError(f"`login` must be true or false, got {json_type(login)}")
    return ShellArgs(command=command, workdir=workdir, timeout_ms=timeout_ms, login=login)


def json_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


# -- output -----------------------------------------------------------------------------------


def _utf8_head(data: bytes | bytearray) -> int:
    """How many bytes of ``data`` end on a UTF-8 character boundary (drops a cut sequence)."""
    end = len(data)
    for back in range(1, min(4, end) + 1):
        byte = data[end - back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead
            continue
        if byte & 0x80 == 0:
            return end  # ASCII: complete
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
        return end if back >= need else end - back
    return end


def _utf8_tail(data: bytes | bytearray) -> int:
    """How many leading bytes of ``data`` are the rest of a character cut off before it."""
    skip = 0
    while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
        skip += 1
    return skip


class OutputCapture:
    """Keeps the first and last ``cap // 2`` bytes of a stream and counts what falls between."""

    def __init__(self, cap: int = OUTPUT_CAP) -> None:
        self.cap = cap
        self.head_size = cap // 2
        self.tail_size = cap - self.head_size
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_size - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            if len(self._tail) > 2 * self.tail_size:
                del self._tail[: len(self._tail) - self.tail_size]

    def _parts(self) -> tuple[bytes, bytes, int]:
        if len(self._tail) > self.tail_size:
            del self._tail[: len(self._tail) - self.tail_size]
        head, tail = bytes(self._head), bytes(self._tail)
        cut = self.total - len(head) - len(tail)
        if cut == 0:
            return head + tail, b"", 0
        head = head[: _utf8_head(head)]
        tail = tail[_utf8_tail(tail) :]
        return head, tail, self.total - len(head) - len(tail)

    @property
    def truncated_bytes(self) -> int:
        return self._parts()[2]

    def text(self) -> str:
        """The kept output as text (invalid UTF-8 becomes U+FFFD), with a marker line where
        bytes were cut."""
        head, tail, cut = self._parts()
        if not cut:
            return head.decode("utf-8", "replace")
        marker = (
            f"\n[... execgate: {cut} bytes of output cut here; the output is capped at "
            f"{self.cap} bytes, the first and last {self.head_size} are kept ...]\n"
        )
        return head.decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace")


# -- results ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShellOutcome:
    exit_code: int
    output: str
    duration: float  # seconds, wall clock (time spent waiting for a human included)
    timed_out: bool
    truncated_bytes: int = 0


def codex_payload(outcome: ShellOutcome) -> dict[str, Any]:
    """Codex's result object, in Codex's key order."""
    secs = max(0, int(outcome.duration))
    nanos = max(0, min(999_999_999, round((outcome.duration - secs) * 1e9)))
    return {
        "exit_code": outcome.exit_code,
        "output": outcome.output,
        "duration": {"secs": secs, "nanos": nanos},
        "timed_out": outcome.timed_out,
    }


def call_result(text: str, structured: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``tools/call`` result: one text item, and the same as structured content."""
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": False}
    if structured is not None:
        result["structuredContent"] = structured
    return result


def tool_result(outcome: ShellOutcome) -> dict[str, Any]:
    payload = codex_payload(outcome)
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return call_result(text, {**payload, "truncated_bytes": outcome.truncated_bytes})


def error_result(message: str) -> dict[str, Any]:
    """A tool error the model can read and correct (``isError: true``)."""
    return {"content": [{"type": "text", "text": message}], "isError": True}
