"""`execgate check`, `execgate rules list|test|explain|init`, `execgate trust|untrust`."""

from __future__ import annotations

import json
import re

import pytest

from execgate.policy import is_trusted

from .conftest import Env, run_cli

RULES = """\
prefix_rule(["git", "push"], "prompt", justification = "publishes")
prefix_rule(["git"], "allow")
prefix_rule(["rm", "-rf"], "forbidden")
"""


# --- check ----------------------------------------------------------------------------------


def test_check_prints_codex_json_and_exits_0_even_for_forbidden(env: Env) -> None:
    env.write("a.rules", RULES)
    result = run_cli("check", "-r", "a.rules", "rm", "-rf", "/")
    assert result.status == 0
    assert result.out == (
        '{"matchedRules":[{"prefixRuleMatch":{"matchedPrefix":["rm","-rf"],"decision":'
        '"forbidden"}}],"decision":"forbidden"}\n'
    )


def test_check_options(env: Env) -> None:
    env.write("a.rules", RULES)
    env.write("b.rules", 'prefix_rule(["git", "push"], "forbidden")\n')
    result = run_cli(
        "check", "--rules", "b.rules", "-r", "a.rules", "--pretty", "--", "git", "push"
    )
    output = json.loads(result.out)
    assert [m["prefixRuleMatch"]["decision"] for m in output["matchedRules"]] == [
        "forbidden",
        "prompt",
        "allow",
    ]
    assert result.out.startswith('{\n  "matchedRules": [\n')
    resolved = run_cli(
        "check", "-r", "a.rules", "--resolve-host-executables", "/usr/bin/git", "log"
    )
    assert json.loads(resolved.out)["matchedRules"][0]["prefixRuleMatch"]["resolvedProgram"] == (
        "/usr/bin/git"
    )


def test_check_command_may_look_like_options(env: Env) -> None:
    env.write("a.rules", 'prefix_rule(["-r", "x"])\nprefix_rule(["--"])\n')
    assert '"decision":"allow"' in run_cli("check", "-r", "a.rules", "--", "-r", "x").out
    assert '"decision":"allow"' in run_cli("check", "-r", "a.rules", "--", "--", "y").out
    # after the first command token, everything belongs to the command
    assert run_cli("check", "-r", "a.rules", "git", "--pretty").out == '{"matchedRules":[]}\n'


@pytest.mark.parametrize(
    "argv", [["check", "-r", "a.rules"], ["check", "-r", "a.rules", "--"], ["check", "-r"]]
)
def test_check_usage_errors_exit_2(env: Env, argv: list[str]) -> None:
    env.write("a.rules", RULES)
    assert run_cli(*argv).status == 2


def test_check_bad_rules_exit_1_with_one_line(env: Env) -> None:
    env.write("a.rules", 'x = 1\nprefix_rule(["git"], decision = "deny")\n')
    result = run_cli("check", "-r", "a.rules", "git")
    assert result.status == 1
    assert result.out == ""
    assert result.err == "execgate: error: a.rules:2:1: invalid decision: deny\n"
    missing = run_cli("check", "-r", "nope.rules", "git")
    assert (
        missing.err
        == "execgate: error: failed to read policy at nope.rules: No such file or directory\n"
    )


def test_check_without_rules_uses_the_layers(env: Env) -> None:
    assert json.loads(run_cli("check", "--", "rm", "-rf", "/").out)["decision"] == "forbidden"
    env.write(env.execgate_home / "rules" / "u.rules", RULES)
    assert json.loads(run_cli("check", "git", "status").out)["decision"] == "allow"


# --- rules ----------------------------------------------------------------------------------


def test_rules_list_shows_layers_files_and_lines(env: Env) -> None:
    user_file = env.write(env.execgate_home / "rules" / "u.rules", RULES)
    env.write(
        env.system / "rules" / "s.rules",
        'host_executable(name = "git", paths = ["/usr/bin/git"])\n',
    )
    result = run_cli("rules", "list")
    assert result.status == 0
    assert f"user         {env.execgate_home / 'rules'}" in result.out
    assert str(user_file) in result.out
    assert "1:1  prompt     git push  # publishes" in result.out
    assert "3:1  forbidden  rm -rf" in result.out
    assert "git: /usr/bin/git" in result.out
    assert f"system       {env.system / 'rules'}  (no rules files)" not in result.out


def test_rules_list_mentions_untrusted_projects(env: Env) -> None:
    env.write(env.work / ".execgate" / "rules" / "p.rules", RULES)
    assert "not trusted: run `execgate trust" in run_cli("rules", "list").out


def test_rules_list_shows_the_default_when_it_applies(env: Env) -> None:
    out = run_cli("rules", "list").out
    assert "(built in, active: under every other layer" in out
    assert "forbidden  mkfs" in out


def test_rules_test_passes_and_fails(env: Env) -> None:
    env.write(env.execgate_home / "rules" / "ok.rules", 'prefix_rule(["ls"], match = ["ls -l"])\n')
    passed = run_cli("rules", "test")
    assert passed.status == 0
    assert re.search(r"^2 files, \d+ rules, \d+ examples: passed$", passed.out, re.M)
    env.write(env.execgate_home / "rules" / "p.rules", 'prefix_rule(["git"], match = ["hg"])\n')
    env.write(env.execgate_home / "rules" / "q.rules", 'prefix_rule(["x"], "nope")\n')
    failed = run_cli("rules", "test")
    assert failed.status == 1
    assert "p.rules:1:1: match example `hg` does not match this rule (`git`)" in failed.err
    assert "q.rules:1:1: invalid decision: nope (valid decisions: allow, prompt" in failed.err


def test_rules_test_given_files(env: Env) -> None:
    env.write("a.rules", RULES)
    assert run_cli("rules", "test", "-r", "a.rules").status == 0


def test_rules_test_checks_the_default_policy(env: Env) -> None:
    result = run_cli("rules", "test")
    assert result.status == 0
    assert "default" in result.out and "examples: passed" in result.out


def test_rules_explain(env: Env) -> None:
    path = env.write(env.execgate_home / "rules" / "u.rules", RULES)
    out = run_cli("rules", "explain", "--", "/usr/bin/git", "push", "origin").out
    assert "decision: prompt" in out
    assert "reason:   `/usr/bin/git push origin` requires approval: publishes" in out
    assert f"defined at {path}:1:1 (user layer)" in out
    assert "program resolved to /usr/bin/git" in out
    assert "The strictest decision wins" in out
    literal = run_cli("rules", "explain", "--no-resolve-host-executables", "--", "/usr/bin/git").out
    assert "No rule matches" in literal


def test_rules_explain_with_files(env: Env) -> None:
    env.write("a.rules", RULES)
    out = run_cli("rules", "explain", "-r", "a.rules", "git", "status").out
    assert "decision: allow" in out and "a.rules:2:1 (file layer)" in out
    assert "runs outside the sandbox" in out


def test_rules_init_writes_the_default_with_home(env: Env) -> None:
    result = run_cli("rules", "init")
    target = env.execgate_home / "rules" / "default.rules"
    assert result.status == 0 and target.is_file()
    assert f'HOMES = ["{env.home}"]' in target.read_text()
    again = run_cli("rules", "init")
    assert again.status == 1 and "already exists" in again.err
    target.write_text("# my own edits\n" + target.read_text())
    assert run_cli("rules", "init", "--force").status == 0
    (backup,) = target.parent.glob("default.rules.*.bak")
    assert backup.read_text().startswith("# my own edits\n")  # nothing the user wrote is lost
    decision = json.loads(run_cli("check", "rm", "-rf", str(env.home)).out)["decision"]
    assert decision == "forbidden"


def test_rules_without_action_is_a_usage_error(env: Env) -> None:
    assert run_cli("rules").status == 2


# --- trust ----------------------------------------------------------------------------------


def test_trust_and_untrust_default_to_the_repository_root(env: Env) -> None:
    repo = env.work / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "src").mkdir()
    env.write(repo / ".execgate" / "rules" / "p.rules", 'prefix_rule(["deploy"], "forbidden")\n')
    import os

    os.chdir(repo / "src")
    assert json.loads(run_cli("check", "deploy").out) == {"matchedRules": []}
    result = run_cli("trust")
    assert result.status == 0 and str(repo.resolve()) in result.out
    assert is_trusted(repo)
    assert json.loads(run_cli("check", "deploy").out)["decision"] == "forbidden"
    assert "already trusted" in run_cli("trust", str(repo)).out
    assert run_cli("untrust").status == 0
    assert not is_trusted(repo)


def test_trust_rejects_a_missing_directory(env: Env) -> None:
    result = run_cli("trust", "nowhere")
    assert result.status == 1 and "is not a directory" in result.err
