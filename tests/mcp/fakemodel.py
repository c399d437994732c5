"""A fake model on loopback for driving the real Codex CLI: a tiny server speaking the OpenAI
Responses API's SSE stream (``response.created``, ``response.output_item.done``,
``response.completed``).

The prompt is a JSON script, ``{"tag": T, "calls": [{"command": ..., "workdir": ...}, ...]}``:
the model calls the ``shell`` tool of the MCP server ``execgate`` with each in turn, then ends
the turn with a message. What each call returned to the model is kept in ``outputs[T]``.
"""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: How Codex 0.169 offers an MCP server's tools to the model: a namespace per server.
NAMESPACE = "mcp__execgate"
TOOL = "shell"


def _texts(content: object) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [
            c["text"] for c in content if isinstance(c, dict) and isinstance(c.get("text"), str)
        ]
    return []


def tool_result(output: object) -> dict[str, Any] | str:
    """The ``shell`` result (execgate's JSON text) inside what Codex handed the model, or the
    text itself when it is not one (a refusal by Codex, a tool error)."""
    texts = _texts(output)
    for text in texts:  # Codex prefixes "Wall time: ...\nOutput:\n"
        start = text.find('{"exit_code"')
        if start >= 0:
            found: dict[str, Any] = json.loads(text[start:])
            return found
    return "\n".join(texts)


class FakeModel:
    def __init__(self) -> None:
        self.outputs: dict[str, list[dict[str, Any] | str]] = {}
        self.requests: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # model listings & co.: not needed
                self.send_response(404)
                self.end_headers()

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                data = model._answer(body)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, body: dict[str, Any]) -> bytes:
        self.requests.append(body)
        items: list[dict[str, Any]] = body.get("input", [])
        script: dict[str, Any] | None = None
        start = 0
        for index, item in enumerate(items):
            if item.get("type") == "message" and item.get("role") == "user":
                for text in _texts(item.get("content")):
                    try:
                        parsed = json.loads(text)
                    except ValueError:
                        continue
                    if isinstance(parsed, dict) and "tag" in parsed:
                        script, start = parsed, index
        response_id = f"resp_{next(self._ids)}"
        item: dict[str, Any]
        if script is None:
            item = self._message(response_id, "no script in the prompt")
        else:
            done = [
                i.get("output") for i in items[start:] if i.get("type") == "function_call_output"
            ]
            self.outputs[script["tag"]] = [tool_result(o) for o in done]
            calls = script["calls"]
            if len(done) < len(calls):
                item = {
                    "type": "function_call",
                    "id": f"fc_{response_id}",
                    "call_id": f"call_{response_id}",
                    "namespace": NAMESPACE,
                    "name": TOOL,
                    "arguments": json.dumps(calls[len(done)]),
                    "status": "completed",
                }
            else:
                item = self._message(response_id, f"done: {len(done)} call(s)")
        events = [
            {"type": "response.created", "response": {"id": response_id}},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {
                "type": "response.completed",
                "response": {
                    "id": response_id,
                    "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
                },
            },
        ]
        return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)

    @staticmethod
    def _message(response_id: str, text: str) -> dict[str, Any]:
        return {
            "type": "message",
            "role": "assistant",
            "id": f"msg_{response_id}",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
