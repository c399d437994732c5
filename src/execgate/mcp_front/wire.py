"""JSON-RPC 2.0 messages as MCP's stdio transport carries them: one JSON object per line.

:func:`read_message` sorts a line into a :class:`Request`, a :class:`Notification`, a
:class:`Response` (to one of our requests) or a :class:`Malformed` line with the standard error
answer (JSON-RPC 2.0 §5.1): -32700 for invalid JSON, -32600 for something that is not a
message, -32602 for a request whose ``params`` is not an object. A notification is never
answered, even a malformed one. :func:`encode` writes a message line.

Pure and small on purpose: ``execgate mcp`` answers ``initialize`` with this module before
anything else is imported (see :mod:`execgate.mcp_front.opening`).
"""

from __future__ import annotations

import json
from typing import Any, Final, NamedTuple

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
#: The connection closed before the request was answered (MCP's, as its SDKs send it).
CONNECTION_CLOSED: Final = -32000
#: MCP: a 2026-07-28 request names a protocol version this server does not serve.
UNSUPPORTED_PROTOCOL_VERSION: Final = -32022

RequestId = int | str


class RpcError(Exception):
    """A JSON-RPC error answer: raised by a request's handler, or received for one of ours."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def error(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class Request(NamedTuple):
    id: RequestId
    method: str
    params: dict[str, Any] | None


class Notification(NamedTuple):
    method: str
    params: dict[str, Any] | None


class Response(NamedTuple):
    """The answer to one of our requests: ``result``, or ``error`` (an :class:`RpcError`)."""

    id: RequestId
    result: dict[str, Any] | None
    error: RpcError | None


class Malformed(NamedTuple):
    """A line that is no message; ``answer`` is the error to send (None: send nothing)."""

    answer: dict[str, Any] | None
    why: str


Message = Request | Notification | Response | Malformed


def _request_id(value: object) -> RequestId | None:
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    return value


def error_message(
    request_id: RequestId | None, code: int, message: str, data: Any = None
) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": RpcError(code, message, data).error()}


def result_message(request_id: RequestId, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def read_message(line: bytes) -> Message:
    try:
        raw = json.loads(line)
        if b"\\u" in line:
            # An escaped lone surrogate is JSON, but no text: nothing downstream could say it.
            json.dumps(raw, ensure_ascii=False).encode()
    except ValueError:  # UnicodeDecodeError and UnicodeEncodeError included
        answer = error_message(None, PARSE_ERROR, "Parse error: the message is not valid JSON")
        return Malformed(answer, "not valid JSON")
    if not isinstance(raw, dict):
        what = "a batch" if isinstance(raw, list) else "not an object"
        answer = error_message(None, INVALID_REQUEST, "Invalid Request: not a JSON-RPC object")
        return Malformed(answer, what)
    method, params = raw.get("method"), raw.get("params")
    has_id = "id" in raw
    request_id = _request_id(raw.get("id"))
    if raw.get("jsonrpc") == "2.0" and isinstance(method, str):
        if not has_id:
            if params is None or isinstance(params, dict):
                return Notification(method, params)
            return Malformed(None, f"notification {method}: params is not an object")
        if request_id is not None:
            if params is None or isinstance(params, dict):
                return Request(request_id, method, params)
            answer = error_message(request_id, INVALID_PARAMS, "Invalid params: must be an object")
            return Malformed(answer, f"request {method}: params is not an object")
    elif raw.get("jsonrpc") == "2.0" and request_id is not None and "method" not in raw:
        result, error = raw.get("result"), raw.get("error")
        if isinstance(result, dict) and "error" not in raw:
            return Response(request_id, result, None)
        if isinstance(error, dict) and "result" not in raw:
            code, message = error.get("code"), error.get("message")
            if isinstance(code, int) and not isinstance(code, bool) and isinstance(message, str):
                return Response(request_id, None, RpcError(code, message, error.get("data")))
    return Malformed(error_message(request_id, INVALID_REQUEST, "Invalid Request"), "no message")


def encode(message: dict[str, Any]) -> bytes:
    """One line of the wire: compact JSON, UTF-8, newline-terminated."""
    text = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode() + b"\n"
    except UnicodeEncodeError:  # a lone surrogate a client sent us: escaped, still valid JSON
        return json.dumps(message, separators=(",", ":")).encode() + b"\n"
