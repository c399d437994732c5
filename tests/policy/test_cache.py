"""The compiled-policy cache: used when the text is unchanged, ignored when it cannot be
trusted (corrupt, stale, for another file or version)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import execgate.policy.cache as cache_module
import execgate.policy.loader as loader
from execgate.policy import Decision, load_rules_files
from execgate.policy.cache import RulesCache, cache_key

from .conftest import Env

if TYPE_CHECKING:
    from conftest import UnprivilegedUser

TEXT = """
prefix_rule(["git", ["status", "diff"]], justification = "read-only", match = ["git status"])
prefix_rule(["rm", "-rf"], "forbidden")
host_executable(name = "git", paths = ["/usr/bin/git"])
network_rule(host = "example.com", protocol = "https", decision = "deny")
"""


@pytest.fixture
def store(env: Env) -> RulesCache:
    return RulesCache(env.execgate_home / "cache" / "policy")


def no_starlark(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(text: str, identifier: str) -> None:
        raise AssertionError("Starlark ran although the cache should have answered")

    monkeypatch.setattr(loader, "evaluate_rules_text", fail)


def test_warm_load_comes_from_the_cache(
    env: Env, store: RulesCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = env.write("p.rules", TEXT)
    cold = load_rules_files([path], cache=store)
    assert len(list(store.directory.glob("*.json"))) == 1
    no_starlark(monkeypatch)
    warm = load_rules_files([path], cache=store)
    assert warm.rules == cold.rules
    assert warm.network_rules == cold.network_rules
    assert dict(warm.host_executables) == dict(cold.host_executables)
    assert warm.evaluate(["git", "diff"]).decision is Decision.ALLOW
    assert str(warm.rules[0].source) == f"{path}:2:1"


def test_edited_file_is_evaluated_again(env: Env, store: RulesCache) -> None:
    path = env.write("p.rules", TEXT)
    load_rules_files([path], cache=store)
    path.write_text(TEXT.replace('"forbidden"', '"prompt"'))
    assert load_rules_files([path], cache=store).evaluate(["rm", "-rf"]).decision is Decision.PROMPT


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: b"\x00garbage",
        lambda data: data[: len(data) // 2],
        lambda data: json.dumps({**json.loads(data), "key": "0" * 64}).encode(),
        lambda data: json.dumps({**json.loads(data), "format": 999}).encode(),
        lambda data: json.dumps(
            {**json.loads(data), "rules": [["git", "not a list", "allow", None, False, 1, 1]]}
        ).encode(),
        lambda data: json.dumps(
            {**json.loads(data), "rules": [["git", [], "maybe", None, False, 1, 1]]}
        ).encode(),
        lambda data: json.dumps({**json.loads(data), "examples": [[[99], [], [], 1, 1]]}).encode(),
        lambda data: json.dumps({**json.loads(data), "identifier": "other.rules"}).encode(),
    ],
)
def test_damaged_entries_are_ignored(env: Env, store: RulesCache, damage: object) -> None:
    path = env.write("p.rules", TEXT)
    load_rules_files([path], cache=store)
    (entry,) = store.directory.glob("*.json")
    entry.write_bytes(damage(entry.read_bytes()))  # type: ignore[operator]
    policy = load_rules_files([path], cache=store)
    assert policy.evaluate(["rm", "-rf", "/"]).decision is Decision.FORBIDDEN
    assert len(policy.rules) == 2


def test_key_covers_version_name_and_text(monkeypatch: pytest.MonkeyPatch) -> None:
    key = cache_key("a.rules", "x")
    assert key != cache_key("b.rules", "x")
    assert key != cache_key("a.rules", "y")
    monkeypatch.setattr(cache_module, "__version__", "999")
    assert key != cache_key("a.rules", "x")


def test_example_failures_are_still_reported_from_the_cache(env: Env, store: RulesCache) -> None:
    first = env.write("hosts.rules", 'host_executable(name = "git", paths = ["/opt/git"])\n')
    second = env.write("p.rules", 'prefix_rule(["git"], not_match = ["/usr/bin/git x"])\n')
    load_rules_files([first, second], cache=store)  # passes: /usr/bin/git is not /opt/git
    from execgate.policy import PolicyError

    with pytest.raises(PolicyError, match="not_match example `/usr/bin/git x` matches"):
        load_rules_files([second], cache=store)  # same cached entry, different context


def test_small_files_are_cached_too(env: Env) -> None:
    """A one-rule file from the cache spares loading the Starlark engine at all."""
    path = env.write("p.rules", TEXT)
    store = RulesCache(env.execgate_home / "cache" / "policy")
    load_rules_files([path], cache=store)
    assert len(list(store.directory.glob("*.json"))) == 1


def test_unwritable_cache_only_costs_time(env: Env) -> None:
    path = env.write("p.rules", TEXT)
    blocker = env.write("blocker", "not a folder")
    store = RulesCache(Path(blocker) / "cache")
    assert (
        load_rules_files([path], cache=store).evaluate(["rm", "-rf"]).decision is Decision.FORBIDDEN
    )


def test_old_entries_are_pruned(
    env: Env, store: RulesCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache_module, "MAX_ENTRIES", 3)
    for i in range(6):
        path = env.write(f"p{i}.rules", TEXT)
        load_rules_files([path], cache=store)
    assert len(list(store.directory.glob("*.json"))) == 3


def test_no_cache_environment_switch(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXECGATE_NO_CACHE", "1")
    assert loader.default_cache() is None


def test_files_the_user_cannot_write_are_never_cached(
    env: Env, store: RulesCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admin's file must not be replaceable through the user's cache folder."""
    path = env.write("admin.rules", TEXT)
    monkeypatch.setattr(loader.os, "access", lambda p, mode: False)
    load_rules_files([path], cache=store)
    assert not store.directory.exists()


# A start-up in a fresh interpreter: the layered policy (the built-in rules and a big user
# file), whether it was answered without running (or even importing) Starlark, and a decision.
_START_UP = """
import sys
from pathlib import Path
from execgate.policy import load_layered_policy
loaded = load_layered_policy(Path.cwd())
print(loaded.policy.evaluate(["rm", "-rf", "/"]).decision.value, "starlark" in sys.modules)
"""


def _big_rules() -> str:
    """Over the caching threshold, with rules of its own to tell it was loaded."""
    lines = [f'prefix_rule(["tool{i}", "run"], "prompt")' for i in range(400)]
    return "\n".join(lines) + "\n"


def test_warm_start_imports_no_starlark(env: Env) -> None:
    """The second start-up takes every file from the cache: Starlark is never imported (the
    built-in rules included, wherever the package is installed)."""
    (env.execgate_home / "rules").mkdir()
    env.write(env.execgate_home / "rules" / "big.rules", _big_rules())
    run_env = {**os.environ, "HOME": str(env.root / "home")}
    runs = [
        subprocess.run(
            [sys.executable, "-c", _START_UP], env=run_env, cwd=env.work, capture_output=True,
            text=True, check=True,
        ).stdout
        for _ in range(2)
    ]  # fmt: skip
    assert runs == ["forbidden True\n", "forbidden False\n"]


def test_warm_start_imports_no_starlark_as_a_user(unprivileged: UnprivilegedUser) -> None:
    """As an ordinary user, whose package folder (and built-in rules) is root's: the user's
    own cache still answers the second start-up."""
    home = unprivileged.make_dir()  # a fresh $EXECGATE_HOME: nothing cached yet
    rules = home / "rules"
    rules.mkdir()
    (rules / "big.rules").write_text(_big_rules())
    unprivileged.chown_tree(home)
    empty = unprivileged.make_dir()
    extra = {"EXECGATE_HOME": str(home), "CODEX_HOME": str(empty)}
    runs = []
    for _ in range(2):
        result = unprivileged.run([sys.executable, "-c", _START_UP], env=extra)
        assert result.returncode == 0, result.stderr
        runs.append(result.stdout.decode())
    assert runs == ["forbidden True\n", "forbidden False\n"]
