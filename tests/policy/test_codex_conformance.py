"""Differential tests: ``execgate check`` against the real ``codex execpolicy check`` 0.169.0.

Random rules files (alternatives, every decision, justifications, examples, host_executable,
network_rule, duplicates, positional and keyword calls, rules made in loops and functions) and
random commands (plain tokens, absolute, relative and ``~`` program paths) are run through both;
stdout and exit status must be identical, with and without ``--resolve-host-executables``, for
one to three files given as relative or absolute paths. Error cases compare the exit status, the
error message and its file:line:col.

Skipped when the Codex binary is not installed (``.ci/run`` installs it with npm).
"""

# ruff: noqa: E501  (rules texts and Codex's messages are quoted verbatim)

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from execgate.policy.codex_text import shlex_join

from .conftest import Env, clean_environ_for, run_cli

REPO = Path(__file__).resolve().parents[2]
CODEX = Path(
    os.environ.get(
        "EXECGATE_CODEX_BIN",
        REPO
        / ".ci/node/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex",
    )
)

pytestmark = pytest.mark.skipif(
    not CODEX.is_file(), reason=f"Codex 0.169.0 is not installed at {CODEX} (see .ci/run)"
)

HYPOTHESIS = settings(
    max_examples=int(os.environ.get("EXECGATE_CONFORMANCE_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)

# Small alphabets, so that rules and commands collide often.
PROGRAMS = ["git", "ls", "rm", "npm", "a", "tool.sh", "é", "x y", "", "-x", "~", "."]
ARGS = [
    "status",
    "push",
    "-rf",
    "/",
    "--",
    "",
    " ",
    "a",
    "b",
    "é",
    "x y",
    "it's",
    "--force",
    "$HOME",
]
JUSTIFICATIONS = ["read-only", 'say "no"', "multi\nline", "é ok", "  padded  ", "$(x) `y`"]


def path_forms(program: str) -> list[str]:
    return [
        f"/usr/bin/{program}",
        f"/opt/{program}",
        f"./{program}",
        f"bin/{program}",
        f"~/{program}",
        f"/usr/bin/../bin/{program}",
        f"//usr//bin//{program}",
        f"../{program}",
        f"/usr/bin/{program}/.",
    ]


def lit(value: object) -> str:
    """A Starlark literal (JSON is a subset of Starlark for strings and lists)."""
    return json.dumps(value, ensure_ascii=False)


@dataclass
class Rule:
    pattern: list[str | list[str]]
    decision: str | None
    justification: str | None
    style: str  # keyword | positional | def | loop
    matches: list[list[str]]
    not_matches: list[list[str]]
    canonical: bool | None


def instantiate(pattern: Sequence[str | list[str]], pick: int) -> list[str]:
    return [tok if isinstance(tok, str) else tok[pick % len(tok)] for tok in pattern]


def example_literal(example: list[str], as_string: bool) -> str:
    joined = shlex_join(example) if as_string else None
    return lit(joined) if joined is not None and joined.strip() else lit(example)


def render_rule(rule: Rule, as_strings: bool) -> str:
    args: list[str] = []
    keyword = rule.style != "positional"
    if keyword:
        args.append(f"pattern = {lit(rule.pattern)}")
        if rule.decision is not None:
            args.append(f"decision = {lit(rule.decision)}")
        if rule.justification is not None:
            args.append(f"justification = {lit(rule.justification)}")
        if rule.matches:
            items = ", ".join(example_literal(e, as_strings) for e in rule.matches)
            args.append(f"match = [{items}]")
        if rule.not_matches:
            items = ", ".join(example_literal(e, as_strings) for e in rule.not_matches)
            args.append(f"not_match = [{items}]")
        if rule.canonical is not None:
            args.append(f"canonical_matching = {rule.canonical}")
    else:
        args = [lit(rule.pattern), lit(rule.decision or "allow")]
        if rule.matches or rule.not_matches or rule.justification is not None:
            args.append("[" + ", ".join(example_literal(e, as_strings) for e in rule.matches) + "]")
            args.append(
                "[" + ", ".join(example_literal(e, as_strings) for e in rule.not_matches) + "]"
            )
            if rule.justification is not None:
                args.append(lit(rule.justification))
    call = "prefix_rule(" + ", ".join(args) + ")"
    if rule.style == "def":
        return f"def _make():\n    {call}\n_make()"
    if rule.style == "loop":
        return f"for _i in range(1):\n    {call}"
    return call


tokens = st.sampled_from(ARGS + PROGRAMS)
alternatives = st.lists(tokens, min_size=1, max_size=3)
pattern_tokens = st.one_of(tokens, alternatives)


@st.composite
def rules(draw: st.DrawFn) -> Rule:
    first = draw(
        st.one_of(
            st.sampled_from(PROGRAMS), st.lists(st.sampled_from(PROGRAMS), min_size=1, max_size=3)
        )
    )
    rest = draw(st.lists(pattern_tokens, max_size=3))
    pattern: list[str | list[str]] = [first, *rest]
    matches: list[list[str]] = []
    not_matches: list[list[str]] = []
    if draw(st.booleans()):
        for pick in draw(st.lists(st.integers(0, 2), max_size=2)):
            example = instantiate(pattern, pick) + draw(st.lists(tokens, max_size=1))
            if all(tok.strip() for tok in example[:1]) and "/" not in example[0]:
                matches.append(example)
        if draw(st.booleans()):
            not_matches.append(["zz-none", *draw(st.lists(tokens, max_size=2))])
    return Rule(
        pattern=pattern,
        decision=draw(st.sampled_from([None, "allow", "prompt", "forbidden"])),
        justification=draw(st.one_of(st.none(), st.sampled_from(JUSTIFICATIONS))),
        style=draw(st.sampled_from(["keyword", "keyword", "positional", "def", "loop"])),
        matches=matches,
        not_matches=not_matches,
        canonical=draw(st.sampled_from([None, None, True, False])),
    )


@st.composite
def host_executables(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(["git", "ls", "rm", "npm", "a", "tool.sh", "é"]))
    paths = draw(
        st.lists(
            st.sampled_from(
                [f"/usr/bin/{name}", f"/opt/{name}", f"/usr/bin/../bin/{name}", f"/bin/{name}"]
            ),
            max_size=3,
        )
    )
    return f"host_executable(name = {lit(name)}, paths = {lit(paths)})"


network_rules = st.builds(
    lambda host, protocol, decision: (
        f"network_rule(host = {lit(host)}, protocol = {lit(protocol)}, decision = {lit(decision)})"
    ),
    st.sampled_from(["example.com", "API.Example.com.", "[::1]:8080", "host:443", " x.org "]),
    st.sampled_from(["http", "https", "https_connect", "http-connect", "socks5_tcp", "socks5_udp"]),
    st.sampled_from(["allow", "prompt", "forbidden", "deny"]),
)


@st.composite
def rules_files(draw: st.DrawFn) -> tuple[str, list[Rule]]:
    drawn = draw(st.lists(rules(), min_size=1, max_size=6))
    as_strings = draw(st.booleans())
    parts = [render_rule(rule, as_strings) for rule in drawn]
    if draw(st.booleans()):  # the same rule twice is listed twice
        parts.append(parts[0])
    parts += draw(st.lists(host_executables(), max_size=2))
    parts += draw(st.lists(network_rules, max_size=1))
    order = draw(st.permutations(range(len(parts))))
    text = "# generated\n" + "\n".join(parts[i] for i in order) + "\n"
    return text, drawn


@st.composite
def commands(draw: st.DrawFn, drawn: list[Rule]) -> list[str]:
    kind = draw(st.sampled_from(["instance", "path", "path", "random"]))
    if kind == "random":
        return draw(st.lists(tokens, min_size=1, max_size=4))
    rule = draw(st.sampled_from(drawn))
    command = instantiate(rule.pattern, draw(st.integers(0, 2)))
    if draw(st.booleans()):
        command = command[: draw(st.integers(1, len(command)))]
    command += draw(st.lists(tokens, max_size=2))
    if kind == "path":
        command[0] = draw(st.sampled_from(path_forms(command[0])))
    return command


def run_codex(
    env: Env, rules_paths: list[str], command: list[str], resolve: bool, pretty: bool = False
) -> tuple[int, str, str]:
    argv = [str(CODEX), "execpolicy", "check"]
    for path in rules_paths:
        argv += ["-r", path]
    if resolve:
        argv.append("--resolve-host-executables")
    if pretty:
        argv.append("--pretty")
    argv += ["--", *command]
    done = subprocess.run(
        argv, cwd=env.work, env=clean_environ_for(env), capture_output=True, text=True, timeout=60
    )
    stderr = "\n".join(
        line for line in done.stderr.splitlines() if not line.startswith("WARNING: proceeding")
    )
    return done.returncode, done.stdout, stderr


def run_ours(
    rules_paths: list[str], command: list[str], resolve: bool, pretty: bool = False
) -> tuple[int, str, str]:
    argv = ["check"]
    for path in rules_paths:
        argv += ["-r", path]
    if resolve:
        argv.append("--resolve-host-executables")
    if pretty:
        argv.append("--pretty")
    result = run_cli(*argv, "--", *command)
    return result.status, result.out, result.err


def write_files(env: Env, texts: list[str], absolute: bool) -> list[str]:
    names = []
    for i, text in enumerate(texts):
        path = env.work / "rules" / f"p{i}.rules"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        names.append(str(path) if absolute else f"rules/p{i}.rules")
    return names


def assert_same(env: Env, names: list[str], cases: Sequence[tuple[list[str], bool, bool]]) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        theirs = list(pool.map(lambda case: run_codex(env, names, *case), cases))
    for (command, resolve, pretty), (rc, out, err) in zip(cases, theirs, strict=True):
        ours = run_ours(names, command, resolve, pretty)
        context = f"command={command!r} resolve={resolve} files={names}\ncodex stderr: {err}"
        if rc == 1:  # the policy failed to load: compare the error instead
            compare_errors(names, (rc, out, err), ours)
            return
        assert (ours[0], ours[1]) == (rc, out), context + f"\nours stderr: {ours[2]}"


@given(data=st.data())
@HYPOTHESIS
def test_random_policies_match_codex(env: Env, data: st.DataObject) -> None:
    files = data.draw(st.lists(rules_files(), min_size=1, max_size=3), label="files")
    names = write_files(env, [text for text, _ in files], absolute=data.draw(st.booleans()))
    drawn = [rule for _, file_rules in files for rule in file_rules]
    cases = [
        (data.draw(commands(drawn), label="command"), resolve, pretty)
        for pretty in (False, False, True)
        for _ in range(2)
        for resolve in (False, True)
    ]
    assert_same(env, names, cases)


EXAMPLE_TOKENS = [
    *ARGS,
    *PROGRAMS,
    "a\tb",
    "^x",
    "a,b",
    "!",
    "{x}",
    "é\u0301",
    "\u200b",
    "/usr/bin/git",
]


@given(data=st.data())
@HYPOTHESIS
def test_random_example_failures_match_codex(env: Env, data: st.DataObject) -> None:
    """Failing match/not_match examples: Codex's messages embed Rust Debug renderings of the
    rules and shell-quoted examples, which must come out byte for byte."""
    rule = data.draw(rules(), label="rule")
    example_tokens = st.lists(st.sampled_from(EXAMPLE_TOKENS), min_size=1, max_size=4)
    if data.draw(st.booleans()):
        rule.matches = data.draw(st.lists(example_tokens, min_size=1, max_size=3), label="match")
        rule.not_matches = []
    else:
        rule.matches = []
        rule.not_matches = [instantiate(rule.pattern, data.draw(st.integers(0, 2)))]
    hosts = data.draw(st.lists(host_executables(), max_size=1), label="hosts")
    text = render_rule(rule, as_strings=False) + "\n" + "\n".join(hosts) + "\n"
    names = write_files(env, [text], absolute=False)
    theirs = run_codex(env, names, ["x"], False)
    ours = run_ours(names, ["x"], False)
    if theirs[0] == 0:
        assert ours[:2] == theirs[:2], ours[2]
    else:
        compare_errors(names, theirs, ours)


def test_worked_examples_match_codex(env: Env) -> None:
    text = """\
prefix_rule(pattern = ["git", ["status", "diff"]], decision = "allow", justification = "read-only git",
            match = [["git", "status"], "git diff --stat"], not_match = ["git push"])
prefix_rule(pattern = ["git", "push"], decision = "prompt")
prefix_rule(pattern = ["git"], decision = "prompt")
prefix_rule(pattern = [["rm", "rmdir"], "-rf"], decision = "forbidden", justification = "no recursive deletes")
prefix_rule(pattern = ["echo"])
host_executable(name = "git", paths = ["/usr/bin/git", "/opt/homebrew/bin/git"])
"""
    names = write_files(env, [text], absolute=False)
    commands_ = [
        ["git", "status"], ["git", "push", "origin"], ["rm", "-rf", "/"], ["ls"],
        ["/usr/bin/echo", "hi"], ["/usr/bin/git", "status"], ["/usr/local/bin/git", "status"],
        [""], ["rmdir", "-rf", "x"], ["./echo"], ["~/echo"], ["echo/"], ["/"], ["."], [".."],
    ]  # fmt: skip
    assert_same(
        env, names, [(c, r, p) for c in commands_ for r in (False, True) for p in (False, True)]
    )


# --- errors ---------------------------------------------------------------------------------

_LOCATION = re.compile(r"^\s*--> (.*):(\d+):(\d+)\s*$", re.MULTILINE)


def codex_error(stderr: str) -> tuple[str, tuple[str, int, int] | None]:
    """(message, location) from Codex's anyhow/starlark error report."""
    text = stderr.split("\nStack backtrace:")[0]
    caused = text.split("Caused by:", 1)[1] if "Caused by:" in text else text
    location = None
    found = _LOCATION.search(caused)
    if found:
        location = (found.group(1), int(found.group(2)), int(found.group(3)))
    for line in caused.splitlines():
        line = line.strip()
        if line.startswith("starlark error: error: "):
            return line[len("starlark error: error: ") :], location
        if line.startswith("error: "):
            return line[len("error: ") :], location
    lines = [line.strip() for line in caused.splitlines() if line.strip()]
    return (lines[0] if lines else ""), location


def _normalize_parse_error(message: str) -> str:
    # starlark-pyo3's parser lists every expected token; Codex's names a category.
    message = message.replace(" here,", ",")
    return message.split(", expected")[0]


def compare_errors(
    names: list[str], theirs: tuple[int, str, str], ours: tuple[int, str, str]
) -> None:
    rc, _, err = theirs
    assert ours[0] == rc == 1, f"codex rc={rc} ours rc={ours[0]}\ncodex: {err}\nours: {ours[2]}"
    message, location = codex_error(err)
    our_line = ours[2].strip().splitlines()[-1]
    assert our_line.startswith("execgate: error: "), ours[2]
    our_message = our_line[len("execgate: error: ") :]
    if location is not None:
        path, line, column = location
        prefix = f"{path}:{line}:{column}: "
        assert our_message.startswith(prefix), f"codex at {prefix!r}; ours: {our_message!r}"
        our_message = our_message[len(prefix) :]
        if message.startswith("Parse error:"):
            message, our_message = (
                _normalize_parse_error(message),
                _normalize_parse_error(our_message),
            )
        assert our_message == message, f"\ncodex: {message}\nours:  {our_message}"
    elif message.startswith(("expected every example", "expected example")):
        # Codex 0.169 gives no location for example failures; we add the call's.
        assert re.match(r"^.*:\d+:\d+: ", our_message), our_message
        assert our_message.split(": ", 1)[1] == message, f"\ncodex: {message}\nours:  {our_message}"
    else:  # read errors: "failed to read policy at X" + cause
        head = err.split("\n", 1)[0].removeprefix("Error: ")
        cause = re.sub(r" \(os error \d+\)$", "", message)
        assert our_message == f"{head}: {cause}", f"\ncodex: {head}: {cause}\nours:  {our_message}"


BAD_FILES = [
    'prefix_rule(pattern = ["git"], decision = "deny")',
    'prefix_rule(pattern = ["git"], decision = "Allow")',
    'prefix_rule(pattern = "git")',
    'prefix_rule(pattern = ["git"], decision = None)',
    'prefix_rule(pattern = ["git"], foo = 1)',
    'prefix_rule(["a"], foo = 1, bar = 2)',
    "prefix_rule()",
    'prefix_rule(["a"], "allow", [], [], "j", False, 7)',
    'prefix_rule(["a"], "allow", justification = "j", pattern = ["b"])',
    'prefix_rule(pattern = ["a"], pattern = ["b"])',
    "prefix_rule(pattern = [])",
    "prefix_rule(pattern = [[]])",
    "prefix_rule(pattern = [1])",
    'prefix_rule(pattern = ["a", ["b", 1]])',
    'prefix_rule(pattern = ["a", [None]])',
    "prefix_rule(pattern = [1.5])",
    'prefix_rule(pattern = [{"a": 1}])',
    'prefix_rule(pattern = ("a",))',
    "prefix_rule(pattern = (1,))",
    pytest.param(
        'prefix_rule(pattern = {"a": [1, (2,), None, True, 1.5]})',
        marks=pytest.mark.xfail(
            strict=True, reason="known: tuples nested in an argument reach Python as lists"
        ),
    ),
    "prefix_rule(pattern = 1e20)",
    "prefix_rule(pattern = 123456789.125)",
    "prefix_rule(pattern = True)",
    'prefix_rule(pattern = "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefg")',
    'prefix_rule(pattern = "é日😀\\u200b\\u00a0\'\\r\\\\\\x1b~\\"→€٣\\u0301")',
    'prefix_rule(pattern = ["a"], justification = "  ")',
    'prefix_rule(pattern = ["a"], justification = 1)',
    'prefix_rule(pattern = ["a"], justification = None)',
    'prefix_rule(pattern = ["a"], canonical_matching = 1)',
    'prefix_rule(pattern = ["a"], match = "a")',
    'prefix_rule(pattern = ["a"], match = ("a",))',
    'prefix_rule(["a"], "prompt", None)',
    'prefix_rule(pattern = ["a"], match = [""])',
    'prefix_rule(pattern = ["a"], match = ["   "])',
    'prefix_rule(pattern = ["a"], match = ["# comment"])',
    'prefix_rule(pattern = ["a"], match = [[]])',
    'prefix_rule(pattern = ["a"], match = [[1]])',
    'prefix_rule(pattern = ["a"], match = [5])',
    'prefix_rule(pattern = ["a"], match = ["a \\"b"])',
    'prefix_rule(pattern = ["a"], match = ["a \'b"])',
    'prefix_rule(pattern = ["a"], match = ["a\\\\"])',
    'prefix_rule(pattern = ["a"], match = [""], not_match = [[]])',
    'prefix_rule(pattern = [], decision = "deny")',
    'prefix_rule(pattern = [], justification = " ")',
    'prefix_rule(pattern = ["a"], match = ["b", "c d", "a"])',
    'prefix_rule(pattern = [["a", "b"], ["c", "d"]], decision = "prompt", justification = "j\\n\\"x\\"", match = ["zz"])',
    'prefix_rule(pattern = ["a", "b"], not_match = ["a b"], match = ["zz"])',
    'prefix_rule(pattern = ["a", ["b", "c"]], decision = "forbidden", justification = "jj", not_match = [["a", "c", "it\'s", "", "x y", "é", "^x", "a,b", "!", "$v", "a\\tb"]])',
    'prefix_rule(pattern = ["git"], not_match = ["/usr/bin/git x"], canonical_matching = True)\nhost_executable(name = "git", paths = ["/usr/bin/git"])',
    'prefix_rule(pattern = ["git"], not_match = ["/usr/bin/git x"])',
    'prefix_rule(pattern = ["a"], match = [["b\\u0000"]])',
    'prefix_rule(pattern = ["a\\u0301", "\\u200b"], match = [["b\\u0301"]])',
    'x = 1\ndef f():\n    prefix_rule(["a"], foo = 1)\nf()',
    'host_executable(name = "git")',
    "host_executable(name = 1, paths = [])",
    'host_executable(name = "git", paths = "x")',
    'host_executable(name = "git", paths = [1])',
    'host_executable(name = "", paths = [])',
    'host_executable(name = "/usr/bin/git", paths = [])',
    'host_executable(name = "a/b", paths = [])',
    'host_executable(name = ".", paths = [])',
    'host_executable(name = "..", paths = [])',
    'host_executable(name = "git", paths = ["bin/git"])',
    'host_executable(name = "git", paths = ["~/bin/git"])',
    'host_executable(name = "git", paths = ["/usr/bin/gitx"])',
    'host_executable(name = "git", paths = ["/"])',
    'host_executable(name = "git", paths = ["/usr/bin/git/.."])',
    'host_executable(name = "GIT", paths = ["/usr/bin/git"])',
    'host_executable(name = "git", paths = [""])',
    'host_executable("git", name = "x")',
    "host_executable(1, [], 3)",
    'network_rule(host = "example.com", protocol = "ftp", decision = "allow")',
    'network_rule(host = "example.com", protocol = "http", decision = "ask")',
    'network_rule(host = "example.com", protocol = "http", decision = "deny", justification = " ")',
    'network_rule(host = "", protocol = "http", decision = "deny")',
    'network_rule(host = "http://x", protocol = "http", decision = "deny")',
    'network_rule(host = "x/y", protocol = "http", decision = "deny")',
    'network_rule(host = "*.x.com", protocol = "http", decision = "deny")',
    'network_rule(host = "a b", protocol = "http", decision = "deny")',
    'network_rule(host = "[::1", protocol = "http", decision = "deny")',
    'network_rule(host = "[::1]x", protocol = "http", decision = "deny")',
    'network_rule(host = "x.com", protocol = "http")',
    'network_rule(host = "", protocol = "ftp", decision = "ask")',
    'network_rule(host = " . ", protocol = "http", decision = "allow")',
    "network_rule(1, 2, 3)",
    'network_rule("x", "http", "allow", None)',
    "unknown_fn()",
    "prefix_rul([])",
    'load("x.star", "a")',
    'x = 1 + "a"',
    "x = [1][3]",
    'fail("boom")',
    "x = struct(a = 1)",
    'x = {"a": 1}["b"]',
    "x = 1 // 0",
    "def f():\n    return f()\nf()",
    "print(1)",
    "\tx = 1",
    "x = 'abc",
    "def f(a, /): pass",
    "x = 1 +",
    "def f(:",
    'prefix_rule(pattern = ["git"]',
    'x: int = "a"',
]


@pytest.mark.parametrize("text", BAD_FILES)
def test_errors_match_codex(env: Env, text: str) -> None:
    names = write_files(env, [text + "\n"], absolute=False)
    theirs = run_codex(env, names, ["x"], False)
    assert theirs[0] == 1, f"codex accepted the file: {theirs}"
    compare_errors(names, theirs, run_ours(names, ["x"], False))


def test_read_errors_match_codex(env: Env) -> None:
    (env.work / "bad.rules").write_bytes(b"\xff\xfe")
    (env.work / "dir.rules").mkdir()
    for names in (["missing.rules"], ["bad.rules"], ["dir.rules"]):
        compare_errors(names, run_codex(env, names, ["x"], False), run_ours(names, ["x"], False))


def test_first_failing_file_is_reported_like_codex(env: Env) -> None:
    good = write_files(env, ['prefix_rule(["a"])\n'], absolute=True)
    bad = env.write("b.rules", 'prefix_rule(["a"], decision = "nope")\n')
    names = [*good, str(bad), "missing.rules"]
    compare_errors(names, run_codex(env, names, ["a"], False), run_ours(names, ["a"], False))


def test_usage_errors_match_codex_status(env: Env) -> None:
    names = write_files(env, ['prefix_rule(["a"])\n'], absolute=False)
    assert run_codex(env, names, [], False)[0] == 2
    assert run_ours(names, [], False)[0] == 2


def test_default_policy_loads_in_codex_and_means_the_same(env: Env) -> None:
    from execgate.policy.layers import default_rules_text

    names = write_files(env, [default_rules_text("/home/alice")], absolute=False)
    cases = [
        "rm -rf /", "rm -r -f /home/alice", "sudo rm -rf /usr", "dd if=/dev/zero of=/dev/sda",
        "mkfs.ext4 /dev/sda1", "git push", "npm publish", "ls -la", "/usr/bin/git status",
        "./ls", "git commit", "chmod -R 777 /",
    ]  # fmt: skip
    assert_same(env, names, [(c.split(), r, False) for c in cases for r in (False, True)])
