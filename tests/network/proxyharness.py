"""The proxy tests' world: ``execgate run --sandbox workspace-write --network proxy`` as
root or as the unprivileged user, with rules naming the test servers (fixtures: conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from netservers import Servers

EXECGATE = [sys.executable, "-m", "execgate"]

RULES = """\
network_rule("good.test", "http", "allow")
network_rule("good.test", "socks5_tcp", "allow")
network_rule("secure.test", "https", "allow")
network_rule("pypi.test", "http", "allow")
network_rule("bad.test", "http", "forbidden", justification="a paste site")
network_rule("bad.test", "https", "forbidden", justification="a paste site")
network_rule("bad.test", "socks5_tcp", "forbidden", justification="a paste site")
network_rule("ask.test", "http", "prompt", justification="ask first")
prefix_rule(["printenv"], "allow")
"""


@dataclass
class Proxied:
    """``execgate run --sandbox workspace-write --network proxy`` as one user."""

    home: Path  # EXECGATE_HOME
    work: Path
    rules: Path
    env: dict[str, str]
    servers: Servers
    as_user: object | None  # the `unprivileged` fixture, or None for root

    def configure(self, network: str) -> None:
        (self.home / "config.toml").write_text(
            f'[network]\nhosts_file = "{self.servers.hosts_file}"\n{network}'
        )

    def argv(self, script: str, *options: str, rules: bool = True) -> list[str]:
        return [
            *EXECGATE,
            "run",
            *(["--rules", str(self.rules)] if rules else []),
            "--sandbox",
            "workspace-write",
            "--network",
            "proxy",
            *options,
            "--",
            "bash",
            "-c",
            script,
        ]

    def run(
        self, script: str, *options: str, rules: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        argv = self.argv(textwrap.dedent(script), *options, rules=rules)
        if self.as_user is not None:
            argv = self.as_user.argv(argv)  # type: ignore[attr-defined]
        done = subprocess.run(
            argv,
            env=self.env,
            cwd=self.work,
            capture_output=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # no controlling terminal: prompts have no human
        )
        return subprocess.CompletedProcess(
            done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
        )


def make_proxied(servers: Servers, tmp: Path, user: object | None) -> Proxied:
    home, work = tmp / "execgate-home", tmp / "work"
    for path in (home, work):
        path.mkdir()
    rules = tmp / "net.rules"
    rules.write_text(RULES)
    env = {
        "PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(tmp),
        "EXECGATE_HOME": str(home),
        "EXECGATE_SYSTEM_DIR": str(tmp / "etc-execgate"),
        "CODEX_HOME": str(tmp / "codex-home"),
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_CACHE_DIR": "1",
    }
    proxied = Proxied(home, work, rules, env, servers, user)
    proxied.configure('default = "deny"\n')
    if user is not None:
        user.chown_tree(tmp)  # type: ignore[attr-defined]
    return proxied
