"""Properties (hypothesis): strictness is monotone, the index agrees with a plain scan,
file order never changes a decision, the cache and the quoting round-trip."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from execgate.policy import Decision, Policy, PrefixRule, SourceLocation
from execgate.policy.cache import _decode, _encode, cache_key
from execgate.policy.codex_text import shlex_join, shlex_split
from execgate.policy.evaluate import program_basename, resolve_program_path
from execgate.policy.language import ExampleCheck, FileRules

TOKENS = ["git", "ls", "a", "b", "-x", "", "é", "push", "status"]
PROGRAM_TOKENS = [*TOKENS, "/usr/bin/git", "./ls", "/opt/a", "~/b", "bin/a"]

token = st.sampled_from(TOKENS)
decision = st.sampled_from(list(Decision))
alternatives = st.lists(token, min_size=1, max_size=3).map(tuple)
prefix_rules = st.builds(
    PrefixRule,
    program=token,
    rest=st.lists(alternatives, max_size=3).map(tuple),
    decision=decision,
    justification=st.one_of(st.none(), st.sampled_from(["why", "because"])),
)
host_maps = st.dictionaries(
    st.sampled_from(["git", "ls", "a", "b"]),
    st.lists(st.sampled_from(["/usr/bin/git", "/opt/a", "/bin/ls", "/cwd/b"]), max_size=2).map(
        tuple
    ),
    max_size=2,
)
commands = st.lists(st.sampled_from(PROGRAM_TOKENS), min_size=1, max_size=1).flatmap(
    lambda head: st.lists(token, max_size=4).map(lambda rest: head + rest)
)

FAST = settings(max_examples=300, deadline=None)


def naive_matches(
    rules: list[PrefixRule], hosts: dict[str, tuple[str, ...]], command: list[str], resolve: bool
) -> list[tuple[tuple[str, ...], Decision, str | None, str | None]]:
    """Codex's semantics spelled out as a scan of every rule, no index."""

    def scan(
        program: str, resolved: str | None
    ) -> list[tuple[tuple[str, ...], Decision, str | None, str | None]]:
        found = []
        for rule in rules:
            n = len(rule.rest) + 1
            if rule.program != program or len(command) < n:
                continue
            if all(command[i] in rule.rest[i - 1] for i in range(1, n)):
                found.append(
                    ((program, *command[1:n]), rule.decision, rule.justification, resolved)
                )
        return found

    found = scan(command[0], None)
    if found or not resolve:
        return found
    path = resolve_program_path(command[0], "/cwd")
    name = program_basename(path)
    if name is None or (name in hosts and path not in hosts[name]):
        return []
    return scan(name, path)


def decision_of(policy: Policy, command: list[str], resolve: bool) -> Decision | None:
    return policy.evaluate(command, cwd="/cwd", resolve_host_executables=resolve).decision


@given(st.lists(prefix_rules, max_size=12), host_maps, commands, st.booleans())
@FAST
def test_index_agrees_with_a_plain_scan(
    rules: list[PrefixRule], hosts: dict[str, tuple[str, ...]], command: list[str], resolve: bool
) -> None:
    policy = Policy(tuple(rules), host_executables=hosts)
    got = policy.evaluate(command, cwd="/cwd", resolve_host_executables=resolve)
    assert [
        (m.matched_prefix, m.decision, m.justification, m.resolved_program) for m in got.matches
    ] == naive_matches(rules, hosts, command, resolve)


@given(st.lists(prefix_rules, max_size=10), prefix_rules, host_maps, commands, st.booleans())
@FAST
def test_adding_a_rule_never_relaxes_a_decision(
    rules: list[PrefixRule],
    extra: PrefixRule,
    hosts: dict[str, tuple[str, ...]],
    command: list[str],
    resolve: bool,
) -> None:
    before = decision_of(Policy(tuple(rules), host_executables=hosts), command, resolve)
    after = decision_of(Policy((*rules, extra), host_executables=hosts), command, resolve)
    if before is not None:
        assert after is not None and after >= before
    if after is not None and before is not None and after != before:
        assert extra.decision == after


@given(st.lists(st.lists(prefix_rules, max_size=5), min_size=1, max_size=4), commands, st.data())
@FAST
def test_file_order_changes_the_listing_never_the_decision(
    files: list[list[PrefixRule]], command: list[str], data: st.DataObject
) -> None:
    order = data.draw(st.permutations(range(len(files))))
    forward = Policy(tuple(rule for rules in files for rule in rules))
    shuffled = Policy(tuple(rule for i in order for rule in files[i]))
    a = forward.evaluate(command, cwd="/cwd")
    b = shuffled.evaluate(command, cwd="/cwd")
    assert a.decision == b.decision
    assert sorted(map(repr, a.matches)) == sorted(map(repr, b.matches))


@given(st.lists(prefix_rules, max_size=6), commands)
@FAST
def test_requirements_appended_last_only_tighten(
    rules: list[PrefixRule], command: list[str]
) -> None:
    tightening = PrefixRule(command[0], (), Decision.PROMPT)
    before = decision_of(Policy(tuple(rules)), command, False)
    after = decision_of(Policy(tuple(rules)).extended([tightening]), command, False)
    assert after is not None and after >= Decision.PROMPT
    assert before is None or after >= before


words = st.lists(
    st.text(
        alphabet=st.characters(blacklist_characters="\0", blacklist_categories=["Cs"]), max_size=6
    ),
    min_size=1,
    max_size=5,
)


@given(words)
@FAST
def test_shell_quoting_round_trips(parts: list[str]) -> None:
    joined = shlex_join(parts)
    assert joined is not None
    assert shlex_split(joined) == parts


@given(st.lists(prefix_rules, max_size=6), host_maps, st.data())
@FAST
def test_cache_encoding_round_trips(
    rules: list[PrefixRule], hosts: dict[str, tuple[str, ...]], data: st.DataObject
) -> None:
    located = [
        PrefixRule(r.program, r.rest, r.decision, r.justification, r.canonical_matching,
                   SourceLocation("f.rules", i + 1, 1))
        for i, r in enumerate(rules)
    ]  # fmt: skip
    checks = []
    if located:
        index = data.draw(st.integers(0, len(located) - 1))
        checks.append(
            ExampleCheck((index,), (("a", "b"),), (("c",),), SourceLocation("f.rules", 9, 3))
        )
    original = FileRules("f.rules", located, [], list(hosts.items()), checks)
    key = cache_key("f.rules", "text")
    assert _decode(_encode(key, original), key, "f.rules") == original
