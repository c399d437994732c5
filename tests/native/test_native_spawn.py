"""posix_spawn of a program the snapshot lets run: the interposer spawns the judged descriptor
itself (native/spawn.c), with no wrapper in between, and the child finds exactly what glibc's
posix_spawn would have given it (protocol §3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .gateserver import encode_snapshot
from .support import Gate, copy_binary, marker

CASES = [
    "plain", "dup2", "dup2-same", "open", "close", "chdir", "fchdir", "closefrom", "signals",
    "sigmask-full", "parent-mask", "pgroup", "setsid", "resetids", "tcsetpgrp", "open-missing",
    "chdir-missing", "not-executable", "path",
]  # fmt: skip
HOSTILE = ["hostile-dup2", "hostile-open", "hostile-close"]


@pytest.fixture
def spawning(gate: Gate, cprog) -> Gate:  # type: ignore[no-untyped-def]
    """The gate with a snapshot that names only `forbidden`, and execgate-wrapper replaced by
    a shim that notes every start in work/wrapper.log."""
    gate.server.write_snapshot(encode_snapshot([b"forbidden"]))
    probe = cprog("spawnprobe")
    copy_binary(str(probe), gate.bin / "spawnprobe")  # one link: hard links always ask
    gate.env.update(
        EXECGATE_WRAPPER=str(cprog("wrapshim", "-static")),
        SHIM_REAL=str(gate.native["wrapper"]),
        SHIM_LOG=str(gate.work / "wrapper.log"),
        EVIL=str(marker(gate.work, "evil", 'echo PWNED > "$2"')),
    )
    return gate


def probe(gate: Gate, case: str, env: dict[str, str]) -> tuple[bytes, str]:
    report = gate.work / f"report-{case}"
    report.unlink(missing_ok=True)
    r = gate.run([str(gate.bin / "spawnprobe"), case, str(report)], env=env, stdin=None)
    assert r.returncode == 0, r.stderr
    return r.stdout, report.read_text() if report.exists() else "(no report)"


def plain_env(gate: Gate) -> dict[str, str]:
    return {k: v for k, v in gate.env.items() if k != "LD_PRELOAD"}


def wrapper_starts(gate: Gate) -> list[str]:
    log = gate.work / "wrapper.log"
    return log.read_text().split() if log.exists() else []


@pytest.mark.parametrize("case", CASES + HOSTILE)
def test_the_child_finds_what_glibc_would_give_it(spawning: Gate, case: str) -> None:
    plain = probe(spawning, case, plain_env(spawning))
    gated = probe(spawning, case, spawning.env)
    assert gated == plain
    assert "PWNED" not in gated[1]
    assert wrapper_starts(spawning) == []  # decided in the caller: no wrapper, no request
    assert spawning.server.requests == []


def test_the_hostile_cases_aim_at_the_gates_descriptor(spawning: Gate) -> None:
    """The hostile cases can fail: glibc's own posix_spawn, handed the gate's descriptor number
    by path (/proc/self/fd/N), runs EVIL after those file actions."""
    env = plain_env(spawning)
    out, report = probe(spawning, "hostile-dup2", dict(env, SPAWNPROBE_BY_FD="1"))
    assert "PWNED" in report, (out, report)


def test_a_program_the_snapshot_names_still_goes_to_the_wrapper(spawning: Gate, cprog) -> None:  # type: ignore[no-untyped-def]
    r = spawning.run([cprog("entry"), "posix_spawn", str(spawning.bin / "forbidden")])
    assert r.returncode == 126 and b"denied" in r.stderr, r  # the wrapper's denial
    assert not spawning.forbidden_ran()
    assert wrapper_starts(spawning) == ["execgate-via-posix_spawn"]
    assert [q.via for q in spawning.server.requests] == ["posix_spawn"]


def test_a_script_goes_to_the_wrapper(spawning: Gate, cprog) -> None:  # type: ignore[no-untyped-def]
    """Scripts always ask (the snapshot cannot follow their interpreters)."""
    r = spawning.run([cprog("entry"), "posix_spawn", str(spawning.bin / "allowed")])
    assert r.returncode == 0 and r.stdout == b"allowed:\n", r
    assert wrapper_starts(spawning) == ["execgate-via-posix_spawn"]


def test_a_failed_file_action_tries_no_other_path_entry(spawning: Gate, tmp_path: Path) -> None:
    """posix_spawnp: a child that failed is the answer (glibc runs the file actions once);
    the next PATH entry with the same name is not spawned."""
    second = tmp_path / "second"
    second.mkdir()
    copy_binary(str(spawning.bin / "spawnprobe"), second / "spawnprobe")
    env = dict(spawning.env, PATH=f"{spawning.bin}:{second}:/usr/bin:/bin")
    out, report = probe(spawning, "open-missing", env)
    assert out == b"posix_spawn ENOENT status -1\n" and report == "(no report)"


def test_a_full_descriptor_table_fails_the_spawn_as_emfile(spawning: Gate) -> None:
    """The judged descriptor needs a number no file action names; with none free (the table
    full to its limit) the spawn fails with EMFILE: it runs nothing else. (glibc, needing no
    descriptor of its own, starts the child, whose loader then fails: a known difference.)"""
    out, report = probe(spawning, "table-full", spawning.env)
    assert out == b"posix_spawn EMFILE status -1\n" and report == "(no report)"
