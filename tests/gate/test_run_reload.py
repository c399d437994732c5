"""``execgate run`` reloads rules files changed during the run, as ``execgate mcp`` does; an
edit that does not load keeps the previous rules and the terminal is told why."""

from __future__ import annotations

import subprocess

from .conftest import EXECGATE, Gate

SCRIPT = """
other first && echo phase1
while [ ! -e go1 ]; do sleep 0.05; done
i=0
while other probe >/dev/null 2>&1 && [ $i -lt 600 ]; do i=$((i+1)); sleep 0.05; done
echo phase2 tries=$i
while [ ! -e go2 ]; do sleep 0.05; done
other third; echo rc3=$?
"""


def _line_with(stream: subprocess.Popen[bytes], text: bytes) -> bytes:
    """Read lines until one contains ``text`` (the child's own bounds end the wait)."""
    assert stream.stdout is not None
    seen = b""
    for line in stream.stdout:
        seen += line
        if text in line:
            return line
    raise AssertionError(f"no {text!r} in {seen!r}")


def test_run_reloads_changed_rules_and_keeps_them_on_a_broken_edit(gate: Gate) -> None:
    gate.write_rules('prefix_rule(["nothing-here"], "prompt")\n')
    process = subprocess.Popen(
        [*EXECGATE, "run", "--rules", str(gate.rules), "--", "bash", "-c", SCRIPT],
        env=gate.env,
        cwd=gate.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        _line_with(process, b"phase1")  # the first rules: `other` runs
        gate.write_rules('prefix_rule(["other"], "forbidden", justification="not now")\n')
        (gate.root / "go1").touch()
        _line_with(process, b"execgate: rules reloaded")
        tries = _line_with(process, b"phase2 tries=")
        assert int(tries.split(b"=")[1]) < 600  # denied before the script gave up
        gate.write_rules('prefix_rule(["other"], "allow"\n')  # does not parse
        warning = _line_with(process, b"rules changed but cannot be used")
        assert b"keeping the previous rules: " + str(gate.rules).encode() + b":" in warning
        (gate.root / "go2").touch()
        _line_with(process, b"execgate: denied: other third: not now")
        assert _line_with(process, b"rc3=").strip() == b"rc3=126"  # the old rules still hold
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        process.wait()
