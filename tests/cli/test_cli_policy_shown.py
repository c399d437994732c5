"""The built-in default policy stays in force beside a user's own rules (Codex writes one on
"don't ask again") until config.toml turns it off, and the CLI says which it is; rules files
that do not load or test say so in readable words."""

from __future__ import annotations

import json

from cliharness import World, one_error

FORBIDDEN_ROOT = (
    '{"matchedRules":[{"prefixRuleMatch":{"matchedPrefix":["rm","-rf","/"],'
    '"decision":"forbidden","justification":"recursive delete of /, a system folder or a home '
    'directory"}}],"decision":"forbidden"}'
)


def test_a_codex_rules_file_keeps_the_built_in_policy(world: World) -> None:
    (world.codex_home / "rules").mkdir()
    (world.codex_home / "rules" / "default.rules").write_text(
        'prefix_rule(pattern=["make"], decision="allow")\n'
    )
    assert world.run("check", "--", "rm", "-rf", "/").stdout.strip() == FORBIDDEN_ROOT
    listing = world.run("rules", "list")
    assert "(built in, active: under every other layer" in listing.stdout
    assert "1:1  allow      make" in listing.stdout
    explained = world.run("rules", "explain", "--", "rm", "-rf", "/")
    assert "built-in default policy: active" in explained.stdout
    assert "decision: forbidden" in explained.stdout
    as_json = json.loads(world.run("rules", "list", "--json").stdout)
    assert as_json["default_policy"]["active"] is True
    assert as_json["default_policy"]["rules"], as_json["default_policy"]

    (world.execgate_home / "config.toml").write_text("default_policy = false\n")
    assert world.run("check", "--", "rm", "-rf", "/").stdout.strip() == '{"matchedRules":[]}'
    listing = world.run("rules", "list")
    config = world.execgate_home / "config.toml"
    assert f"(built in, OFF: turned off: default_policy = false in {config})" in listing.stdout
    explained = world.run("rules", "explain", "--json", "--", "rm", "-rf", "/")
    report = json.loads(explained.stdout)
    assert report["default_policy"]["active"] is False
    assert report["decision"] is None and report["matches"] == []


def test_a_typo_in_default_policy_is_an_error(world: World) -> None:
    (world.execgate_home / "config.toml").write_text('default_policy = "no"\n')
    line = one_error(world.run("check", "--", "ls"))
    assert "`default_policy` must be a boolean" in line


def test_explain_json_names_rule_layer_and_prefix(world: World) -> None:
    report = json.loads(world.run("rules", "explain", "--json", "--", "git", "push").stdout)
    assert report["decision"] == "prompt"
    assert report["command"] == ["git", "push"]
    [match] = report["matches"]
    assert match["layer"] == "default" and match["matched_prefix"] == ["git", "push"]
    assert match["source"].split(":")[0].endswith("default.rules")


def test_invalid_decision_lists_the_valid_ones(world: World) -> None:
    bad = world.work / "bad.rules"
    bad.write_text('prefix_rule(["date"], "maybe")\n')
    valid = "invalid decision: maybe (valid decisions: allow, prompt, forbidden)"
    for argv in (["run", "--rules", str(bad), "--", "true"], ["rules", "explain", "-r", str(bad),
                                                              "--", "date"]):  # fmt: skip
        assert one_error(world.run(*argv)).endswith(f"{bad}:1:1: {valid}"), argv
    tested = world.run("rules", "test", "-r", str(bad))
    assert tested.returncode == 1 and valid in tested.stderr
    # `execgate check` keeps Codex's words (`codex execpolicy check` prints the same)
    assert one_error(world.run("check", "-r", str(bad), "--", "date")).endswith(
        f"{bad}:1:1: invalid decision: maybe"
    )


def test_failed_examples_read_as_text(world: World) -> None:
    rules = world.work / "ex.rules"
    rules.write_text(
        'prefix_rule(["git", "push"], "prompt", not_match=["git push origin"])\n'
        'prefix_rule(["git", "pull"], "allow", match=["git fetch", "git  pull"])\n'
    )
    tested = world.run("rules", "test", "-r", str(rules))
    assert tested.returncode == 1
    assert (
        f"{rules}:1:1: not_match example `git push origin` matches this rule "
        "(prefix `git push`, prompt)"
    ) in tested.stderr
    assert "PrefixRule" not in tested.stderr and "Some(" not in tested.stderr
    rules.write_text('prefix_rule(["git", "pull"], "allow", match=["git fetch", "hg pull"])\n')
    tested = world.run("rules", "test", "-r", str(rules))
    assert (
        f"{rules}:1:1: match examples `git fetch`, `hg pull` do not match this rule (`git pull`)"
    ) in tested.stderr
    assert "PrefixRule" not in tested.stderr


def test_wildcard_looking_tokens_are_warned_about(world: World) -> None:
    rules = world.work / "wild.rules"
    rules.write_text(
        'prefix_rule(["git.*"], "allow")\nprefix_rule(["npm", ["*", "ci"]], "allow")\n'
        'prefix_rule(["ls"], "allow")\n'
    )
    tested = world.run("rules", "test", "-r", str(rules))
    assert tested.returncode == 0  # a warning, not a failure: the rules are valid Codex rules
    warnings = [line for line in tested.stderr.splitlines() if "execgate: warning:" in line]
    assert len(warnings) == 2, tested.stderr
    assert f'{rules}:1:1: token "git.*" is matched literally' in warnings[0]
    assert f'{rules}:2:1: token "*" is matched literally' in warnings[1]
    report = json.loads(world.run("rules", "test", "--json", "-r", str(rules)).stdout)
    assert report["passed"] is True and len(report["warnings"]) == 2
    assert report["files"] == [
        {"layer": "file", "path": str(rules), "ok": True, "rules": 3, "examples": 0}
    ]
