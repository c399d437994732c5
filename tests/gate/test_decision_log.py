"""The always-on decision log, written by real `execgate run` sessions and read back by
`execgate log`, `execgate log verify|replay` and `execgate rules suggest`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from .conftest import EXECGATE, Gate
from .test_run_terminal import Terminal


def _log(gate: Gate) -> Path:
    return Path(gate.env["EXECGATE_HOME"]) / "log" / "decisions.jsonl"


def _records(gate: Gate) -> list[dict[str, object]]:
    return [json.loads(line) for line in _log(gate).read_text().splitlines()]


def _execgate(
    gate: Gate, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EXECGATE, *args],
        env={**gate.env, **(env or {})},
        cwd=gate.root,
        capture_output=True,
        text=True,
        timeout=60,
    )


SCRIPT = "for i in 1 2 3; do other $i; marker; done; exit 0"


def _concurrent_sessions(gate: Gate, env: dict[str, str], run_as: list[str]) -> None:
    sessions = [
        subprocess.Popen(
            [*run_as, *EXECGATE, "run", "--rules", str(gate.rules), "--", "bash", "-c", SCRIPT],
            env=env,
            cwd=gate.root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for _ in range(8)
    ]
    for session in sessions:
        _, err = session.communicate(timeout=120)
        assert session.returncode == 0, err


def test_concurrent_sessions_write_one_intact_chain(gate: Gate) -> None:
    # `other` is named by a rule that does not match: the server decides it (run)
    gate.write_rules(
        'prefix_rule(["marker"], "forbidden", justification="no markers")\n'
        'prefix_rule(["other", "--never"], "forbidden")\n'
    )
    _concurrent_sessions(gate, gate.env, [])
    verified = _execgate(gate, "log", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "16 " not in verified.stderr and "the chain is intact" in verified.stdout
    records = _records(gate)
    assert len({r["session"] for r in records}) == 8
    for session in {r["session"] for r in records}:
        mine = [r for r in records if r["session"] == session]
        decisions = sorted((str(r["argv"][0]), r["decision"]) for r in mine)  # type: ignore[index]
        assert decisions == [("bash", "run")] + [("marker", "deny")] * 3 + [("other", "run")] * 3
    denied = next(r for r in records if r["decision"] == "deny")
    assert denied["rule"] == f"{gate.rules}:1" and denied["justification"] == "no markers"
    assert denied["source"] == "rule" and denied["front"] == "run"
    assert {"time", "pid", "ppid", "cwd", "program", "sandbox", "prev"} <= denied.keys()


def test_sessions_of_an_unprivileged_user_share_an_intact_log(gate: Gate, unprivileged) -> None:  # type: ignore[no-untyped-def]
    work = unprivileged.make_dir()
    rules = work / "test.rules"
    rules.write_text('prefix_rule(["true", "--never"], "forbidden")\n')
    os.chown(rules, unprivileged.uid, unprivileged.gid)
    home = work / "home"
    env = unprivileged.env({"EXECGATE_HOME": str(home)})
    sessions = [
        subprocess.Popen(
            unprivileged.argv(
                [*EXECGATE, "run", "--rules", str(rules), "--", "bash", "-c", "/bin/true; true"]
            ),
            env=env,
            cwd=work,
            stderr=subprocess.PIPE,
        )
        for _ in range(6)
    ]
    for session in sessions:
        _, err = session.communicate(timeout=120)
        assert session.returncode == 0, err
    verified = unprivileged.run([*EXECGATE, "log", "verify"], env={"EXECGATE_HOME": str(home)})
    assert verified.returncode == 0, verified.stdout + verified.stderr
    log = home / "log" / "decisions.jsonl"
    assert log.stat().st_uid == unprivileged.uid and log.stat().st_mode & 0o077 == 0
    assert len(log.read_text().splitlines()) == 6 * 2


def test_verify_names_a_tampered_line(gate: Gate) -> None:
    gate.run("marker; other; marker")
    lines = _log(gate).read_text().splitlines()
    assert len(lines) >= 3
    lines[1] = lines[1].replace('"deny"', '"run"')
    _log(gate).write_text("\n".join(lines) + "\n")
    verified = _execgate(gate, "log", "verify")
    assert verified.returncode == 1
    assert f"BROKEN at {_log(gate)}:3: does not follow the line before it ({_log(gate)}:2)" in (
        verified.stdout
    )


def test_a_bad_log_path_is_refused_at_start_in_one_line(gate: Gate) -> None:
    (Path(gate.env["EXECGATE_HOME"]) / "log").write_text("a file where the folder goes")
    result = gate.run("marker")
    assert result.returncode == 1
    err = result.stderr.decode()
    assert err == (
        f"execgate: error: cannot write the decision log {_log(gate)}: Not a directory (move it "
        "with XDG_STATE_HOME or EXECGATE_HOME, or turn it off in config.toml: [log] enabled = "
        "false)\n"
    ), err
    assert not gate.ran("marker")
    mcp = _execgate(gate, "mcp", "--rules", str(gate.rules))
    assert mcp.returncode == 1 and mcp.stderr.splitlines()[-1] == err.strip()
    (Path(gate.env["EXECGATE_HOME"]) / "log").unlink()
    audit = gate.run("true", options=["--audit", str(gate.root)])
    assert audit.stderr.decode().startswith("execgate: error: --audit ")
    assert audit.stderr.decode().count("\n") == 1


def test_log_filters_and_json(gate: Gate) -> None:
    gate.write_rules(
        'prefix_rule(["marker"], "forbidden", justification="no markers")\n'
        'prefix_rule(["other", "--never"], "forbidden")\n'
    )
    gate.run("marker one; other two")
    gate.run("other three")
    first, second = dict.fromkeys(str(r["session"]) for r in _records(gate))
    denied = _execgate(gate, "log", "--denied", "--json").stdout.splitlines()
    assert [json.loads(line)["argv"] for line in denied] == [["marker", "one"]]
    shown = _execgate(gate, "log", "--session", second[:6]).stdout.splitlines()
    assert len(shown) == 2 and "other three" in shown[1] and "\x1b" not in shown[1]
    assert "run:" + second[:8] in shown[1]
    grep = _execgate(gate, "log", "--grep", "no markers").stdout.splitlines()
    assert len(grep) == 1 and "marker one" in grep[0] and "deny" in grep[0]
    assert _execgate(gate, "log", "--since", "1h").stdout.count("\n") == 5
    assert _execgate(gate, "log", "--since", "2999-01-01").stdout == ""
    bad = _execgate(gate, "log", "--since", "soon")
    assert bad.returncode == 2 and bad.stderr.startswith("execgate: error: --since soon:")
    assert first != second


def test_replay_under_other_rules_counts_what_would_change(gate: Gate) -> None:
    gate.write_rules(
        'prefix_rule(["marker"], "forbidden")\nprefix_rule(["other", "--never"], "forbidden")\n'
    )
    gate.run("marker a; marker b; other c; other d; other e")
    other_rules = gate.root / "other.rules"
    other_rules.write_text('prefix_rule(["marker"], "allow")\nprefix_rule(["other"], "prompt")\n')
    result = _execgate(gate, "log", "replay", "--rules", str(other_rules))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "replayed 6 decisions: 1 unchanged"  # bash -c itself: no rule either way
    assert "  was run (no rule) → would be prompted: 3" in lines
    assert "  was denied → would be allowed: 2" in lines
    assert any(line.strip() == "1x  marker a" for line in lines)


def test_prompts_answered_at_the_terminal_are_logged_and_suggest_rules(gate: Gate) -> None:
    gate.write_rules('prefix_rule(["other"], "prompt", justification="ask first")\n')
    script = "other push a; other push b; other rm x; echo done"
    term = Terminal(
        [*EXECGATE, "run", "--rules", str(gate.rules), "--", "bash", "-c", script],
        gate.env,
        gate.root,
    )
    for answer in (b"o\n", b"o\n", b"d\n"):
        term.expect(rb"Allow\?")
        term.type(answer)
    term.expect(rb"done")
    assert term.finish() == 0
    prompts = [r for r in _records(gate) if "answer" in r]
    assert [(r["answer"], r["answered_by"], r["decision"]) for r in prompts] == [
        ("once", "terminal", "run"),
        ("once", "terminal", "run"),
        ("deny", "terminal", "deny"),
    ]
    assert prompts[0]["prefix"] == ["other"] and prompts[0]["source"] == "terminal"
    listed = _execgate(gate, "log", "--prompts").stdout.splitlines()
    assert len(listed) == 3 and "[deny by terminal]" in listed[2]
    suggested = _execgate(gate, "rules", "suggest")
    assert suggested.returncode == 0, suggested.stderr
    # the narrowest prefix covering both allowed commands and not `other rm x`
    assert suggested.stdout.splitlines() == [
        "# saves 2 questions, e.g. other push a",
        'prefix_rule(pattern=["other", "push"], decision="allow")',
    ]


def test_log_colours_on_a_terminal_unless_no_color(gate: Gate) -> None:
    gate.run("marker")
    for env, coloured in ((gate.env, True), ({**gate.env, "NO_COLOR": "1"}, False)):
        term = Terminal([*EXECGATE, "log", "--denied"], env, gate.root)
        match = term.expect(rb"[^\n]*deny[^\n]*marker")
        assert term.finish() == 0
        assert (b"\x1b[31m" in match.group(0)) is coloured


def test_grants_are_listed_and_an_always_grant_is_revoked_byte_for_byte(gate: Gate) -> None:
    user_rules = Path(gate.env["EXECGATE_HOME"]) / "rules"
    user_rules.mkdir()
    (user_rules / "mine.rules").write_text(
        'prefix_rule(["other", "push"], "prompt", justification="it publishes")\n'
        'prefix_rule(["other", "pull"], "prompt")\n'
    )
    mine = user_rules / "default.rules"
    # the user's own file, with CRLF lines, a comment and no final newline
    before = b'# mine\r\nprefix_rule(pattern=["other", "keep"], decision="allow")\r\n# end'
    mine.write_bytes(before)
    script = "other push x; other pull y; other pull z; echo rc=$?"
    term = Terminal([*EXECGATE, "run", "--", "bash", "-c", script], gate.env, gate.root)
    term.expect(rb"\[a\]lways")
    term.type(b"a\n")
    term.expect(rb"Allow\?")
    term.type(b"r\n")  # for this run: `other pull z` is not asked
    term.expect(rb"rc=0")
    assert term.finish() == 0
    line = b'prefix_rule(pattern=["other", "push"], decision="allow")'
    assert mine.read_bytes() == before + b"\n" + line + b"\n"
    assert [r.get("source") for r in _records(gate)][-1] == "grant"

    listed = json.loads(_execgate(gate, "approvals", "grants", "--json").stdout)["grants"]
    assert [(g["scope"], g["prefix"], g["answered_by"]) for g in listed] == [
        ("always", ["other", "push"], "terminal"),
        ("session", ["other", "pull"], "terminal"),
    ]
    always, session = listed
    assert always["rule_file"] == str(mine) and always["rule_line_number"] == 4
    assert always["rule_line"] == line.decode()
    shown = _execgate(gate, "approvals", "grants").stdout
    assert f"{mine}:4" in shown and "session run:" in shown

    refused = _execgate(gate, "approvals", "revoke", session["id"])
    assert refused.returncode == 1
    assert "belongs to an `execgate run` session: it ends with that run" in refused.stderr

    revoked = _execgate(gate, "approvals", "revoke", always["id"])
    assert revoked.returncode == 0, revoked.stderr
    assert mine.read_bytes() == before + b"\n"  # only the grant's line is gone
    assert _records(gate)[-1]["kind"] == "revoke"
    again = json.loads(_execgate(gate, "approvals", "grants", "--json").stdout)["grants"]
    assert [g["scope"] for g in again] == ["session"]
    # the grant is gone: `other push` asks again (and, with nobody to ask, is denied)
    result = gate.run("other push; echo rc=$?", rules=False, options=["--on-prompt", "deny"])
    assert result.stdout.endswith(b"rc=126\n")
    assert _execgate(gate, "log", "verify").returncode == 0


def test_a_malformed_request_is_logged_as_a_fail_closed_refusal(gate: Gate) -> None:
    attack = (
        "import os, socket, struct; s = socket.socket(socket.AF_UNIX); "
        "s.connect(os.environ['EXECGATE_SOCKET']); p = b'not a request'; "
        "s.send(struct.pack('<I', len(p)) + p); print('closed', s.recv(10) == b'')"
    )
    result = gate.run(["python3", "-c", attack])
    assert result.stdout == b"closed True\n", result.stderr
    refusal = next(r for r in _records(gate) if r.get("source") == "fail-closed")
    assert refusal["decision"] == "deny"
    assert refusal["reason"] == "malformed request: payload does not end with a NUL"
    assert isinstance(refusal["pid"], int) and refusal["pid"] > 0
    assert _execgate(gate, "log", "verify").returncode == 0


def test_a_sandboxed_process_cannot_touch_the_log_inside_its_workspace(gate: Gate) -> None:
    home = gate.root / "eg-home"  # the log inside the writable workspace
    env = {"EXECGATE_HOME": str(home)}
    gate.run("marker", env=env)
    log = home / "log" / "decisions.jsonl"
    before = log.read_bytes()
    attack = (
        f"echo '{{}}' >> {log}; : > {log}; rm -f {log}; mv {log} {log}.x; "
        f"rm -rf {home}/log; echo tried"
    )
    result = gate.run(attack, env=env, options=["--sandbox", "workspace-write"])
    assert b"tried" in result.stdout, result.stderr
    assert log.read_bytes().startswith(before)  # only execgate appended
    verified = _execgate(gate, "log", "verify", env=env)
    assert verified.returncode == 0, verified.stdout
