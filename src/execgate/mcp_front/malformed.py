"""Malformed JSON-RPC from the client gets the standard error answer, not silence.

The SDK's stdio transport hands a line it cannot validate to the server as an exception, and
the server drops it: a client that sent invalid JSON, a batch (``[]``) or a request whose
``params`` is not an object would wait forever. :class:`AnsweringMalformed` sits between the
transport and the server and answers those (JSON-RPC 2.0 §5.1): -32700 for invalid JSON,
-32600 for something that is not a request, -32602 for a request whose ``params`` is not an
object. A notification (no ``id``) is never answered.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any, Self

import mcp_types as types
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from execgate.visible import visible

log = logging.getLogger(__name__)


def error_for(exc: Exception) -> types.JSONRPCError | None:
    """The error answer to a line the transport could not validate (None: answer nothing)."""
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    if not errors or any(e["type"] == "json_invalid" for e in errors):
        return _error(None, types.PARSE_ERROR, "Parse error: the message is not valid JSON")
    # The message itself is the input of the errors about it as a whole (each error's loc
    # starts with the name of the message type it was tried as): "not an object", or a
    # missing field.
    top: Any = next((e["input"] for e in errors if _about_the_message(e["type"], e["loc"])), None)
    if not isinstance(top, dict):
        return _error(None, types.INVALID_REQUEST, "Invalid Request: not a JSON-RPC object")
    raw_id = top.get("id")
    request_id = raw_id if isinstance(raw_id, (int, str)) and not isinstance(raw_id, bool) else None
    method = top.get("method")
    if isinstance(method, str) and "id" in top and request_id is not None:
        if "params" in top and not isinstance(top["params"], dict):
            return _error(request_id, types.INVALID_PARAMS, "Invalid params: must be an object")
    elif isinstance(method, str) and "id" not in top:
        return None  # a notification
    return _error(request_id, types.INVALID_REQUEST, "Invalid Request")


def _about_the_message(kind: str, loc: tuple[int | str, ...]) -> bool:
    return len(loc) <= 1 or (kind == "missing" and len(loc) == 2)


def _error(request_id: int | str | None, code: int, message: str) -> types.JSONRPCError:
    return types.JSONRPCError(
        jsonrpc="2.0", id=request_id, error=types.ErrorData(code=code, message=message)
    )


class AnsweringMalformed:
    """A read stream that answers what the transport could not read and passes the rest."""

    def __init__(
        self,
        inner: ReadStream[SessionMessage | Exception],
        replies: WriteStream[SessionMessage],
    ) -> None:
        self._inner = inner
        self._replies = replies

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        while True:
            item = await self._inner.receive()
            if not isinstance(item, Exception):
                return item
            await self._answer(item)

    async def _answer(self, exc: Exception) -> None:
        error = error_for(exc)
        log.warning(
            "malformed message from the client%s: %s",
            f" (answered {error.error.code})" if error else "",
            visible(str(exc).split("\n", 1)[0], 200),
        )
        if error is not None:
            await self._replies.send(SessionMessage(error))

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        while True:
            item = await self._inner.__anext__()
            if not isinstance(item, Exception):
                return item
            await self._answer(item)

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        return await self._inner.__aexit__(exc_type, exc_val, exc_tb)
