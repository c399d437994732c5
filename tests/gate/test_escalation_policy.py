"""PolicyEscalation: from policy decision to action, judged over every name an exec has."""

from __future__ import annotations

import os
from pathlib import Path

from execgate.gate.escalation import PolicyEscalation, Verdict
from execgate.gate.identity import open_path
from execgate.gate.program import GatedExec, lookup_folders, paths_that_decide
from execgate.policy import load_rules_files


def escalation_for(tmp_path: Path, rules: str) -> PolicyEscalation:
    path = tmp_path / "t.rules"
    path.write_text(rules)
    policy = load_rules_files([path])
    return PolicyEscalation(lambda: policy)


def exec_of(path: Path, *args: str) -> GatedExec:
    """The exec as the server sees it: the file and its #! chain read from the files."""
    opened = open_path(str(path), str(path.parent))
    for fd in opened.fds:
        os.close(fd)
    file = opened.file
    return GatedExec(
        path=str(path), realpath=file.realpath, dev=file.dev, ino=file.ino,
        argv=(path.name, *args), cwd=str(path.parent), interpreters=opened.interpreters,
        pid=1, ppid=1, via="execve",
    )  # fmt: skip


def test_decisions_map_to_actions(tmp_path: Path) -> None:
    escalation = escalation_for(
        tmp_path,
        'prefix_rule(["true"], "allow")\n'
        'prefix_rule(["false"], "forbidden", justification="never")\n'
        'prefix_rule(["cat"], "prompt")\n',
    )
    true, false, cat, ls = (Path(f"/usr/bin/{n}") for n in ("true", "false", "cat", "ls"))
    assert escalation.decide(exec_of(true), confined=True).verdict == Verdict.ESCALATE
    assert escalation.decide(exec_of(true), confined=False).verdict == Verdict.RUN
    denied = escalation.decide(exec_of(false), confined=True)
    assert denied.verdict == Verdict.DENY and denied.reason.startswith("never (rule ")
    assert escalation.decide(exec_of(cat), confined=True).verdict == Verdict.ASK
    assert escalation.decide(exec_of(ls), confined=True).verdict == Verdict.RUN


def test_a_changed_interpreter_is_judged_again(tmp_path: Path) -> None:
    """Judgements are cached, but never those that depend on files that can change."""
    escalation = escalation_for(tmp_path, 'prefix_rule(["false"], "forbidden")\n')
    inner = tmp_path / "inner.sh"
    inner.write_text("#!/usr/bin/true\n")
    script = tmp_path / "s.sh"
    script.write_text(f"#!{inner}\n")
    for f in (inner, script):
        f.chmod(0o755)
    assert escalation.decide(exec_of(script), confined=False).verdict == Verdict.RUN
    inner.write_text("#!/usr/bin/false\n")  # the nested interpreter is now forbidden
    assert escalation.decide(exec_of(script), confined=False).verdict == Verdict.DENY


def test_a_new_policy_is_not_answered_from_the_cache(tmp_path: Path) -> None:
    rules = tmp_path / "t.rules"
    rules.write_text('prefix_rule(["true", "x"], "allow")\n')
    current = [load_rules_files([rules])]
    escalation = PolicyEscalation(lambda: current[0])
    request = exec_of(Path("/usr/bin/true"), "x")
    assert escalation.decide(request, confined=True).verdict == Verdict.ESCALATE
    rules.write_text('prefix_rule(["true", "x"], "forbidden")\n')
    current[0] = load_rules_files([rules])
    assert escalation.decide(request, confined=True).verdict == Verdict.DENY


def test_lookup_folders_follow_every_link(tmp_path: Path) -> None:
    """The folders a lookup reads: each symlink followed (relative, absolute, ``..``), so a
    path through a link in a folder someone can write is known to be theirs to re-point."""
    real = Path(os.path.realpath(tmp_path))
    (real / "a" / "b").mkdir(parents=True)
    (real / "a" / "b" / "f").touch()
    (real / "ws").mkdir()
    os.symlink("../a/b", real / "ws" / "rel")
    os.symlink(real / "ws" / "rel", real / "abs")
    found = lookup_folders(f"{real}/abs/./f")
    assert found[: len(real.parts)] == [
        str(Path(*real.parts[:i])) for i in range(1, len(real.parts) + 1)
    ]
    assert found[len(real.parts) :] == [str(real / "ws"), str(real / "a"), str(real / "a" / "b")]
    assert lookup_folders(f"{real}/missing/x")[-1] == str(real)  # nothing below is read
    os.symlink("loop", real / "loop")
    assert lookup_folders(f"{real}/loop/x")[-1] == str(real)  # ELOOP: no further


def test_paths_that_decide_name_every_file_that_runs(tmp_path: Path) -> None:
    real = Path(os.path.realpath(tmp_path))
    script = real / "s.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    decided = paths_that_decide(exec_of(script))
    assert decided[0] == str(script) and os.path.realpath("/bin/sh") in decided
    assert str(real) in decided  # the interpreter reads the script by its name
    loader = exec_of(Path("/lib64/ld-linux-x86-64.so.2"), "--inhibit-cache", str(script))
    ld_so = os.path.realpath("/lib64/ld-linux-x86-64.so.2")
    assert paths_that_decide(loader) == [ld_so, str(script), *lookup_folders(str(script))]
    assert "" in paths_that_decide(exec_of(Path("/lib64/ld-linux-x86-64.so.2"), "no-such"))
    assert paths_that_decide(exec_of(Path("/usr/bin/true"))) == [os.path.realpath("/usr/bin/true")]
