"""`execgate run` gates every exec, however it is reached: a forbidden program never runs.

Each case tries to start the forbidden `marker` program (a compiled ELF that leaves a trace
file when it runs) one way; the same binary under the name `other` is not forbidden and must
run, with its argv intact.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from .conftest import EXECGATE, Gate

PY = "/usr/bin/python3"

# name -> bash script trying to run `marker` ($BIN is the folder holding it).
BYPASS_ATTEMPTS = {
    "path lookup": "marker",
    "absolute path": "$BIN/marker",
    "relative path": "cd $BIN && ./marker",
    "dot-dot path": "$BIN/../bin/marker",
    "double slashes": "$BIN//marker",
    "PATH override": "PATH=$BIN marker",
    "subshell": "(marker)",
    "pipeline": "echo x | marker | cat",
    "command substitution": "echo $(marker)",
    "eval": "eval marker",
    "function": "f() { marker; }; f",
    "alias": "shopt -s expand_aliases\nalias m=marker\nm",
    "exec": "exec marker",
    "exec -a": "exec -a innocent marker",
    "background job": "marker & wait",
    "env": "env marker",
    "env -i": "env -i $BIN/marker",
    "env -i sh": "env -i /bin/sh -c $BIN/marker",
    "unset LD_PRELOAD": "unset LD_PRELOAD; marker",
    "scrubbed gate variables": (
        "unset LD_PRELOAD EXECGATE_SOCKET EXECGATE_TOKEN; export LD_PRELOAD=; sh -c marker"
    ),
    "forged socket variable": "EXECGATE_SOCKET=/nonexistent sh -c marker",
    "xargs": "echo arg | xargs marker",
    "xargs -P": "printf 'a\\nb\\nc\\n' | xargs -n1 -P3 marker",
    "find -exec ;": "find $BIN -name marker -exec {} \\;",
    "find -exec +": "find $BIN -name marker -exec {} +",
    "nohup": "nohup marker",
    "timeout": "timeout 30 marker",
    "dash": "dash -c marker",
    "sh -c": "sh -c 'marker'",
    "bash -c nested": "bash -c 'bash -c marker'",
    "bash script": "printf '#!/bin/bash\\nmarker\\n' > s.sh; chmod +x s.sh; ./s.sh",
    "dash script": "printf '#!/bin/dash\\nmarker\\n' > s.sh; chmod +x s.sh; ./s.sh",
    "script without shebang": "printf 'marker\\n' > s.sh; chmod +x s.sh; ./s.sh",
    "marker as shebang interpreter": "printf '#!'$BIN'/marker\\n' > s.sh; chmod +x s.sh; ./s.sh",
    "interpreter that is itself a script": (
        "printf '#!'$BIN'/marker\\n' > i.sh; chmod +x i.sh;"
        " printf '#!'$PWD'/i.sh\\n' > s.sh; chmod +x s.sh; ./s.sh"
    ),
    "make recipe": "printf 'all:\\n\\tmarker\\n' > Makefile; make -s",
    "python subprocess": f"{PY} -c 'import subprocess; subprocess.run([\"marker\"])'",
    "python subprocess shell": (
        f"{PY} -c 'import subprocess; subprocess.run(\"marker\", shell=True)'"
    ),
    "python os.system": f"{PY} -c 'import os; os.system(\"marker\")'",
    "python os.execv": f"{PY} -c 'import os; os.execv(\"'$BIN'/marker\", [\"marker\"])'",
    "python posix_spawn": (
        f"{PY} -c 'import os; os.waitpid(os.posix_spawn(\"'$BIN'/marker\", [\"m\"], {{}}), 0)'"
    ),
    "perl system": "perl -e 'system(\"marker\")'",
    "perl exec with fake argv0": "perl -e 'exec {\"'$BIN'/marker\"} \"innocent\"'",
    "symlink to it": "ln -s $BIN/marker alias && ./alias",
    "symlinked folder": "ln -s $BIN d && d/marker",
    "hard link": "ln $BIN/marker hardlink && ./hardlink",
    "dynamic loader": "/lib64/ld-linux-x86-64.so.2 $BIN/marker",
    "dynamic loader with options": "/lib64/ld-linux-x86-64.so.2 --inhibit-cache $BIN/marker",
}


@pytest.mark.parametrize("sandbox", ["off", "workspace-write"])
@pytest.mark.parametrize("attempt", list(BYPASS_ATTEMPTS), ids=list(BYPASS_ATTEMPTS))
def test_forbidden_program_never_runs(gate: Gate, attempt: str, sandbox: str) -> None:
    script = "BIN=" + shlex.quote(str(gate.bin)) + "\n" + BYPASS_ATTEMPTS[attempt]
    result = gate.run(script, cwd=gate.root, options=["--sandbox", sandbox])
    assert not gate.ran("marker"), result.stderr.decode()
    for name in ("innocent", "alias", "hardlink", "m"):
        assert not gate.ran(name), f"ran as {name}: {result.stderr.decode()}"
    if attempt == "hard link" and sandbox != "off":
        # Inside a sandbox the program's path is its stand-in's bind mount (docs/sandbox.md,
        # "The exec backstop"): no link to it can even be made.
        assert b"Invalid cross-device link" in result.stderr
        return
    assert b"execgate: denied:" in result.stderr
    assert b"marker must not run" in result.stderr


def test_allowed_program_gets_exact_argv_and_exit_status(gate: Gate) -> None:
    result = gate.run(["other", "", "a b", "-x", "é"])
    assert result.returncode == 0
    assert result.stdout == " a b -x é\n".encode()
    assert gate.ran("other")
    result = gate.run("sh -c 'exit 7'; echo rc=$?; exit 5")
    assert result.stdout == b"rc=7\n"
    assert result.returncode == 5


def test_denied_exec_fails_like_a_permission_error(gate: Gate) -> None:
    result = gate.run("marker; echo bash=$?; dash -c marker; echo dash=$?")
    assert b"bash=126\n" in result.stdout
    assert b"dash=126\n" in result.stdout
    denials = [line for line in result.stderr.splitlines() if line.startswith(b"execgate: denied:")]
    assert (
        denials
        == [b"execgate: denied: marker: marker must not run (rule %s:1)" % bytes(gate.rules)] * 2
    )
    assert not gate.ran()


def test_python_sees_permission_error(gate: Gate) -> None:
    code = (
        "import subprocess\n"
        "try:\n    subprocess.run(['marker'])\n"
        "except PermissionError as e:\n    print('PermissionError', e.errno)\n"
    )
    result = gate.run([PY, "-c", code])
    assert result.stdout == b"PermissionError 13\n"


def test_the_command_itself_is_gated(gate: Gate) -> None:
    result = gate.run(["marker", "x"])
    assert result.returncode == 126
    assert not gate.ran()
    assert result.stderr.startswith(b"execgate: denied: marker x: marker must not run")


@pytest.mark.parametrize("sandbox", ["off", "workspace-write"])
def test_a_script_as_the_command_runs_as_its_interpreters_would_run_it(
    gate: Gate, sandbox: str
) -> None:
    """The session's own command runs from the descriptors that were judged: a script as its
    last ``#!`` interpreter's descriptor, with the argv binfmt_script would give it (each level
    puts its interpreter and argument before the script's name)."""
    show = gate.root / "show.sh"
    show.write_text('#!/bin/sh\nprintf "<%s>" "$0" "$@"; echo\n')
    outer = gate.root / "outer"
    outer.write_text(f"#!{show} -x\n")
    for script in (show, outer):
        script.chmod(0o755)
    result = gate.run(["./outer", "a b", "c"], options=["--sandbox", sandbox])
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"<{show}><-x><{outer}><a b><c>\n".encode()


def test_missing_command(gate: Gate) -> None:
    result = gate.run(["no-such-program-here"])
    assert result.returncode == 127
    assert b"no-such-program-here: command not found" in result.stderr


def test_default_policy_applies_without_rules_files(gate: Gate) -> None:
    result = gate.run("mkfs.ext4 -V; echo rc=$?", rules=False)
    assert b"rc=126" in result.stdout
    assert b"execgate: denied: mkfs.ext4 -V:" in result.stderr


def test_a_copy_under_another_name_is_the_program_it_copies(gate: Gate) -> None:
    """A renamed copy is judged by its content (issue 10); a changed copy is another program
    (it runs), which strict-exec's allowlist stops as it stops any file outside it."""
    script = (
        f"cp {gate.bin}/marker ./copied && ./copied; echo rc=$?; "
        f"cp {gate.bin}/marker ./changed && printf 'x' >> ./changed && ./changed; echo rc=$?"
    )
    result = gate.run(script)
    assert result.stdout.startswith(b"rc=126\n") and result.stdout.endswith(b"rc=0\n"), result
    assert b"execgate: denied: ./copied: marker must not run" in result.stderr
    assert not gate.ran("copied") and gate.ran("changed")
    (gate.traces / "ran-changed").unlink()
    result = gate.run(script, options=["--sandbox", "workspace-write", "--strict-exec"])
    assert result.stdout.count(b"rc=126") == 2, result
    assert not gate.ran("copied") and not gate.ran("changed")


def test_prompt_without_terminal_is_denied_with_how_to_allow(gate: Gate) -> None:
    gate.write_rules('prefix_rule(["other", "push"], "prompt", justification="publishes")\n')
    # setsid: a new session has no controlling terminal, so there is nobody to ask.
    command = [*EXECGATE, "run", "--rules", str(gate.rules), "--", "bash", "-c"]
    result = subprocess.run(
        ["setsid", "-w", *command, "other push; echo rc=$?"],
        env=gate.env,
        cwd=gate.root,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert b"rc=126" in result.stdout
    assert not gate.ran("other")
    assert b"execgate: denied: other push: publishes; there is no terminal to ask" in result.stderr
    assert b'prefix_rule(pattern=["other", "push"], decision="allow")' in result.stderr


def test_on_prompt_deny(gate: Gate) -> None:
    gate.write_rules('prefix_rule(["other"], "prompt")\n')
    result = gate.run("other; echo rc=$?", options=["--on-prompt", "deny"])
    assert b"rc=126" in result.stdout
    assert b"prompts are set to deny" in result.stderr


def test_no_session_files_are_left_behind(gate: Gate, tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    result = gate.run("other; marker; true", env={"XDG_RUNTIME_DIR": str(runtime)})
    assert b"execgate: denied: marker" in result.stderr
    # The folder session folders are made in stays (every sandbox keeps it read-only; were it
    # removed, a sandbox's read-only mount on it would go with it), empty.
    folder = runtime / f"execgate-sessions-{os.getuid()}"
    assert list(runtime.iterdir()) == [folder]
    assert list(folder.iterdir()) == []
