"""What clients send a proxy, parsed: HTTP request heads and SOCKS5 messages.

Pure functions over bytes, no I/O. Everything a client sends is untrusted: sizes are bounded,
anything malformed raises :class:`WireError` (with the HTTP status or SOCKS5 reply to send).
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from execgate.policy.language import normalize_network_host
from execgate.policy.network import CONNECT_PROTOCOL, FORWARD_PROTOCOL

#: The longest request head (request line and headers) accepted.
MAX_HEAD = 32 * 1024

# Headers for this hop only: never forwarded (plus those the Connection header names).
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "upgrade",
    }
)
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class WireError(Exception):
    """A request the proxy cannot serve: ``status`` is the HTTP answer, ``socks`` the SOCKS5
    reply code."""

    def __init__(self, message: str, *, status: int = 400, socks: int = 1) -> None:
        super().__init__(message)
        self.status = status
        self.socks = socks


@dataclass(frozen=True, slots=True)
class Target:
    """Where a client wants to go, and how it asked."""

    host: str  # normalised: lower case, no trailing dot, IPv6 without brackets
    port: int
    protocol: str  # "http", "https" or "socks5_tcp" (as network rules name them)


@dataclass(frozen=True, slots=True)
class HttpRequest:
    target: Target
    # What to send upstream before relaying: the request head in origin-form for a forwarded
    # request; empty for CONNECT (the tunnel carries the client's own bytes).
    forward: bytes


def head_end(buffer: bytes | bytearray) -> int:
    """The length of the request head in ``buffer`` (through the blank line), or -1 if it is
    not complete yet. Raises :class:`WireError` when it is longer than :data:`MAX_HEAD`."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > MAX_HEAD:
            raise WireError("request head too long", status=431)
        return -1
    if end + 4 > MAX_HEAD:
        raise WireError("request head too long", status=431)
    return end + 4


def split_host_port(authority: str, default_port: int | None) -> tuple[str, int]:
    """``host[:port]`` or ``[v6][:port]`` -> (normalised host, port)."""
    if authority.startswith("["):
        inside, bracket, rest = authority[1:].partition("]")
        if not bracket:
            raise WireError(f"bad authority {authority!r}")
        host, port_text = inside, rest[1:] if rest.startswith(":") else None
        if rest and port_text is None:
            raise WireError(f"bad authority {authority!r}")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise WireError(f"bad IPv6 literal {host!r}") from None
    elif ":" in authority:
        host, _, port_text = authority.rpartition(":")
        if ":" in host:
            raise WireError(f"bad authority {authority!r} (IPv6 needs brackets)")
    else:
        host, port_text = authority, None
    if port_text is None:
        if default_port is None:
            raise WireError(f"{authority!r} names no port")
        port = default_port
    else:
        if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
            raise WireError(f"bad port in {authority!r}")
        port = int(port_text)
    return normalize_host(host), port


def normalize_host(host: str) -> str:
    """A host as rules name it; :class:`WireError` for anything that is not a host name or
    an IP literal."""
    if not host or len(host) > 253 or not host.isascii():
        raise WireError(f"bad host {host!r}")
    try:
        name = normalize_network_host(host)
    except ValueError as exc:
        raise WireError(f"bad host {host!r}: {exc}") from None
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789-._:")
    if not set(name) <= allowed or name.startswith((".", "-")):
        raise WireError(f"bad host {host!r}")
    return name


def parse_http_head(head: bytes) -> HttpRequest:
    """A proxy request head (from :func:`head_end`): ``CONNECT host:port`` or an
    absolute-form ``http://`` request, rewritten to origin-form for the upstream server (its
    ``Host`` header is the checked authority; hop-by-hop headers dropped; ``Connection:
    close``)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes everything
        raise WireError("undecodable head") from None
    lines = text.split("\r\n")
    if len(lines) < 3 or lines[-1] != "" or lines[-2] != "":
        raise WireError("the head does not end with an empty line")
    request_line, header_lines = lines[0], lines[1:-2]
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[0] or not set(parts[0].encode()) <= _TOKEN:
        raise WireError("malformed request line")
    method, target, version = parts
    # A bare LF or CR (or any control) in the target would reach the server as lines of the
    # client's own after the checked request line (a second Host, a second request).
    if not target or any(ord(ch) <= 0x20 or ord(ch) == 0x7F for ch in target):
        raise WireError("malformed request target")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise WireError(f"unsupported HTTP version {version!r}", status=505)
    headers: list[tuple[str, str]] = []
    for line in header_lines:
        name, colon, value = line.partition(":")
        if not colon or not name or not set(name.encode()) <= _TOKEN:
            raise WireError("malformed header line")
        if any(ch in value for ch in "\r\n\0"):
            raise WireError("malformed header value")
        headers.append((name, value.strip()))
    if method == "CONNECT":
        host, port = split_host_port(target, None)
        return HttpRequest(Target(host, port, CONNECT_PROTOCOL), b"")
    scheme, sep, rest = target.partition("://")
    if not sep or scheme.lower() != "http":
        raise WireError(
            "only absolute-form http:// requests and CONNECT are proxied "
            "(https:// goes through CONNECT)"
        )
    authority, slash, path = rest.partition("/")
    authority, query_sep, query = authority.partition("?")
    if "@" in authority:
        raise WireError("credentials in the URL are not forwarded")
    host, port = split_host_port(authority, 80)
    origin = "/" + path if slash else "/"
    if query_sep:
        origin = "/" + ("" if not slash else path) + "?" + query
    named = {
        word.strip().lower()
        for name, value in headers
        if name.lower() == "connection"
        for word in value.split(",")
    }
    out = [f"{method} {origin} {version}"]
    host_header = f"[{host}]" if ":" in host else host
    out.append(f"Host: {host_header}" + ("" if port == 80 else f":{port}"))
    for name, value in headers:
        lower = name.lower()
        if lower in _HOP_BY_HOP or lower in named or lower == "host":
            continue
        out.append(f"{name}: {value}")
    out.append("Connection: close")
    forward = ("\r\n".join(out) + "\r\n\r\n").encode("latin-1")
    return HttpRequest(Target(host, port, FORWARD_PROTOCOL), forward)


_REASONS = {
    200: "Connection established",
    400: "Bad Request",
    403: "Forbidden",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}


def http_response(status: int, body: str = "") -> bytes:
    """A complete response the proxy itself gives (a refusal says why in its body)."""
    reason = _REASONS.get(status, "Error")
    if status == 200:
        return b"HTTP/1.1 200 Connection established\r\n\r\n"
    data = (body.rstrip("\n") + "\n").encode() if body else b""
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + data


# -- SOCKS5 (RFC 1928) --------------------------------------------------------------------

SOCKS_VERSION = 5
SOCKS_CONNECT, SOCKS_BIND, SOCKS_UDP_ASSOCIATE = 1, 2, 3
SOCKS_OK = 0
SOCKS_FAILURE = 1
SOCKS_NOT_ALLOWED = 2  # "connection not allowed by ruleset"
SOCKS_HOST_UNREACHABLE = 4
SOCKS_REFUSED = 5
SOCKS_COMMAND_UNSUPPORTED = 7
SOCKS_ADDRESS_UNSUPPORTED = 8


def socks_greeting(buffer: bytes | bytearray) -> int:
    """The length of a complete greeting (VER NMETHODS METHODS…) in ``buffer``, or -1 if
    more is needed. Raises :class:`WireError` unless it offers "no authentication"."""
    if len(buffer) < 2:
        return -1
    if buffer[0] != SOCKS_VERSION:
        raise WireError("not SOCKS5")
    end = 2 + buffer[1]
    if len(buffer) < end:
        return -1
    if 0 not in buffer[2:end]:
        raise WireError("the client offers no method without authentication")
    return end


#: The server's choice: no authentication.
SOCKS_METHOD_REPLY = bytes([SOCKS_VERSION, 0])
#: No acceptable method.
SOCKS_METHOD_REFUSED = bytes([SOCKS_VERSION, 0xFF])


def socks_request(buffer: bytes | bytearray) -> tuple[int, Target] | None:
    """A complete request (VER CMD RSV ATYP ADDR PORT) -> (its length, target), or None if
    more is needed. Only CONNECT is served: anything else raises :class:`WireError` with the
    reply code to send."""
    if len(buffer) < 5:
        return None
    version, command, _reserved, kind = buffer[0], buffer[1], buffer[2], buffer[3]
    if version != SOCKS_VERSION:
        raise WireError("not SOCKS5")
    if kind == 1:
        end = 4 + 4 + 2
        if len(buffer) < end:
            return None
        host = str(ipaddress.IPv4Address(bytes(buffer[4:8])))
    elif kind == 4:
        end = 4 + 16 + 2
        if len(buffer) < end:
            return None
        host = str(ipaddress.IPv6Address(bytes(buffer[4:20])))
    elif kind == 3:
        end = 5 + buffer[4] + 2
        if len(buffer) < end:
            return None
        try:
            host = bytes(buffer[5 : end - 2]).decode("ascii")
        except UnicodeDecodeError:
            raise WireError("bad host name", socks=SOCKS_ADDRESS_UNSUPPORTED) from None
    else:
        raise WireError("unknown address type", socks=SOCKS_ADDRESS_UNSUPPORTED)
    if command != SOCKS_CONNECT:
        raise WireError("only CONNECT is supported", socks=SOCKS_COMMAND_UNSUPPORTED)
    (port,) = struct.unpack("!H", bytes(buffer[end - 2 : end]))
    if port == 0:
        raise WireError("port 0", socks=SOCKS_FAILURE)
    try:
        name = normalize_host(host)
    except WireError as exc:
        raise WireError(str(exc), socks=SOCKS_ADDRESS_UNSUPPORTED) from None
    return end, Target(name, port, "socks5_tcp")


def socks_reply(code: int) -> bytes:
    """A reply to a request (bound address 0.0.0.0:0: clients do not need it)."""
    return bytes([SOCKS_VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0])
