"""Network rules as the proxy reads them: which rule decides a host, what "always" writes,
``execgate rules explain --host``, and the settings that turn the proxy on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from execgate.config import load_config
from execgate.errors import ExecgateError
from execgate.policy import Decision, load_rules_files
from execgate.policy.amend import append_network_allow_rule
from execgate.policy.network import judge_network
from execgate.sandbox.spec import PROXY_PORT, build_spec

RULES = """\
network_rule("pypi.org", "https", "allow")
network_rule("pypi.org", "https", "prompt", justification="mirror only")
network_rule("pypi.org", "http", "forbidden")
network_rule("[::1]:8080", "socks5_tcp", "allow")
"""


def test_the_strictest_rule_for_host_and_protocol_decides(tmp_path: Path) -> None:
    rules = tmp_path / "a.rules"
    rules.write_text(RULES)
    policy = load_rules_files([rules], cache=False)
    https = judge_network(policy, "PyPI.org.", "https")
    assert https.decision == Decision.PROMPT
    assert https.justification() == "mirror only"
    assert https.rule_locations() == f"{rules}:2"
    assert judge_network(policy, "pypi.org", "http").decision == Decision.FORBIDDEN
    assert judge_network(policy, "pypi.org", "socks5_tcp").decision is None
    assert judge_network(policy, "files.pypi.org", "https").decision is None  # no wildcards
    assert judge_network(policy, "::1", "socks5_tcp").decision == Decision.ALLOW


def test_always_appends_a_network_rule_that_loads(tmp_path: Path) -> None:
    rules = tmp_path / "user" / "default.rules"
    assert append_network_allow_rule(rules, "Ask.Test.", "http")
    assert not append_network_allow_rule(rules, "ask.test", "http")  # already there
    assert rules.read_text() == (
        'network_rule(host="ask.test", protocol="http", decision="allow")\n'
    )
    policy = load_rules_files([rules], cache=False)
    assert judge_network(policy, "ask.test", "http").decision == Decision.ALLOW


def test_rules_explain_host(tmp_path: Path) -> None:
    rules = tmp_path / "a.rules"
    rules.write_text(RULES)
    done = subprocess.run(
        [sys.executable, "-m", "execgate", "rules", "explain", "-r", str(rules),
         "--host", "PYPI.org", "--protocol", "https"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.splitlines() == [
        "pypi.org over https:",
        f"  allow      {rules}:1 [file]",
        f"  prompt     {rules}:2 [file]  # mirror only",
        "  decision: prompt (the strictest): a human is asked (once, for the session, or always)",
    ]
    unknown = subprocess.run(
        [sys.executable, "-m", "execgate", "rules", "explain", "-r", str(rules),
         "--host", "example.com", "--protocol", "http"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "no network_rule names this host: network.default decides" in unknown.stdout


def test_network_settings(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[sandbox]\nnetwork = "proxy"\n[network]\ndefault = "allow"\n')
    loaded = load_config(config)
    assert loaded.network.default == "allow"
    spec = build_spec("workspace-write", cwd=tmp_path, config=loaded.sandbox)
    assert spec.network_proxy and not spec.network
    assert spec.launcher_args()[-2:] == ["--proxy-port", str(PROXY_PORT)]
    assert "network through the proxy" in spec.describe()
    # flags win over config; off means no namespace at all
    assert build_spec("workspace-write", cwd=tmp_path, config=loaded.sandbox, network="on").network
    with pytest.raises(ExecgateError, match="--network proxy needs a sandbox"):
        build_spec("off", cwd=tmp_path, network="proxy")
    assert not build_spec("off", cwd=tmp_path, config=loaded.sandbox).network_proxy
    # network rules in force: the proxy is workspace-write's default, not read-only's
    assert build_spec("workspace-write", cwd=tmp_path, network_rules=True).network_proxy
    assert not build_spec("read-only", cwd=tmp_path, network_rules=True).network_proxy
    assert not build_spec(
        "workspace-write", cwd=tmp_path, network_rules=True, network="off"
    ).network_proxy
    for bad in ('[sandbox]\nnetwork = "yes"\n', '[network]\ndefault = "ask"\n',
                '[network]\nhosts_file = "relative"\n', "[network]\nport = 1\n"):  # fmt: skip
        config.write_text(bad)
        with pytest.raises(ExecgateError):
            load_config(config)
