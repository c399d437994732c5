"""Evaluation: Codex's matching, the check JSON, host-executable resolution, reasons."""

# ruff: noqa: E501  (rules texts and Codex's messages are quoted verbatim)

from __future__ import annotations

import json
from pathlib import Path

import pytest

from execgate.policy import Decision, Policy, PrefixRule, resolve_program_path
from execgate.policy.language import PolicyBuilder, evaluate_rules_text

from .conftest import Env

BASIC = """\
prefix_rule(pattern = ["git", ["status", "diff"]], decision = "allow", justification = "read-only git",
            match = [["git", "status"], "git diff --stat"], not_match = ["git push"])
prefix_rule(pattern = ["git", "push"], decision = "prompt")
prefix_rule(pattern = ["git"], decision = "prompt")
prefix_rule(pattern = [["rm", "rmdir"], "-rf"], decision = "forbidden", justification = "no recursive deletes")
prefix_rule(pattern = ["echo"])
"""


def policy_of(*texts: str) -> Policy:
    builder = PolicyBuilder()
    for i, text in enumerate(texts):
        builder.add_file(evaluate_rules_text(text, f"{i}.rules"))
    return builder.build()


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (
            ["git", "status"],
            '{"matchedRules":[{"prefixRuleMatch":{"matchedPrefix":["git","status"],"decision":'
            '"allow","justification":"read-only git"}},{"prefixRuleMatch":{"matchedPrefix":'
            '["git"],"decision":"prompt"}}],"decision":"prompt"}',
        ),
        (
            ["git", "push", "origin"],
            '{"matchedRules":[{"prefixRuleMatch":{"matchedPrefix":["git","push"],"decision":'
            '"prompt"}},{"prefixRuleMatch":{"matchedPrefix":["git"],"decision":"prompt"}}],'
            '"decision":"prompt"}',
        ),
        (
            ["rm", "-rf", "/"],
            '{"matchedRules":[{"prefixRuleMatch":{"matchedPrefix":["rm","-rf"],"decision":'
            '"forbidden","justification":"no recursive deletes"}}],"decision":"forbidden"}',
        ),
        (["ls"], '{"matchedRules":[]}'),
        (["/usr/bin/echo", "hi"], '{"matchedRules":[]}'),
        ([""], '{"matchedRules":[]}'),
    ],
)
def test_worked_examples(command: list[str], expected: str) -> None:
    assert policy_of(BASIC).evaluate(command).to_check_json() == expected


def test_pretty_json_and_resolved_program() -> None:
    evaluation = policy_of(BASIC).evaluate(["/usr/bin/echo", "hi"], resolve_host_executables=True)
    assert evaluation.to_check_json(pretty=True) == json.dumps(
        {
            "matchedRules": [
                {
                    "prefixRuleMatch": {
                        "matchedPrefix": ["echo"],
                        "decision": "allow",
                        "resolvedProgram": "/usr/bin/echo",
                    }
                }
            ],
            "decision": "allow",
        },
        indent=2,
    )


def test_json_escapes_like_serde() -> None:
    policy = policy_of('prefix_rule(["a\\u0001\\t\\"é\\u007f"], justification = "x\\ny")')
    output = policy.evaluate(['a\x01\t"é\x7f']).to_check_json()
    assert output == (
        '{"matchedRules":[{"prefixRuleMatch":{"matchedPrefix":["a\\u0001\\t\\"é\x7f"],'
        '"decision":"allow","justification":"x\\ny"}}],"decision":"allow"}'
    )


def test_all_matches_in_load_order_across_files_with_duplicates() -> None:
    b = 'prefix_rule(["cargo", "build"])\nprefix_rule(["cargo", "build"])'
    a = 'prefix_rule(["cargo"], "forbidden")'
    evaluation = policy_of(b, a).evaluate(["cargo", "build", "--release"])
    assert [m.matched_prefix for m in evaluation.matches] == [
        ("cargo", "build"),
        ("cargo", "build"),
        ("cargo",),
    ]
    assert evaluation.decision is Decision.FORBIDDEN
    reversed_order = policy_of(a, b).evaluate(["cargo", "build"])
    assert [m.decision for m in reversed_order.matches] == [
        Decision.FORBIDDEN,
        Decision.ALLOW,
        Decision.ALLOW,
    ]


def test_strictest_decision_wins() -> None:
    assert Decision.ALLOW < Decision.PROMPT < Decision.FORBIDDEN
    assert max(Decision) is Decision.FORBIDDEN
    policy = policy_of('prefix_rule(["x"])\nprefix_rule(["x", "y"], "prompt")')
    assert policy.evaluate(["x", "y"]).decision is Decision.PROMPT
    assert policy.evaluate(["x", "z"]).decision is Decision.ALLOW


def test_pattern_longer_than_command_does_not_match() -> None:
    assert policy_of('prefix_rule(["a", "b", "c"])').evaluate(["a", "b"]).matches == []


def test_sources_are_reported() -> None:
    match = policy_of("\n\nprefix_rule(['a'])").evaluate(["a"]).matches[0]
    assert str(match.source) == "0.rules:3:1"


def test_first_tokens() -> None:
    assert policy_of(BASIC).first_tokens() == frozenset({"git", "rm", "rmdir", "echo"})


# --- resolution ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "resolved"),
    [
        ("/usr/bin/../bin/ls", "/usr/bin/ls"),
        ("//bin//ls", "/bin/ls"),
        ("./ls", "/cwd/ls"),
        ("bin/ls", "/cwd/bin/ls"),
        ("../ls", "/ls"),
        ("/usr/bin/ls/", "/usr/bin/ls"),
        ("/usr/bin/ls/.", "/usr/bin/ls"),
        ("/../ls", "/ls"),
        ("", "/cwd"),
        ("..", "/"),
    ],
)
def test_program_paths_are_normalised_lexically(token: str, resolved: str) -> None:
    assert resolve_program_path(token, "/cwd") == resolved


def test_tilde_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/me")
    assert resolve_program_path("~/bin/ls", "/cwd") == "/home/me/bin/ls"
    assert resolve_program_path("~", "/cwd") == "/home/me"
    assert resolve_program_path("~root/x", "/cwd") == "/root/x"
    assert resolve_program_path("~no-such-user-xyz/ls", "/cwd") == "/cwd/~no-such-user-xyz/ls"
    monkeypatch.setenv("HOME", "rel")
    assert resolve_program_path("~/ls", "/cwd") == "/cwd/rel/ls"


def test_resolution_only_when_asked_and_only_without_a_literal_match() -> None:
    policy = policy_of('prefix_rule(["ls"], "prompt")\nprefix_rule(["/bin/ls"], "forbidden")')
    assert policy.evaluate(["/usr/bin/ls"]).decision is None
    resolved = policy.evaluate(["/usr/bin/ls"], resolve_host_executables=True)
    assert resolved.decision is Decision.PROMPT
    assert resolved.matches[0].resolved_program == "/usr/bin/ls"
    assert resolved.matches[0].matched_prefix == ("ls",)
    literal = policy.evaluate(["/bin/ls"], resolve_host_executables=True)
    assert literal.decision is Decision.FORBIDDEN  # the literal rule wins; no basename step
    assert literal.matches[0].resolved_program is None


def test_host_executable_gates_basename_matches() -> None:
    policy = policy_of(
        'host_executable(name = "git", paths = ["/usr/bin/git", "/opt/homebrew/bin/git"])\n'
        'prefix_rule(["git", "status"], "prompt")\n'
        'host_executable(name = "none", paths = [])\nprefix_rule(["none"])'
    )
    assert policy.evaluate(["/usr/bin/git", "status"], resolve_host_executables=True).decision
    assert not policy.evaluate(
        ["/usr/local/bin/git", "status"], resolve_host_executables=True
    ).matches
    assert not policy.evaluate(["/usr/bin/git", "status"]).matches
    assert not policy.evaluate(["/bin/none"], resolve_host_executables=True).matches
    assert policy.evaluate(["git", "status"], resolve_host_executables=True).decision


def test_relative_programs_resolve_against_the_given_cwd(env: Env) -> None:
    policy = policy_of('prefix_rule(["tool"], "prompt")')
    evaluation = policy.evaluate(["./tool"], cwd="/srv/project", resolve_host_executables=True)
    assert evaluation.matches[0].resolved_program == "/srv/project/tool"
    default_cwd = policy.evaluate(["./tool"], resolve_host_executables=True)
    assert default_cwd.matches[0].resolved_program == str(Path.cwd() / "tool")


def test_root_has_no_basename() -> None:
    assert not policy_of('prefix_rule([""])').evaluate(["/"], resolve_host_executables=True).matches


# --- reasons ---------------------------------------------------------------------------------


def test_reasons_use_codex_texts() -> None:
    policy = policy_of(
        """
prefix_rule(["rm"], "forbidden")
prefix_rule(["rm", "-rf"], "forbidden", justification = "use trash instead")
prefix_rule(["dd"], "forbidden")
prefix_rule(["git", "push"], "prompt", justification = "publishes")
prefix_rule(["git"], "prompt")
prefix_rule(["npm"], "prompt")
prefix_rule(["ls"], justification = "read-only")
"""
    )
    assert (
        policy.evaluate(["rm", "-rf", "/x y"]).reason()
        == "`rm -rf '/x y'` rejected: use trash instead"
    )
    assert policy.evaluate(["dd", "if=x"]).reason() == (
        "`dd 'if=x'` rejected: policy forbids commands starting with `dd`"
    )
    assert policy.evaluate(["git", "push"]).reason() == "`git push` requires approval: publishes"
    assert policy.evaluate(["npm", "i"]).reason() == "`npm i` requires approval by policy"
    assert policy.evaluate(["ls"]).reason() == "`ls` allowed: read-only"
    assert policy.evaluate(["cat"]).reason() == "`cat` matches no rule"


def test_reason_takes_the_longest_prefix_and_the_last_on_ties() -> None:
    policy = policy_of(
        'prefix_rule(["a", "b"], "forbidden", justification = "first")\n'
        'prefix_rule(["a", "b"], "forbidden", justification = "second")\n'
        'prefix_rule(["a"], "forbidden", justification = "short")'
    )
    assert policy.evaluate(["a", "b"]).reason() == "`a b` rejected: second"


def test_with_allow_prefix_adds_an_exact_rule() -> None:
    policy = policy_of('prefix_rule(["git"], "prompt")').with_allow_prefix(["cargo", "test"])
    assert policy.evaluate(["cargo", "test", "-q"]).decision is Decision.ALLOW
    assert policy.evaluate(["cargo", "build"]).decision is None
    with pytest.raises(ValueError):
        policy.with_allow_prefix([])


def test_extended_keeps_order_and_last_host_definition() -> None:
    base = Policy((PrefixRule("a", (), Decision.ALLOW),), host_executables={"a": ("/x/a",)})
    extra = PrefixRule("a", (), Decision.PROMPT)
    policy = base.extended([extra], host_executables={"a": ("/y/a",)})
    assert [m.decision for m in policy.evaluate(["a"]).matches] == [Decision.ALLOW, Decision.PROMPT]
    assert policy.host_executables == {"a": ("/y/a",)}
