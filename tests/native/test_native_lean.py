"""What every gated process pays for the interposer (docs/architecture.md, "What every gated
process pays"): its exec path calls nothing outside the library, and loading it binds only the
few symbols its constructor and data need."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from .gateserver import encode_snapshot
from .support import Gate

#: What libexecgate.so may bind: at load its data references (no function: the constructor calls
#: nothing in libc); libc's fork under its other name, in a process that forks (bash, once:
#: its children inherit the binding); and errno, which an exec that fails (the denial below)
#: sets for its caller. Anything else was bound by a gated exec.
ALLOWED = {
    "__fork",
    "__errno_location",
    "environ",
    "__environ",
    "_r_debug",
    "__cxa_finalize",
    "_ITM_deregisterTMCloneTable",
    "_ITM_registerTMCloneTable",
    "__gmon_start__",
}

BINDING = re.compile(rb"binding file (\S+) \[\d+\] to \S+ \[\d+\]: normal symbol `([^']+)'")


def test_a_gated_exec_binds_no_symbol(gate: Gate, tmp_path: Path) -> None:
    """Execs decided from the snapshot and execs the server decides, from forked children of
    bash and of dash: the loader reports (LD_DEBUG=bindings, one file per process) no symbol the
    interposer binds beyond those it binds at load."""
    gate.server.write_snapshot(encode_snapshot([b"forbidden"]))
    program = Path(shutil.copy("/bin/true", gate.work / "plain-true"))  # one link: no ask
    debug = tmp_path / "ld"
    env = dict(gate.env, LD_DEBUG="bindings", LD_DEBUG_OUTPUT=str(debug))
    script = f"{program}; {program} x; allowed y; forbidden z; dash -c '{program}; echo ok'"
    r = gate.run(["bash", "-c", script], env=env)
    assert r.stdout == b"allowed:y\nok\n", r.stderr
    assert not gate.forbidden_ran()
    bound: dict[str, set[str]] = {}
    files = list(tmp_path.glob("ld.*"))
    assert len(files) >= 5  # bash, plain-true twice, the script's sh, dash, ...
    for file in files:
        for obj, symbol in BINDING.findall(file.read_bytes()):
            if obj.endswith(b"/libexecgate.so"):
                bound.setdefault(symbol.decode(), set()).add(file.name)
    assert "environ" in bound  # the loader did report the interposer's bindings
    assert set(bound) <= ALLOWED, {s: f for s, f in bound.items() if s not in ALLOWED}


def test_a_shell_maps_the_snapshot_before_it_forks_so_its_children_do_not(gate: Gate) -> None:
    """The interposed fork: once bash has forked (for its first program), bash itself has the
    snapshot mapped, and a newer snapshot (the policy changed) is mapped at the next fork; its
    children inherit the mapping instead of each mapping and validating the file again."""
    gate.server.write_snapshot(encode_snapshot([b"forbidden"]))
    program = Path(shutil.copy("/bin/true", gate.work / "plain-true"))  # one link: no ask
    snap = str(gate.server.snap_path)
    script = (
        f"grep -c '{snap}' /proc/$$/maps; {program}; grep -c '{snap}' /proc/$$/maps; "
        f"cp {snap}.next {snap}; {program}; grep -c '{snap}' /proc/$$/maps; :"
    )  # (the `:`: bash would exec the last grep in its own place)
    Path(f"{snap}.next").write_bytes(encode_snapshot([b"forbidden", b"other"]))
    r = gate.run(["bash", "-c", script])
    # (the first grep is already forked: bash mapped it before that fork)
    assert r.stdout.split() == [b"1", b"1", b"2"], r.stdout
    assert not gate.forbidden_ran()
