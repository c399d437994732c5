"""What ``execgate run`` does before its command's first exec: only what that exec needs. Each
case is the real command line; ``-X importtime`` lists every module the process imported."""

from __future__ import annotations

from cliharness import World

# Not needed to start a command without a proxy, from a warm compiled-policy cache: the other
# command groups, the proxy and the async library it uses, the Starlark evaluator, TOML
# (no config.toml, trust list or requirements file here), the resource reader.
NOT_IMPORTED = (
    "execgate.cli.mcp",
    "execgate.cli.rules",
    "execgate.cli.approvals",
    "execgate.mcp_front",
    "execgate.netproxy.server",
    "execgate.gate.network",
    "anyio",
    "starlark",
    "tomllib",
    "importlib.resources",
)


def imported(stderr: str) -> set[str]:
    return {
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }


def test_run_imports_only_what_its_first_exec_needs(world: World) -> None:
    first = world.run("run", "--", "true")  # fills the compiled-policy cache
    assert first.returncode == 0, first.stderr
    # the slow path (the native front's server runs with -I: no PYTHON* variables)
    slow = {"PYTHONPROFILEIMPORTTIME": "1", "EXECGATE_FAST_START": "0"}
    done = world.run("run", "--", "sh", "-c", "exit 3", env=slow)
    assert done.returncode == 3, done.stderr
    modules = imported(done.stderr)
    assert "execgate.gate.session" in modules  # the listing is real
    assert sorted(m for m in modules if m.startswith(NOT_IMPORTED)) == []


def test_small_rules_files_come_from_the_cache_too(world: World) -> None:
    """A user's one-rule file and a ``--rules`` file of one rule: from a warm cache, the
    server of either session never loads the Starlark engine."""
    user_rules = world.codex_home / "rules"
    user_rules.mkdir(parents=True, exist_ok=True)
    (user_rules / "mine.rules").write_text(
        'prefix_rule(pattern = ["git", "push"], decision = "prompt")\n'
    )
    chosen = world.work / "chosen.rules"
    chosen.write_text('prefix_rule(pattern = ["npm", "publish"], decision = "forbidden")\n')
    slow = {"PYTHONPROFILEIMPORTTIME": "1", "EXECGATE_FAST_START": "0"}
    for options in ((), ("--rules", str(chosen))):
        first = world.run("run", *options, "--", "true")  # fills the compiled-policy cache
        assert first.returncode == 0, first.stderr
        done = world.run("run", *options, "--", "sh", "-c", "exit 3", env=slow)
        assert done.returncode == 3, done.stderr
        modules = imported(done.stderr)
        assert "execgate.gate.session" in modules  # the listing is real
        assert "starlark" not in modules, options


def test_run_still_judges_its_own_command(world: World) -> None:
    """The start-up diet leaves the first process's judgement in place: the built-in policy
    still denies the session's own command, from the cache as from the rules."""
    for _ in range(2):
        done = world.run("run", "--", "rm", "-rf", "/")
        assert done.returncode == 126, done.stderr
        assert "execgate: denied: rm -rf /" in done.stderr
