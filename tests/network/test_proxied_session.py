"""Real clients inside a proxied sandbox (``--network proxy``) against real servers on
loopback, reached by name through the proxy's hosts file; as root and as an ordinary user."""

from __future__ import annotations

import json
import re
import subprocess

from proxyharness import EXECGATE, Proxied

# A SOCKS5 client that prints the server's reply code (curl 7.x prints only the number).
SOCKS = """\
import socket, sys
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"\\x05\\x01\\x00"); assert s.recv(2) == b"\\x05\\x00"
host, command = sys.argv[1].encode(), bytes([int(sys.argv[3]) if len(sys.argv) > 3 else 1])
s.sendall(b"\\x05" + command + b"\\x00\\x03" + bytes([len(host)]) + host
          + int(sys.argv[2]).to_bytes(2, "big"))
print("socks reply", s.recv(10)[1])
"""


def test_http_https_and_socks_clients_reach_allowed_hosts(proxied: Proxied) -> None:
    s = proxied.servers
    done = proxied.run(
        f"""\
        curl -sS -m 20 http://good.test:{s.http_port}/curl
        curl -sS -m 20 --cacert {s.ca_file} https://secure.test:{s.https_port}/tls
        curl -sS -m 20 --proxy "$ALL_PROXY" http://good.test:{s.http_port}/socks
        python3 -c '
        import ssl, sys, urllib.request
        ctx = ssl.create_default_context(cafile="{s.ca_file}")
        for url in ("http://good.test:{s.http_port}/urllib",
                    "https://secure.test:{s.https_port}/urllib-tls"):
            sys.stdout.write(urllib.request.urlopen(url, context=ctx).read().decode())
        '
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"hello good.test:{s.http_port} /curl",
        f"hello secure.test:{s.https_port} /tls",
        f"hello good.test:{s.http_port} /socks",
        f"hello good.test:{s.http_port} /urllib",
        f"hello secure.test:{s.https_port} /urllib-tls",
    ]


def test_forbidden_and_unknown_hosts_are_refused_naming_the_rule(proxied: Proxied) -> None:
    s = proxied.servers
    done = proxied.run(
        f"""\
        curl -sS -m 20 http://bad.test:{s.http_port}/x; echo "rc=$?"
        curl -sS -m 20 --cacert {s.ca_file} https://bad.test:{s.https_port}/x; echo "rc=$?"
        curl -sS -m 20 -o /dev/null -w '%{{http_code}}\\n' http://nobody.test:{s.http_port}/
        python3 -c '{SOCKS}' bad.test {s.http_port}
        python3 -c '{SOCKS}' good.test {s.http_port}
        python3 -c '{SOCKS}' good.test 53 3
        """
    )
    out = done.stdout
    rules = proxied.rules
    assert (
        f"execgate: network access to bad.test port {s.http_port} (http) is forbidden by "
        f'network_rule("bad.test", "http", "forbidden") at {rules}:5: a paste site\nrc=0'
    ) in out
    # CONNECT refused: curl reports the proxy's 403 (the tunnel never opened)
    assert re.search(r"CONNECT tunnel failed, response 403", done.stderr), done.stderr
    assert "403\n" in out  # nobody.test: no rule, network.default = deny
    assert "socks reply 2\n" in out  # "connection not allowed by ruleset"
    assert "socks reply 0\n" in out
    assert "socks reply 7\n" in out  # UDP ASSOCIATE: command not supported, no UDP leaves
    assert "hello" not in out


def test_pip_downloads_from_a_local_index_allowed_by_rule(proxied_root: Proxied) -> None:
    s = proxied_root.servers
    done = proxied_root.run(
        f"""\
        python3 -m pip download --no-deps --trusted-host pypi.test \\
            --index-url http://pypi.test:{s.http_port}/simple/ \\
            -d "$PWD/dl" tinypkg 2>&1 | tail -3
        ls dl
        """
    )
    assert "tinypkg-1.0-py3-none-any.whl" in done.stdout.splitlines(), done.stdout


def test_direct_connections_and_other_ways_out_fail(proxied: Proxied) -> None:
    """Ignoring the proxy variables: no route, no name resolution, no UDP, no raw or packet
    sockets, no listening, no other loopback port; through the proxy, nothing internal that no
    rule names (the proxy's own port on the host, loopback services, a second proxy hop)."""
    s = proxied.servers
    attack = f"""\
import socket, errno
def attempt(name, fn):
    try:
        fn(); print(name, "REACHED")
    except OSError as exc:
        print(name, "failed", errno.errorcode.get(exc.errno, exc.errno))
def tcp(host, port):
    socket.create_connection((host, port), timeout=5).close()
def udp():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(3)
    u.sendto(b"ping", ("127.0.0.1", {s.udp_port})); u.recvfrom(16)
def listen():
    socket.create_server(("127.0.0.1", 8080)).close()
attempt("direct loopback server", lambda: tcp("127.0.0.1", {s.http_port}))
attempt("direct by name", lambda: tcp("good.test", {s.http_port}))
attempt("resolve", lambda: socket.getaddrinfo("example.com", 80))
attempt("udp echo", udp)
attempt("raw socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("packet socket", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
attempt("netlink socket", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW))
attempt("listen", listen)
attempt("other loopback port", lambda: tcp("127.0.0.1", 8080))
import os
opened = 0  # the proxy side (any socket of any process, the server included) by /proc
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        fds = os.listdir(f"/proc/{{pid}}/fd")
    except OSError:
        continue
    for fd in fds:
        try:
            if os.readlink(f"/proc/{{pid}}/fd/{{fd}}").startswith("socket:"):
                os.close(os.open(f"/proc/{{pid}}/fd/{{fd}}", os.O_RDWR)); opened += 1
        except OSError:
            pass
print("sockets opened through /proc:", opened)
"""
    done = proxied.run(
        f"""\
        python3 -c '{attack}'
        curl -sS -m 20 --noproxy '' -o /dev/null -w 'proxy port %{{http_code}}\\n' \\
            http://127.0.0.1:3128/
        curl -sS -m 20 --noproxy '' -o /dev/null -w 'loopback %{{http_code}}\\n' \\
            http://127.0.0.1:{s.http_port}/
        curl -sS -m 20 -o /dev/null -w 'second hop %{{http_code}}\\n' \\
            -x http://127.0.0.1:3128 --preproxy socks5h://127.0.0.1:3128 http://good.test:{s.http_port}/
        echo still working
        """
    )
    lines = done.stdout.splitlines()
    assert not [line for line in lines if "REACHED" in line], done.stdout
    assert sum(" failed " in line for line in lines) == 9, done.stdout + done.stderr
    assert "sockets opened through /proc: 0" in lines
    assert "proxy port 403" in lines
    assert "loopback 403" in lines
    assert "second hop 000" in lines or "second hop 403" in lines, done.stdout
    assert lines[-1] == "still working"


def test_internal_addresses_need_a_rule_naming_the_host(proxied_root: Proxied) -> None:
    """DNS rebinding into the local network: with every host allowed by default, a name that
    resolves to loopback is still refused unless a rule names it."""
    proxied_root.configure('default = "allow"\n')
    s = proxied_root.servers
    done = proxied_root.run(
        f"""\
        curl -sS -m 20 http://rebind.test:{s.http_port}/; echo "rc=$?"
        curl -sS -m 20 http://good.test:{s.http_port}/named
        """
    )
    assert (
        f"network access to rebind.test port {s.http_port} (http) denied: it resolves to the "
        "internal address 127.0.0.1; only a network_rule naming rebind.test"
    ) in done.stdout
    assert f"hello good.test:{s.http_port} /named" in done.stdout


def test_every_decision_is_logged_with_the_process_that_made_it(proxied_root: Proxied) -> None:
    p = proxied_root
    s = p.servers
    audit = p.work.parent / "audit.jsonl"  # a copy of the decision log
    p.run(
        f"""\
        curl -sS -m 20 http://good.test:{s.http_port}/ >/dev/null
        curl -sS -m 20 http://bad.test:{s.http_port}/cause >/dev/null
        """,
        "--audit",
        str(audit),
    )
    entries = [json.loads(line) for line in audit.read_text().splitlines()]
    network = [e for e in entries if e.get("permission") == "network"]
    allowed = [e for e in network if e["decision"] == "allow"]
    denied = [e for e in network if e["decision"] == "deny"]
    assert allowed[0]["kind"] == "permission"
    assert allowed[0]["source"] == "rule"
    assert allowed[0]["detail"]["host"] == "good.test"
    assert allowed[0]["detail"]["port"] == s.http_port
    assert allowed[0]["detail"]["protocol"] == "http"
    assert allowed[0]["detail"]["rule"] == f"{p.rules}:1"
    assert allowed[0]["detail"]["addresses"] == ["127.0.0.1"]
    assert denied[0]["detail"]["host"] == "bad.test"
    assert denied[0]["detail"]["rule"] == f"{p.rules}:5"
    assert "forbidden by" in denied[0]["reason"]
    # the denial names the command that caused it
    assert denied[0]["detail"]["argv"][:1] == ["curl"]
    assert f"http://bad.test:{s.http_port}/cause" in denied[0]["detail"]["argv"]
    # `execgate log` shows it
    shown = subprocess.run(
        [*EXECGATE, "log", "--denied"], env=p.env, capture_output=True, text=True, check=True
    )
    assert "permission network" in shown.stdout and "bad.test" in shown.stdout


def test_proxy_variables_come_back_on_every_exec_but_not_for_escalations(
    proxied_root: Proxied,
) -> None:
    done = proxied_root.run(
        """        env -u HTTP_PROXY -u no_proxy HTTPS_PROXY=http://elsewhere:1 \\
            bash -c 'echo "$HTTP_PROXY $HTTPS_PROXY $no_proxy"'
        env -i /bin/bash -c 'echo "$ALL_PROXY"'
        printenv HTTPS_PROXY; echo "rc=$?"
        """
    )
    assert done.stdout.splitlines() == [
        "http://127.0.0.1:3128 http://127.0.0.1:3128 localhost,127.0.0.1,::1",
        "socks5h://127.0.0.1:3128",
        "rc=1",  # escalated printenv runs outside: no proxy variable (the session had none)
    ], done.stderr
