"""The ``.rules`` language: every builtin, every error, locations. (Codex's exact texts are
also checked differentially in test_codex_conformance.py; these run without Codex.)"""

# ruff: noqa: E501  (rules texts and Codex's messages are quoted verbatim)

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import starlark

from execgate.policy import Decision, PolicyError, load_rules_files
from execgate.policy.language import (
    PolicyBuilder,
    evaluate_rules_text,
    normalize_network_host,
)

from .conftest import Env


def load(text: str, name: str = "t.rules") -> PolicyBuilder:
    builder = PolicyBuilder()
    builder.add_file(evaluate_rules_text(text, name))
    return builder


def error_of(text: str, name: str = "t.rules") -> str:
    """The error in Codex's words (what ``execgate check`` prints)."""
    with pytest.raises(PolicyError) as caught:
        load(text, name)
    return caught.value.codex_text


def test_starlark_is_the_rust_implementation() -> None:
    """The pure-Python `starlark` package installs the same import name; it must not win."""
    assert importlib.metadata.version("starlark-pyo3")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("starlark")
    native = Path(starlark.__file__).parent
    assert any(p.name.startswith("starlark.") and p.suffix == ".so" for p in native.iterdir())
    assert hasattr(starlark, "Dialect") and hasattr(starlark.Module, "add_callable")


# --- prefix_rule ----------------------------------------------------------------------------


def test_prefix_rule_keyword_and_positional_forms() -> None:
    text = """
prefix_rule(pattern = ["git", "status"])
prefix_rule(["git", "push"], "prompt")
prefix_rule(["rm"], "forbidden", ["rm -rf x"], ["ls"], "no deletes")
prefix_rule(["ls"], canonical_matching = True, justification = "read-only", decision = "allow")
"""
    rules = load(text).rules
    assert [(r.program, r.rest, r.decision) for r in rules] == [
        ("git", (("status",),), Decision.ALLOW),
        ("git", (("push",),), Decision.PROMPT),
        ("rm", (), Decision.FORBIDDEN),
        ("ls", (), Decision.ALLOW),
    ]
    assert rules[2].justification == "no deletes"
    assert rules[3].canonical_matching is True


def test_first_token_alternatives_expand_and_later_ones_stay() -> None:
    rules = load('prefix_rule([["python", "python3"], ["-c", "-m"], "x"])').rules
    assert [(r.program, r.rest) for r in rules] == [
        ("python", (("-c", "-m"), ("x",))),
        ("python3", (("-c", "-m"), ("x",))),
    ]


def test_one_element_alternative_is_a_plain_token() -> None:
    rules = load('prefix_rule([["git"], ["status"]])').rules
    assert (rules[0].program, rules[0].rest) == ("git", (("status",),))


def test_empty_and_whitespace_tokens_are_accepted() -> None:
    policy = load('prefix_rule([""])\nprefix_rule([" ", "\\t"])').build()
    assert policy.evaluate([""]).decision is Decision.ALLOW
    assert policy.evaluate([" ", "\t", "x"]).decision is Decision.ALLOW


def test_starlark_features_work() -> None:
    text = """
TOOLS = ["ls", "cat"]
def read_only(tool, why = "read-only"):
    prefix_rule([tool], justification = f"{tool} is {why}")
for tool in TOOLS:
    read_only(tool)
[prefix_rule([t, "-x"], "prompt") for t in TOOLS]
lambda x: x
"""
    rules = load(text).rules
    assert [r.justification for r in rules[:2]] == ["ls is read-only", "cat is read-only"]
    assert len(rules) == 4


def test_locations_name_the_call_site() -> None:
    text = (
        'x = 1\nprefix_rule(["a"])\ndef f():\n    prefix_rule(["b"])\nf()\ny = prefix_rule(["c"])\n'
    )
    rules = load(text, "loc.rules").rules
    assert [str(r.source) for r in rules] == ["loc.rules:2:1", "loc.rules:4:5", "loc.rules:6:5"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('prefix_rule(pattern = ["git"], decision = "deny")', "invalid decision: deny"),
        ('prefix_rule(["git"], "Allow")', "invalid decision: Allow"),
        ("prefix_rule(pattern = [])", "invalid pattern element: pattern cannot be empty"),
        ("prefix_rule([[]])", "invalid pattern element: pattern alternatives cannot be empty"),
        (
            "prefix_rule([1])",
            "invalid pattern element: pattern element must be a string or list of strings "
            "(got int)",
        ),
        (
            'prefix_rule(["a", ["b", None]])',
            "invalid pattern element: pattern alternative must be a string (got NoneType)",
        ),
        (
            'prefix_rule(pattern = "git")',
            "Type of parameter `pattern` doesn't match, expected `list`, "
            'actual `string (repr: "git")`',
        ),
        (
            'prefix_rule(pattern = ("git",))',
            "Type of parameter `pattern` doesn't match, expected `list`, "
            'actual `tuple (repr: ("git",))`',
        ),
        (
            'prefix_rule(["git"], decision = None)',
            "Type of parameter `decision` doesn't match, expected `str`, "
            "actual `NoneType (repr: None)`",
        ),
        (
            'prefix_rule(["git"], canonical_matching = 1)',
            "Type of parameter `canonical_matching` doesn't match, expected `bool`, "
            "actual `int (repr: 1)`",
        ),
        ('prefix_rule(["a"], justification = "  ")', "invalid rule: justification cannot be empty"),
        (
            'prefix_rule(["a"], foo = 1, bar = 2)',
            "Found `foo` `bar` extra named parameter(s) for call to prefix_rule",
        ),
        ("prefix_rule()", "Missing parameter `pattern` for call to `prefix_rule`"),
        (
            'prefix_rule(["a"], "allow", [], [], "j", False, 7)',
            "Found 1 extra positional argument(s) for call to prefix_rule",
        ),
        ('prefix_rule(["a"], pattern = ["b"])', "Argument `pattern` occurs more than once"),
        ('prefix_rule(["a"], match = [""])', "invalid example: example cannot be an empty string"),
        ('prefix_rule(["a"], match = [[]])', "invalid example: example cannot be an empty list"),
        (
            'prefix_rule(["a"], match = ["a \\"b"])',
            "invalid example: example string has invalid shell syntax",
        ),
        (
            'prefix_rule(["a"], match = [[1]])',
            "invalid example: example tokens must be strings (got int)",
        ),
        (
            'prefix_rule(["a"], not_match = [2.5])',
            "invalid example: example must be a string or list of strings (got float)",
        ),
        (
            'prefix_rule(["a"], match = ["b", "c d"])',
            'expected every example to match at least one rule. rules: ["PrefixRule { pattern: '
            'PrefixPattern { canonical_matching: false, first: \\"a\\", rest: [] }, decision: '
            'Allow, justification: None }"]; unmatched examples: ["b", "c d"]',
        ),
        (
            'prefix_rule(["a", ["b", "c"]], "forbidden", not_match = ["a c \'x y\'"], '
            'justification = "j")',
            "expected example to not match rule `PrefixRuleMatch { matched_prefix: "
            '["a", "c"], decision: Forbidden, resolved_program: None, justification: '
            "Some(\"j\") }`: a c 'x y'",
        ),
        ("unknown_fn()", "Variable `unknown_fn` not found"),
        (
            'load("x.star", "a")',
            "No imports are available, you tried `x.star` (no call to `Evaluator.set_loader`)",
        ),
        ("prefix_rule([lambda: 1])", "`prefix_rule` cannot take a value of type `function`"),
    ],
)
def test_prefix_rule_errors(text: str, message: str) -> None:
    assert error_of(text) == f"t.rules:1:1: {message}"


def test_error_inside_a_function_points_at_the_inner_call() -> None:
    text = 'x = 1\ndef f():\n    prefix_rule(["a"], decision = "maybe")\nf()\n'
    assert error_of(text) == "t.rules:3:5: invalid decision: maybe"


def test_syntax_error_has_a_location() -> None:
    message = error_of("x = 1\nprefix_rule(pattern = ['a'] decision = 'allow')\n")
    assert message.startswith("t.rules:2:29: Parse error: unexpected identifier")


def test_error_message_is_one_line_without_traceback() -> None:
    message = error_of('def f():\n    fail("boom")\nf()\n')
    assert message == "t.rules:2:5: fail: boom"
    assert "\n" not in message and "Traceback" not in message


def test_long_reprs_are_shortened_like_starlark() -> None:
    value = "abcdefghijklmnopqrstuvwxyz" * 3
    message = error_of(f'prefix_rule(pattern = "{value}")')
    assert '"abcdefghijklmnopqrstuvwxyzabcdefg<<...>>klmnopqrstuvwxyz"' in message


# --- examples ---------------------------------------------------------------------------------


def test_examples_are_checked_after_the_file_with_later_host_executables() -> None:
    text = """
prefix_rule(["git", "status"], not_match = ["/usr/local/bin/git status"], match = ["/usr/bin/git status"])
host_executable(name = "git", paths = ["/usr/bin/git"])
"""
    load(text)  # the example resolves /usr/bin/git thanks to the definition below it


def test_examples_use_only_the_rules_of_their_call() -> None:
    text = 'prefix_rule(["a"])\nprefix_rule(["b"], match = ["a"])\n'
    assert 'unmatched examples: ["a"]' in error_of(text)


def test_examples_see_host_executables_of_earlier_files(env: Env) -> None:
    first = env.write("1.rules", 'host_executable(name = "git", paths = ["/opt/git"])\n')
    second = env.write("2.rules", 'prefix_rule(["git"], not_match = ["/usr/bin/git x"])\n')
    load_rules_files([first, second], cache=False)
    with pytest.raises(PolicyError, match="not_match example `/usr/bin/git x` matches"):
        load_rules_files([second], cache=False)


# --- host_executable --------------------------------------------------------------------------


def test_host_executable_last_definition_wins_and_paths_are_normalised() -> None:
    text = """
host_executable(name = "git", paths = ["/a/git"])
host_executable("git", ["/usr/bin/../bin/git", "/usr/bin/git", "/opt/git/."])
"""
    assert load(text).host_executables == {"git": ("/usr/bin/git", "/opt/git")}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('host_executable(name = "")', "Missing parameter `paths` for call to `host_executable`"),
        (
            'host_executable(name = "", paths = [])',
            "invalid rule: host_executable name cannot be empty",
        ),
        (
            'host_executable(name = "/usr/bin/git", paths = [])',
            "invalid rule: host_executable name must be a bare executable name (got /usr/bin/git)",
        ),
        (
            'host_executable(name = "..", paths = [])',
            "invalid rule: host_executable name must be a bare executable name (got ..)",
        ),
        (
            'host_executable(name = "git", paths = ["bin/git"])',
            "invalid rule: host_executable paths must be absolute (got bin/git)",
        ),
        (
            'host_executable(name = "git", paths = ["/usr/bin/gitx"])',
            "invalid rule: host_executable path `/usr/bin/gitx` must have basename `git`",
        ),
        (
            'host_executable(name = "git", paths = ["/usr/bin/git/.."])',
            "invalid rule: host_executable path `/usr/bin/git/..` must have basename `git`",
        ),
        (
            'host_executable(name = "git", paths = [1])',
            "invalid rule: host_executable paths must be strings (got int)",
        ),
        (
            "host_executable(name = 1, paths = [])",
            "Type of parameter `name` doesn't match, expected `str`, actual `int (repr: 1)`",
        ),
    ],
)
def test_host_executable_errors(text: str, message: str) -> None:
    assert error_of(text) == f"t.rules:1:1: {message}"


# --- network_rule -----------------------------------------------------------------------------


def test_network_rules_are_parsed_and_kept() -> None:
    text = """
network_rule("API.Example.com.", "https_connect", "deny", justification = "no")
network_rule(host = "[::1]:8080", protocol = "socks5_udp", decision = "prompt")
"""
    rules = load(text).build().network_rules
    assert [(r.host, r.protocol, r.decision, r.justification) for r in rules] == [
        ("api.example.com", "https", Decision.FORBIDDEN, "no"),
        ("::1", "socks5_udp", Decision.PROMPT, None),
    ]


def test_network_rules_never_affect_commands() -> None:
    policy = load('network_rule(host = "x.org", protocol = "http", decision = "deny")').build()
    assert policy.evaluate(["curl", "x.org"]).decision is None


@pytest.mark.parametrize(
    ("host", "normalized"),
    [
        (" Example.COM ", "example.com"),
        ("host:443", "host"),
        ("a:b:c", "a:b:c"),
        ("x.org..", "x.org"),
    ],
)
def test_network_host_normalisation(host: str, normalized: str) -> None:
    assert normalize_network_host(host) == normalized


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'network_rule(host = "x", protocol = "ftp", decision = "allow")',
            "invalid rule: network_rule protocol must be one of http, https, socks5_tcp, "
            "socks5_udp (got ftp)",
        ),
        ('network_rule(host = "x", protocol = "http", decision = "ask")', "invalid decision: ask"),
        (
            'network_rule(host = " . ", protocol = "http", decision = "allow")',
            "invalid rule: network_rule host cannot be empty",
        ),
        (
            'network_rule(host = "http://x", protocol = "http", decision = "deny")',
            "invalid rule: network_rule host must be a hostname or IP literal (without scheme "
            "or path)",
        ),
        (
            'network_rule(host = "*.x.com", protocol = "http", decision = "deny")',
            "invalid rule: network_rule host must be a specific host; wildcards are not allowed",
        ),
        (
            'network_rule(host = "a b", protocol = "http", decision = "deny")',
            "invalid rule: network_rule host cannot contain whitespace",
        ),
        (
            'network_rule(host = "[::1", protocol = "http", decision = "deny")',
            "invalid rule: network_rule host has an invalid bracketed IPv6 literal",
        ),
        (
            'network_rule(host = "[::1]x", protocol = "http", decision = "deny")',
            "invalid rule: network_rule host contains an unsupported suffix: [::1]x",
        ),
        (
            'network_rule(host = "x", protocol = "http", decision = "deny", justification = "")',
            "invalid rule: justification cannot be empty",
        ),
        (
            'network_rule(host = "x", protocol = "http")',
            "Missing parameter `decision` for call to `network_rule`",
        ),
    ],
)
def test_network_rule_errors(text: str, message: str) -> None:
    assert error_of(text) == f"t.rules:1:1: {message}"


# --- files ------------------------------------------------------------------------------------


def test_read_errors(env: Env) -> None:
    (env.work / "bad.rules").write_bytes(b"\xff")
    with pytest.raises(
        PolicyError, match=r"^failed to read policy at missing\.rules: No such file"
    ):
        load_rules_files([Path("missing.rules")], cache=False)
    with pytest.raises(PolicyError, match="stream did not contain valid UTF-8"):
        load_rules_files([Path("bad.rules")], cache=False)


def test_policy_error_carries_its_position() -> None:
    with pytest.raises(PolicyError) as caught:
        load('\n\n  prefix_rule(["a"], "x")'.replace("  ", ""), "p.rules")
    error = caught.value
    assert (error.path, error.line, error.column, error.reason) == (
        "p.rules",
        3,
        1,
        "invalid decision: x",
    )
