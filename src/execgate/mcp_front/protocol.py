"""MCP's facts that ``execgate mcp`` serves by: protocol versions, the two eras, the handshake.

Two protocol eras share the stdio wire; the client's first request picks one for the connection:

* **handshake** (2024-11-05 … 2025-11-25): ``initialize`` negotiates the version and tells the
  client's capabilities once; the server may send requests (``elicitation/create``);
* **modern** (2026-07-28): no handshake; every request carries its own envelope in
  ``params._meta`` (protocol version, client capabilities, client info), ``server/discover``
  describes the server, results carry ``resultType`` and the server's info, and the server
  sends no requests (questions travel as an ``input_required`` result instead).

Pure and small (no asyncio): the opening answer (:mod:`execgate.mcp_front.opening`) uses it
before the rest of the server is imported. See docs/mcp.md.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from execgate import __version__
from execgate.mcp_front.wire import INVALID_PARAMS, UNSUPPORTED_PROTOCOL_VERSION, RpcError

HANDSHAKE_VERSIONS: Final = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MODERN_VERSIONS: Final = ("2026-07-28",)
LATEST_HANDSHAKE: Final = HANDSHAKE_VERSIONS[-1]

VERSION_KEY: Final = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_KEY: Final = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_KEY: Final = "io.modelcontextprotocol/clientInfo"
SERVER_INFO_KEY: Final = "io.modelcontextprotocol/serverInfo"

SERVER_NAME: Final = "execgate"
SERVER_INFO: Final = {"name": SERVER_NAME, "version": __version__}
INSTRUCTIONS: Final = (
    "This server provides a tool to execute shell commands and return their output. "
    "Every program a command starts is checked against the user's execgate policy first: "
    "a denied program fails with an `execgate: denied: ...` line in the output that says why, "
    "and some programs wait for a human's approval."
)
SANDBOX_STATE_METHOD: Final = "codex/sandbox-state/update"
SANDBOX_STATE_CAPABILITY: Final = {"codex/sandbox-state": {"version": "1.0.0"}}
TOOLS_CAPABILITY: Final = {"tools": {"listChanged": False}}
#: Results a modern client may cache (for this client only, revalidating every time).
_CACHE_HINT: Final = {"ttlMs": 0, "cacheScope": "private"}
_CACHEABLE: Final = frozenset({"tools/list", "server/discover"})


class Client(NamedTuple):
    """Who sent a request: the protocol version in force, the client's name and capabilities."""

    protocol_version: str
    name: str
    capabilities: dict[str, Any]

    @property
    def modern(self) -> bool:
        return self.protocol_version in MODERN_VERSIONS

    def can_elicit(self) -> bool:
        """Whether the client shows elicitation forms. An empty ``elicitation: {}`` is form
        mode (2025-06-18 clients); URL-only cannot show forms."""
        elicitation = self.capabilities.get("elicitation")
        if not isinstance(elicitation, dict):
            return False
        return "form" in elicitation or "url" not in elicitation


def _invalid_params() -> RpcError:
    return RpcError(INVALID_PARAMS, "Invalid request parameters", "")


def handshake(params: dict[str, Any] | None) -> tuple[Client, dict[str, Any]]:
    """The client ``initialize`` describes and the answer: the version it asks for when this
    server speaks it, else the newest handshake version."""
    params = params or {}
    requested, capabilities = params.get("protocolVersion"), params.get("capabilities")
    info = params.get("clientInfo")
    if (
        not isinstance(requested, str)
        or not isinstance(capabilities, dict)
        or not isinstance(info, dict)
        or not isinstance(info.get("name"), str)
        or not isinstance(info.get("version"), str)
    ):
        raise _invalid_params()
    version = requested if requested in HANDSHAKE_VERSIONS else LATEST_HANDSHAKE
    result = {
        "protocolVersion": version,
        "capabilities": {"experimental": SANDBOX_STATE_CAPABILITY, **TOOLS_CAPABILITY},
        "serverInfo": SERVER_INFO,
        "instructions": INSTRUCTIONS,
    }
    return Client(version, info["name"], capabilities), result


def has_envelope(params: dict[str, Any] | None) -> bool:
    """Whether a request carries the 2026-07-28 envelope (its reserved version key)."""
    meta = (params or {}).get("_meta")
    return isinstance(meta, dict) and VERSION_KEY in meta


def envelope(params: dict[str, Any] | None) -> Client:
    """The client a 2026-07-28 request describes in its envelope (:class:`RpcError` if it
    does not, or names a version this server does not serve)."""
    meta = (params or {}).get("_meta")
    if not isinstance(meta, dict):
        raise RpcError(
            INVALID_PARAMS,
            f"params._meta must be an object carrying the required {VERSION_KEY!r} and "
            f"{CAPABILITIES_KEY!r} envelope keys",
        )
    missing = [key for key in (VERSION_KEY, CAPABILITIES_KEY) if key not in meta]
    if missing:
        raise RpcError(
            INVALID_PARAMS,
            f"params._meta is missing the required envelope key(s): {', '.join(missing)}",
        )
    version = meta[VERSION_KEY]
    if not isinstance(version, str):
        raise RpcError(INVALID_PARAMS, f"{VERSION_KEY} must be a string")
    if version not in MODERN_VERSIONS:
        raise unsupported_version(version)
    info, capabilities = meta.get(CLIENT_INFO_KEY), meta[CAPABILITIES_KEY]
    name = info.get("name") if isinstance(info, dict) else None
    return Client(
        version,
        name if isinstance(name, str) else "",
        capabilities if isinstance(capabilities, dict) else {},
    )


def unsupported_version(requested: object) -> RpcError:
    data: dict[str, Any] = {"supported": list(MODERN_VERSIONS)}
    if isinstance(requested, str):
        data["requested"] = requested
    return RpcError(UNSUPPORTED_PROTOCOL_VERSION, "Unsupported protocol version", data)


def discover_result() -> dict[str, Any]:
    return {
        "supportedVersions": list(MODERN_VERSIONS),
        "capabilities": dict(TOOLS_CAPABILITY),
        "instructions": INSTRUCTIONS,
    }


def modern_result(method: str, result: dict[str, Any]) -> dict[str, Any]:
    """A result as 2026-07-28 sends it: cache hints where they apply, ``resultType`` (complete
    unless the handler set one) and the server's info in ``_meta``."""
    shaped = {**_CACHE_HINT, **result} if method in _CACHEABLE else dict(result)
    shaped.setdefault("resultType", "complete")
    meta = shaped.get("_meta")
    shaped["_meta"] = {**(meta if isinstance(meta, dict) else {}), SERVER_INFO_KEY: SERVER_INFO}
    return shaped
