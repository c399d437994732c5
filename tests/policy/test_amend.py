"""Appending "always allow" rules the way Codex does."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from execgate.policy import Decision, PolicyError, append_allow_rule, load_rules_files
from execgate.policy.amend import APPEND_LIMIT, allow_rule_line

from .conftest import Env


def test_creates_folder_and_file(env: Env) -> None:
    target = env.work / "rules" / "default.rules"
    assert append_allow_rule(target, ["echo", "Hello, world!"]) is True
    assert (
        target.read_text() == 'prefix_rule(pattern=["echo", "Hello, world!"], decision="allow")\n'
    )


def test_skips_a_line_already_present(env: Env) -> None:
    target = env.write("default.rules", 'prefix_rule(pattern=["ls"], decision="allow")\r\n')
    assert append_allow_rule(target, ["ls"]) is False
    assert append_allow_rule(target, ["ls", "-l"]) is True
    assert append_allow_rule(target, ["ls", "-l"]) is False
    assert target.read_text().count("prefix_rule") == 2


def test_adds_a_missing_final_newline(env: Env) -> None:
    target = env.write("default.rules", 'prefix_rule(pattern=["ls"], decision="allow")')
    append_allow_rule(target, ["echo", "hi"])
    assert target.read_text() == (
        'prefix_rule(pattern=["ls"], decision="allow")\n'
        'prefix_rule(pattern=["echo", "hi"], decision="allow")\n'
    )


def test_tokens_are_json_escaped_and_load_back(env: Env) -> None:
    target = env.work / "default.rules"
    tokens = ['say "hi"', "back\\slash", "tab\there", "é", "$(x)"]
    append_allow_rule(target, tokens)
    policy = load_rules_files([target], cache=False)
    assert policy.evaluate([*tokens, "more"]).decision is Decision.ALLOW


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ([], "prefix rule requires at least one token"),
        (["git", " "], "prefix rule tokens cannot be empty or whitespace-only"),
        ([""], "prefix rule tokens cannot be empty or whitespace-only"),
    ],
)
def test_rejects_empty_tokens(tokens: list[str], message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        allow_rule_line(tokens)


def test_refuses_files_over_64_mib(env: Env) -> None:
    target = env.work / "huge.rules"
    with open(target, "wb") as handle:
        handle.truncate(APPEND_LIMIT + 1)  # sparse: no 64 MiB actually written
    with pytest.raises(PolicyError, match="policy file exceeds the 64 MiB append limit"):
        append_allow_rule(target, ["ls"])
    assert os.path.getsize(target) == APPEND_LIMIT + 1


def test_concurrent_appends_of_the_same_rule_write_it_once(env: Env) -> None:
    target = env.work / "default.rules"
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda: results.append(append_allow_rule(target, ["make"])))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results.count(True) == 1
    assert target.read_text().count("\n") == 1


def test_unwritable_location_is_a_one_line_error(env: Env) -> None:
    blocker = env.write("file", "x")
    with pytest.raises(PolicyError, match=r"^failed to open policy file"):
        append_allow_rule(Path(blocker) / "x.rules", ["ls"])
