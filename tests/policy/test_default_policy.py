"""The built-in default policy: valid, its examples pass, and it says what it should."""

from __future__ import annotations

import pytest

from execgate.policy import Decision, Policy
from execgate.policy.language import PolicyBuilder, evaluate_rules_text
from execgate.policy.layers import default_rules_path, default_rules_text


@pytest.fixture(scope="module")
def default() -> Policy:
    builder = PolicyBuilder()  # also runs every match/not_match example in the file
    builder.add_file(evaluate_rules_text(default_rules_text("/home/alice"), "default.rules"))
    return builder.build()


@pytest.mark.parametrize(
    "command",
    [
        "rm -rf /",
        "rm -fr /",
        "rm -r -f /",
        "rm -f -r /",
        "rm -R --force /",
        "rm --recursive --force /",
        "rm -rf --no-preserve-root /",
        "rm --no-preserve-root -rf /",
        "rm -rfv /*",
        "rm -rf /bin /boot /dev",  # what the shell makes of rm -rf /*
        "rm -rf /home/alice",
        "rm -rf /home/alice/",
        "rm -rf ~",
        "sudo rm -rf /",
        "/usr/bin/rm -rf /usr",
        "find / -delete",
        "mkfs.ext4 /dev/sda1",
        "mkfs -t xfs /dev/sdb",
        "mkswap /dev/sda2",
        "dd if=/dev/zero of=/dev/sda bs=1M",
        "dd of=/dev/nvme0n1p2",
        "shred /dev/sdb",
        "chmod -R 777 /",
    ],
)
def test_forbidden(default: Policy, command: str) -> None:
    assert default.evaluate(command.split(), resolve_host_executables=True).decision is (
        Decision.FORBIDDEN
    )


@pytest.mark.parametrize(
    "command",
    [
        "git push",
        "git push --force origin main",
        "npm publish",
        "pnpm publish",
        "yarn npm publish",
        "cargo publish",
        "twine upload dist/x.whl",
        "uv publish",
        "gem push x.gem",
        "docker push img",
        "gh release create v1",
        "git reset --hard",
        "git clean -fdx",
        "sudo apt-get install x",
        "terraform apply",
    ],
)
def test_prompt(default: Policy, command: str) -> None:
    assert default.evaluate(command.split(), resolve_host_executables=True).decision is (
        Decision.PROMPT
    )


@pytest.mark.parametrize(
    "command",
    [
        "ls -la",
        "cat README.md",
        "git status",
        "git diff HEAD~1",
        "git log --oneline --output=/tmp/x",
        "/bin/ls",
        "grep -rn x .",
    ],
)
def test_read_only_tools_run_in_the_sandbox(default: Policy, command: str) -> None:
    """Read-only tools need no escalation: no rule lets them out of the sandbox."""
    assert default.evaluate(command.split(), resolve_host_executables=True).decision is None


def test_the_built_in_policy_escalates_nothing(default: Policy) -> None:
    assert [r for r in default.rules if r.decision is Decision.ALLOW] == []


@pytest.mark.parametrize(
    "command", ["newgrp docker", "sg adm -c id", "ssh-agent bash", "su -", "crontab -e"]
)
def test_set_id_programs_ask(default: Policy, command: str) -> None:
    assert default.evaluate(command.split(), resolve_host_executables=True).decision is (
        Decision.PROMPT
    )


@pytest.mark.parametrize(
    "command",
    [
        "rm -rf build",
        "rm file",
        "./ls",  # a program the agent wrote is not `ls`
        "/tmp/x/cat secret",
        "sort -o out in",
        "find . -name x",
        "git commit -m x",
        "npm install",
        "dd if=in of=out",
        "python3 script.py",
    ],
)
def test_no_decision_runs_sandboxed(default: Policy, command: str) -> None:
    assert default.evaluate(command.split(), resolve_host_executables=True).decision is None


def test_shipped_file_is_valid_as_is_for_codex() -> None:
    text = default_rules_path().read_text()
    assert "HOMES = []" in text  # standalone (and under Codex) it needs nothing predefined
    PolicyBuilder().add_file(evaluate_rules_text(text, "default.rules"))
