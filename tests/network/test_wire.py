"""The proxy's parsing of what clients send (pure functions: every malformed input is an
error with the answer to give, never a crash or a guess)."""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from execgate.netproxy import wire
from execgate.netproxy.resolve import is_internal, literal, read_hosts_file
from execgate.netproxy.wire import Target, WireError


def test_absolute_form_is_rewritten_for_the_checked_host() -> None:
    head = (
        b"GET http://Example.COM.:8080/a/b?x=1 HTTP/1.1\r\n"
        b"Host: evil.example\r\n"
        b"Proxy-Connection: keep-alive\r\n"
        b"Proxy-Authorization: Basic eA==\r\n"
        b"Connection: keep-alive, X-Secret\r\n"
        b"X-Secret: 1\r\n"
        b"Accept: */*\r\n\r\n"
    )
    assert wire.head_end(head) == len(head)
    request = wire.parse_http_head(head)
    assert request.target == Target("example.com", 8080, "http")
    # the Host header is the authority that was judged (no fronting to another virtual host);
    # hop-by-hop headers and those Connection names are not forwarded
    assert request.forward == (
        b"GET /a/b?x=1 HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\n"
        b"Connection: close\r\n\r\n"
    )


@pytest.mark.parametrize(
    ("line", "target"),
    [
        (b"CONNECT pypi.org:443 HTTP/1.1", Target("pypi.org", 443, "https")),
        (b"CONNECT [::1]:8443 HTTP/1.1", Target("::1", 8443, "https")),
        (b"CONNECT 10.0.0.1:22 HTTP/1.0", Target("10.0.0.1", 22, "https")),
        (b"GET http://a.test HTTP/1.1", Target("a.test", 80, "http")),
        (b"GET http://a.test?q HTTP/1.1", Target("a.test", 80, "http")),
    ],
)
def test_targets(line: bytes, target: Target) -> None:
    assert wire.parse_http_head(line + b"\r\nHost: x\r\n\r\n").target == target


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n", 400),  # origin-form: not a proxy request
        (b"GET https://a.test/ HTTP/1.1\r\n\r\n", 400),  # https goes through CONNECT
        (b"CONNECT a.test HTTP/1.1\r\n\r\n", 400),  # no port
        (b"CONNECT a.test:0 HTTP/1.1\r\n\r\n", 400),
        (b"CONNECT a.test:70000 HTTP/1.1\r\n\r\n", 400),
        (b"CONNECT *.test:443 HTTP/1.1\r\n\r\n", 400),
        (b"CONNECT a b:443 HTTP/1.1\r\n\r\n", 400),
        (b"CONNECT ::1:443 HTTP/1.1\r\n\r\n", 400),
        (b"CONNECT a.test:443 HTTP/2\r\n\r\n", 505),
        (b"GET http://user:pw@a.test/ HTTP/1.1\r\n\r\n", 400),
        (b"GET http://a.test/ HTTP/1.1\r\nBad Header\r\n\r\n", 400),
        (b"GET http://a.test/ HTTP/1.1\r\nX: a\rb\r\n\r\n", 400),
        ("GET http://bücher.test/ HTTP/1.1\r\n\r\n".encode(), 400),
    ],
)
def test_malformed_requests(head: bytes, status: int) -> None:
    with pytest.raises(WireError) as caught:
        wire.parse_http_head(head)
    assert caught.value.status == status


def test_head_size_is_bounded() -> None:
    assert wire.head_end(b"GET http://a/ HTTP/1.1\r\n") == -1
    with pytest.raises(WireError) as caught:
        wire.head_end(b"X" * (wire.MAX_HEAD + 1))
    assert caught.value.status == 431


def test_refusals_are_complete_responses() -> None:
    response = wire.http_response(403, "execgate: forbidden by rule x")
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert b"Content-Length: 30\r\n" in head
    assert body == b"execgate: forbidden by rule x\n"


def _socks(host: bytes, port: int, command: int = 1, kind: int = 3) -> bytes:
    address = bytes([len(host)]) + host if kind == 3 else host
    return bytes([5, command, 0, kind]) + address + struct.pack("!H", port)


def test_socks5() -> None:
    assert wire.socks_greeting(b"\x05") == -1
    assert wire.socks_greeting(b"\x05\x02\x02\x00") == 4
    with pytest.raises(WireError):
        wire.socks_greeting(b"\x05\x01\x02")  # only username/password offered
    request = _socks(b"Good.Test", 443)
    assert wire.socks_request(request[:-1]) is None
    assert wire.socks_request(request + b"extra") == (
        len(request),
        Target("good.test", 443, "socks5_tcp"),
    )
    v4 = _socks(bytes([127, 0, 0, 1]), 80, kind=1)
    assert wire.socks_request(v4) == (len(v4), Target("127.0.0.1", 80, "socks5_tcp"))
    with pytest.raises(WireError) as caught:
        wire.socks_request(_socks(b"good.test", 53, command=3))  # UDP ASSOCIATE
    assert caught.value.socks == wire.SOCKS_COMMAND_UNSUPPORTED
    with pytest.raises(WireError) as caught:
        wire.socks_request(_socks(b"a\x00b", 80))
    assert caught.value.socks == wire.SOCKS_ADDRESS_UNSUPPORTED
    assert wire.socks_reply(wire.SOCKS_NOT_ALLOWED)[1] == 2


@given(st.binary(max_size=300))
def test_any_bytes_parse_or_raise_wire_error(data: bytes) -> None:
    for parse in (wire.parse_http_head, wire.socks_request, wire.socks_greeting, wire.head_end):
        with contextlib.suppress(WireError):
            parse(data)


def test_internal_addresses() -> None:
    for text in ("127.0.0.1", "10.1.2.3", "192.168.1.1", "169.254.1.1", "0.0.0.0", "::1",
                 "fe80::1", "fc00::1", "::ffff:127.0.0.1", "224.0.0.1", "100.64.0.1"):  # fmt: skip
        address = literal(text)
        assert address is not None and is_internal(address), text
    for text in ("93.184.216.34", "2606:4700::1111", "::ffff:8.8.8.8"):
        address = literal(text)
        assert address is not None and not is_internal(address), text


def test_hosts_file(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("# c\n127.0.0.1 a.test B.test. # x\nnot-an-ip c.test\n::1 a.test\n")
    table = read_hosts_file(path)
    assert [str(a) for a in table["a.test"]] == ["127.0.0.1", "::1"]
    assert "b.test" in table and "c.test" not in table
