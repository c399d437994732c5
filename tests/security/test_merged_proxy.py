"""Attacks on `--network proxy` from inside proxied sessions (run and mcp), as root and as an
unprivileged user: where the proxy meets policy, name resolution and the prompts.

The upstream servers here record the raw bytes they receive, so a test sees exactly what the
proxy let through.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import mcp_types as types
import pytest
from mcpharness import Elicitations, Mcp, accept, clean_up, make_world, payload, shell_args

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "network"))
from netservers import Servers, start_servers
from proxyharness import Proxied, make_proxied


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    found = start_servers(Path(tempfile.mkdtemp(prefix="execgate-net-")))
    yield found
    found.close()


@pytest.fixture(params=["root", "user"])
def proxied(request: pytest.FixtureRequest, servers: Servers, tmp_path: Path) -> Proxied:
    """`execgate run --sandbox workspace-write --network proxy`, as root and as the user."""
    user = request.getfixturevalue("unprivileged") if request.param == "user" else None
    return make_proxied(servers, user.make_dir() if user is not None else tmp_path, user)


class Recorder:
    """A TCP server on ``host`` that records each request head it receives and answers 200."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                data = b""
                try:
                    while b"\r\n\r\n" not in data and len(data) < 65536:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    self.received.append(data)
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"
                    )
                except OSError:
                    self.received.append(data)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    yield server
    server.close()


# Speaks to the proxy itself (what any program in the sandbox can do) and prints one line per
# request: the proxy's status line, or the SOCKS5 reply code.
CLIENT = textwrap.dedent(
    r"""
    import socket, struct, sys
    def ask(raw):
        s = socket.create_connection(("127.0.0.1", 3128), timeout=60)
        s.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
        head, _, body = data.partition(b"\r\n\r\n")
        return head.split(b"\r\n")[0].decode() + " | " + body.decode(errors="replace").strip()
    def socks6(address, port):
        s = socket.create_connection(("127.0.0.1", 3128), timeout=60)
        s.sendall(b"\x05\x01\x00")
        s.recv(2)
        s.sendall(b"\x05\x01\x00\x04" + socket.inet_pton(socket.AF_INET6, address)
                  + struct.pack("!H", port))
        reply = s.recv(10)
        s.close()
        return f"socks {address} reply {reply[1] if len(reply) > 1 else -1}"
    port = int(sys.argv[1])
    for name, raw in [
        ("smuggle", f"GET http://127.0.0.1:{port}/a\nHost:\tbad.test\n\nGET\t/b HTTP/1.1\r\n\r\n"),
        ("cr", f"GET http://127.0.0.1:{port}/a\rX:1 HTTP/1.1\r\n\r\n"),
        ("compat", f"CONNECT [::7f00:1]:{port} HTTP/1.1\r\n\r\n"),
        ("nat64", f"CONNECT [64:ff9b::7f00:1]:{port} HTTP/1.1\r\n\r\n"),
        ("6to4", f"CONNECT [2002:7f00:1::]:{port} HTTP/1.1\r\n\r\n"),
        ("mapped", f"CONNECT [::ffff:127.0.0.1]:{port} HTTP/1.1\r\n\r\n"),
        ("decimal", f"CONNECT 2130706433:{port} HTTP/1.1\r\n\r\n"),
        ("literal", f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n"),
        ("userinfo", f"GET http://good.test@127.0.0.1:{port}/ HTTP/1.1\r\n\r\n"),
    ]:
        print(name, ask(raw.encode("latin-1")), flush=True)
    print(socks6("::7f00:1", port), flush=True)
    print("still working", flush=True)
    """
)


def test_the_proxy_admits_no_smuggled_head_and_no_internal_address_in_disguise(
    proxied: Proxied, recorder: Recorder
) -> None:
    """From inside `--network proxy`, with unknown hosts allowed by default:

    * a bare LF (or CR) in an absolute-form URL went through to the server as header lines of
      the client's (`Host: bad.test` after the proxy's own checked request line) — found on
      the merged main; now 400;
    * IPv6 forms that carry an IPv4 address (IPv4-compatible `::7f00:1`, NAT64 `64:ff9b::/96`,
      6to4 `2002::/16`, SIIT `::ffff:0:0/96`) were judged public and dialled — found on the
      merged main; now refused like 127.0.0.1;
    * the forms that held: `::ffff:127.0.0.1`, `2130706433`, `127.0.0.1` without a rule naming
      it for CONNECT, userinfo in the URL, SOCKS5 with an IPv6 address.
    """
    p = proxied
    p.rules.write_text('network_rule("127.0.0.1", "http", "allow")\n')
    p.configure('default = "allow"\n')
    (p.work / "client.py").write_text(CLIENT)
    if p.as_user is not None:
        p.as_user.chown_tree(p.work)  # type: ignore[attr-defined]
    done = p.run(f"python3 client.py {recorder.port}")
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert done.stdout.rstrip().endswith("still working"), (done.stdout, done.stderr)
    for name in ("smuggle", "cr"):
        assert lines[name].startswith("HTTP/1.1 400"), (name, done.stdout)
    for name in ("compat", "nat64", "6to4", "mapped", "decimal", "literal"):
        assert lines[name].startswith("HTTP/1.1 403"), (name, done.stdout)
        assert "internal address" in lines[name], (name, done.stdout)
    assert lines["userinfo"].startswith("HTTP/1.1 400"), done.stdout
    assert lines["socks"] == "::7f00:1 reply 2", done.stdout  # not allowed by ruleset
    # Nothing the client wrote reached the server but whole, checked heads.
    for head in recorder.received:
        assert b"bad.test" not in head and b"\n" not in head.replace(b"\r\n", b""), head


# -- a session grant and a name that moves ------------------------------------------------------


@pytest.fixture
def mcp(tmp_path: Path) -> Iterator[Mcp]:
    world = make_world(tmp_path)
    yield world
    clean_up(world)


def test_a_session_grant_does_not_follow_a_name_to_an_internal_address_never_shown(
    mcp: Mcp,
) -> None:
    """A human allowed `ask.test` "for this session" while it resolved to 127.0.0.2; then the
    name moved (DNS rebinding; here the hosts file) to 127.0.0.1, where another internal
    service listens. The grant admitted the new address nobody saw (found on the merged main:
    the second server got the request). Now the question is asked again, showing it."""
    shown, secret = Recorder("127.0.0.2"), Recorder("127.0.0.1")
    hosts = mcp.root / "hosts"
    hosts.write_text("127.0.0.2 ask.test\n")
    mcp.write_rules('network_rule("ask.test", "http", "prompt", justification="ask first")\n')
    (mcp.root / "execgate-home" / "config.toml").write_text(f'[network]\nhosts_file = "{hosts}"\n')
    answers = Elicitations([accept("session"), types.ElicitResult(action="decline")])
    moved = mcp.work / "moved"
    command = (
        f"curl -sS -m 30 http://ask.test:{shown.port}/first; echo; "
        f"for i in $(seq 1200); do [ -e {moved} ] && break; sleep 0.05; done; "
        f"curl -sS -m 30 http://ask.test:{secret.port}/second; echo; echo still working"
    )

    async def scenario() -> list[str]:
        async with mcp.client("--sandbox", "workspace-write", elicit=answers) as client:
            call = asyncio.ensure_future(client.call_tool("shell", shell_args(mcp, command)))
            await asyncio.to_thread(mcp.wait_for, lambda: shown.received, "the first request")
            hosts.write_text("127.0.0.1 ask.test\n")  # the name moves
            moved.touch()
            return [payload(await call)["output"]]

    try:
        outputs = asyncio.run(scenario())
    finally:
        shown.close()
        secret.close()
    assert outputs[0].startswith("ok"), outputs
    assert not secret.received, (secret.received, outputs)
    assert "still working" in outputs[0], outputs
    assert len(answers.asked) == 2, [a.message for a in answers.asked]
    assert "127.0.0.1" in answers.asked[1].message, answers.asked[1].message


# -- one listener per confined spawn, for the whole session ---------------------------------------


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_confined_runs_do_not_pile_up_listeners_in_the_server(proxied: Proxied) -> None:
    """Each confined spawn hands the server the listener of its own network namespace. A
    rule-named program that matches no rule runs confined in a spawn of its own, so a loop of
    100 such runs left 100 listeners (and namespaces) held by the server until the session
    ended (found on the merged main: +100 descriptors; a server at a soft limit of 1024 stops
    answering execs). A listener now closes when its spawn's process has exited."""
    p = proxied
    program = p.work / "bin" / "tru"
    program.parent.mkdir()
    shutil.copy("/bin/true", program)
    p.rules.write_text(f'prefix_rule(["{program}", "never"], "forbidden")\n')
    if p.as_user is not None:
        p.as_user.chown_tree(p.work)  # type: ignore[attr-defined]
    script = (
        "echo start; while [ ! -e go1 ]; do sleep 0.05; done; "
        f"for i in $(seq 100); do {program}; done; "
        "echo ran; while [ ! -e go2 ]; do sleep 0.05; done; echo still working"
    )
    argv = p.argv(script)
    if p.as_user is not None:
        argv = p.as_user.argv(argv)  # type: ignore[attr-defined]
    with subprocess.Popen(
        argv, env=p.env, cwd=p.work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, start_new_session=True, text=True,
    ) as server:  # fmt: skip
        try:
            assert server.stdout is not None
            assert server.stdout.readline() == "start\n"
            before = _descriptors(server.pid)
            (p.work / "go1").touch()
            assert server.stdout.readline() == "ran\n"
            after = _descriptors(server.pid)
            for _ in range(100):  # a failure guard: the last listeners close soon after
                if after < before + 20:
                    break
                time.sleep(0.1)
                after = _descriptors(server.pid)
            (p.work / "go2").touch()
            out, err = server.communicate(timeout=60)
        finally:
            if server.poll() is None:
                server.kill()
    assert "still working" in out, (out, err)
    assert after < before + 20, (before, after)


# -- the hosts file the proxy reads at each connection ---------------------------------------------


def test_the_hosts_file_cannot_be_rewritten_from_inside(proxied: Proxied) -> None:
    """`network.hosts_file` is read before DNS at every connection. Kept inside the workspace,
    the session rewrote it to point a name an allow rule vouches for (so its internal
    addresses are dialled) at another internal address (found on the merged main: the
    rewrite took). It is now read-only in every sandbox, like the rules."""
    p = proxied
    hosts = p.work / "hosts"
    hosts.write_text(p.servers.hosts_file.read_text())
    p.configure('default = "deny"\n')
    (p.home / "config.toml").write_text(f'[network]\nhosts_file = "{hosts}"\ndefault = "deny"\n')
    if p.as_user is not None:
        p.as_user.chown_tree(p.work)  # type: ignore[attr-defined]
    done = p.run(
        f"""\
        echo "10.1.2.3 good.test" >> {hosts} && echo rewritten
        curl -sS -m 20 http://good.test:{p.servers.http_port}/still
        """
    )
    assert "rewritten" not in done.stdout, (done.stdout, done.stderr)
    assert "10.1.2.3" not in hosts.read_text()
    assert f"hello good.test:{p.servers.http_port} /still" in done.stdout, done
