"""Layers: default, system, user, project (trusted), Codex folders; discovery; trust."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from execgate.config import Config
from execgate.policy import (
    Decision,
    PolicyError,
    is_trusted,
    load_layered_policy,
    project_root,
    trust_project,
    trusted_projects,
    untrust_project,
)
from execgate.policy.layers import default_rules_path, rules_files_in

from .conftest import Env


def rule(program: str, decision: str = "allow") -> str:
    return f'prefix_rule(["{program}"], "{decision}")\n'


def layered(env: Env, cwd: Path | None = None, **config: bool) -> list[tuple[str, str]]:
    """The loaded sources above the built-in default (which is always there: see below)."""
    loaded = load_layered_policy(cwd or env.work, config=Config(**config))
    return [(s.layer, s.path.name) for s in loaded.sources if s.layer != "default"]


def test_default_stays_beside_other_rules_until_turned_off(env: Env) -> None:
    loaded = load_layered_policy(env.work)
    assert [s.layer for s in loaded.sources] == ["default"]
    assert loaded.policy.evaluate(["rm", "-rf", "/"]).decision is Decision.FORBIDDEN
    # Codex writes a rules file on "don't ask again": the built-in protection stays.
    env.write(env.codex_home / "rules" / "default.rules", rule("make"))
    loaded = load_layered_policy(env.work)
    assert [s.layer for s in loaded.sources] == ["default", "user"]
    assert loaded.policy.evaluate(["rm", "-rf", "/"]).decision is Decision.FORBIDDEN
    loaded = load_layered_policy(env.work, config=Config(default_policy=False))
    assert [s.layer for s in loaded.sources] == ["user"]
    assert loaded.policy.evaluate(["rm", "-rf", "/"]).decision is None


def test_a_file_without_prefix_rules_keeps_the_default(env: Env) -> None:
    env.write(
        env.execgate_home / "rules" / "hosts.rules", 'host_executable(name = "x", paths = [])\n'
    )
    assert [s.layer for s in load_layered_policy(env.work).sources] == ["default", "user"]


def test_default_protects_the_home_directory(env: Env) -> None:
    policy = load_layered_policy(env.work).policy
    assert policy.evaluate(["rm", "-rf", str(env.home)]).decision is Decision.FORBIDDEN
    assert policy.evaluate(["rm", "-rf", f"{env.home}/"]).decision is Decision.FORBIDDEN


def test_layer_order_and_codex_folders(env: Env) -> None:
    repo = env.work / "repo"
    (repo / ".git").mkdir(parents=True)
    env.write(env.system / "rules" / "s.rules", rule("s"))
    env.write(env.codex_system / "rules" / "cs.rules", rule("cs"))
    env.write(env.execgate_home / "rules" / "u.rules", rule("u"))
    env.write(env.codex_home / "rules" / "cu.rules", rule("cu"))
    env.write(repo / ".execgate" / "rules" / "p.rules", rule("p"))
    env.write(repo / ".codex" / "rules" / "cp.rules", rule("cp"))
    trust_project(repo)
    assert layered(env, repo) == [
        ("system", "s.rules"),
        ("system", "cs.rules"),
        ("user", "u.rules"),
        ("user", "cu.rules"),
        ("project", "p.rules"),
        ("project", "cp.rules"),
    ]
    assert layered(env, repo, import_codex_rules=False) == [
        ("system", "s.rules"),
        ("user", "u.rules"),
        ("project", "p.rules"),
    ]


def test_project_rules_need_trust(env: Env) -> None:
    repo = env.work / "repo"
    (repo / ".git").mkdir(parents=True)
    env.write(repo / ".execgate" / "rules" / "p.rules", rule("deploy", "forbidden"))
    assert not is_trusted(repo)
    assert load_layered_policy(repo).policy.evaluate(["deploy"]).decision is None
    assert trust_project(repo) is True
    assert trust_project(repo) is False
    assert not is_trusted(repo / "sub" / "dir")  # the folder itself, not what lies below
    assert trusted_projects() == [repo.resolve()]
    assert load_layered_policy(repo).policy.evaluate(["deploy"]).decision is Decision.FORBIDDEN
    assert untrust_project(repo) is True
    assert untrust_project(repo) is False
    assert load_layered_policy(repo).policy.evaluate(["deploy"]).decision is None


def test_project_dirs_run_from_the_repository_root_down(env: Env) -> None:
    repo = env.work / "repo"
    env.write(repo / ".git", "gitdir: elsewhere\n")  # worktrees have a .git file
    deep = repo / "a" / "b"
    deep.mkdir(parents=True)
    for directory, name in ((repo, "root"), (repo / "a", "mid"), (deep, "deep")):
        env.write(directory / ".execgate" / "rules" / f"{name}.rules", rule(name))
    env.write(env.work / ".execgate" / "rules" / "outside.rules", rule("outside"))
    trust_project(env.work)  # a folder above the repository: nothing below it is read
    assert [layer for layer in layered(env, deep) if layer[0] == "project"] == []
    trust_project(repo)
    trust_project(deep)
    # Only folders on the trust list themselves: "mid" lies below a trusted folder, where a
    # sandboxed session could have created it.
    assert layered(env, deep) == [("project", "root.rules"), ("project", "deep.rules")]
    assert project_root(deep) == repo.resolve()


def test_outside_a_repository_only_the_working_directory(env: Env) -> None:
    sub = env.work / "sub"
    env.write(env.work / ".execgate" / "rules" / "up.rules", rule("up"))
    env.write(sub / ".execgate" / "rules" / "here.rules", rule("here"))
    trust_project(env.work)
    # sub lies below the trusted folder but is not trusted itself
    assert [layer for layer in layered(env, sub) if layer[0] == "project"] == []
    trust_project(sub)
    assert layered(env, sub) == [("project", "here.rules")]


def test_home_as_project_is_not_loaded_twice(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXECGATE_HOME", str(env.home / ".execgate"))
    env.write(env.home / ".execgate" / "rules" / "u.rules", rule("u"))
    trust_project(env.home)
    assert layered(env, env.home) == [("user", "u.rules")]


def test_codex_discovery_rules(env: Env) -> None:
    folder = env.execgate_home / "rules"
    env.write(folder / "b.rules", rule("b"))
    env.write(folder / "a.rules", rule("a"))
    env.write(folder / "notes.txt", "not rules")
    env.write(folder / ".rules", rule("hidden"))
    env.write(folder / "sub" / "deep.rules", rule("deep"))
    (folder / "dir.rules").mkdir()
    os.symlink(folder / "a.rules", folder / "link.rules")
    assert [p.name for p in rules_files_in(folder)] == ["a.rules", "b.rules"]
    assert rules_files_in(env.work / "missing") == []


def test_a_broken_file_stops_loading(env: Env) -> None:
    env.write(env.execgate_home / "rules" / "ok.rules", rule("ok"))
    bad = env.write(env.codex_home / "rules" / "bad.rules", 'prefix_rule(["x"], "maybe")\n')
    with pytest.raises(PolicyError) as caught:
        load_layered_policy(env.work)
    assert str(caught.value) == (
        f"{bad}:1:1: invalid decision: maybe (valid decisions: allow, prompt, forbidden)"
    )


def test_watch_paths_cover_files_and_folders(env: Env) -> None:
    user_file = env.write(env.execgate_home / "rules" / "u.rules", rule("u"))
    loaded = load_layered_policy(env.work)
    watched = set(loaded.watch_paths)
    assert user_file in watched
    assert env.execgate_home / "rules" in watched
    assert env.system / "rules" in watched  # absent folders too: creating one means reload
    assert env.codex_home / "rules" in watched
    assert env.system / "requirements.toml" in watched
    assert env.execgate_home / "config.toml" in watched
    assert env.execgate_home / "trusted-projects.toml" in watched


def test_host_executables_merge_across_layers(env: Env) -> None:
    env.write(
        env.system / "rules" / "s.rules",
        'host_executable(name = "git", paths = ["/a/git"])\n' + rule("git"),
    )
    env.write(
        env.execgate_home / "rules" / "u.rules",
        'host_executable(name = "git", paths = ["/b/git"])\n',
    )
    policy = load_layered_policy(env.work).policy
    assert policy.host_executables == {"git": ("/b/git",)}


def test_config_file_turns_codex_import_off(env: Env) -> None:
    env.write(env.codex_home / "rules" / "c.rules", rule("codex-only", "forbidden"))
    assert (
        load_layered_policy(env.work).policy.evaluate(["codex-only"]).decision is Decision.FORBIDDEN
    )
    env.write(env.execgate_home / "config.toml", "import_codex_rules = false\n")
    assert load_layered_policy(env.work).policy.evaluate(["codex-only"]).decision is None


def test_trust_file_errors_are_reported(env: Env) -> None:
    env.write(env.execgate_home / "trusted-projects.toml", "trusted = 3\n")
    with pytest.raises(PolicyError, match="`trusted` must be a list of paths"):
        load_layered_policy(env.work)


def test_default_rules_ship_with_the_package() -> None:
    assert default_rules_path().is_file()
