"""The kernel exec backstop (docs/sandbox.md "The exec backstop"): inside every sandbox mode,
no route around the interposer runs a program contrary to policy.

Each session performs every route for real — the execve syscall (C, a static binary, ctypes),
execveat on a descriptor, libc's own execv through dlsym, the dynamic loader and a copy of it,
glibc's internal execs (wordexp, __libc_system), a memfd or /proc/self/fd copy, a plain copy,
ptrace rewriting an exec, busybox-static's shell and env — against a `forbidden` marker, in
`execgate run` and `execgate mcp`, in read-only, workspace-write and workspace-write with
strict-exec, as root and as an unprivileged user. The marker never runs; a program a rule names
whose command no rule matches still runs (confined), whichever route started it; and a `prompt`
rule on a static binary asks, then runs or denies as answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcpharness import Elicitations, accept, payload

from .conftest import Attacker

HERE = Path(__file__).resolve().parent
BUSYBOX = shutil.which("busybox")
PROGRAM_C = r"""
#include <stdio.h>
int main(int argc, char **argv) {
    printf("%s ran:", NAME);
    for (int i = 1; i < argc; i++) printf(" %s", argv[i]);
    printf("\n");
    return 0;
}
"""
RULES = """\
prefix_rule(["marker"], "forbidden", justification="marker must not run")
prefix_rule(["okprog", "never"], "forbidden", justification="only this form is forbidden")
prefix_rule(["smarker"], "prompt", justification="smarker needs a human")
"""
SANDBOXES = {
    "read-only": ["--sandbox", "read-only"],
    "workspace-write": ["--sandbox", "workspace-write", "--exclude-tmp"],
    "strict-exec": ["--sandbox", "workspace-write", "--exclude-tmp", "--strict-exec"],
}
# Each route against the forbidden marker, then against okprog (a rule names it, but not this
# command: it must run, confined). $T is the tools folder.
ROUTES = [
    ("interposed", "marker"),
    ("syscall", "$T/backstop syscall $T/marker"),
    ("static", "$T/backstop-static syscall $T/marker"),
    ("ctypes", '/usr/bin/python3 -c "$CTYPES" $T/marker'),
    ("execveat", "$T/backstop execveat $T/marker"),
    ("dlsym", "$T/backstop dlsym $T/marker"),
    ("ldso", "$T/backstop ldso $T/marker"),
    ("ldcopy", "$T/backstop ldcopy $T/marker"),
    ("wordexp", "$T/backstop wordexp $T/marker"),
    ("system", "$T/backstop system $T/marker"),
    ("memfd", "$T/backstop memfd $T/marker"),
    ("procfd", "$T/backstop procfd $T/marker"),
    ("copy", "$T/backstop copy $T/marker"),
    ("ptrace", "$T/backstop ptrace $T/marker"),
    ("busybox-sh", "busybox sh -c '$T/marker'"),
    ("busybox-env", "busybox env marker"),
]
CONTROLS = [
    ("syscall", "$T/backstop syscall $T/okprog fine"),
    ("static", "$T/backstop-static syscall $T/okprog fine"),
    ("busybox-env", "busybox env okprog fine"),
    ("forbidden-form", "$T/backstop-static syscall $T/okprog never"),
]
CTYPES = (
    "import ctypes, os, sys; libc = ctypes.CDLL(None, use_errno=True); "
    "os.environ.pop('LD_PRELOAD', None); p = sys.argv[1].encode(); "
    "argv = (ctypes.c_char_p * 2)(p, None); "
    "env = (ctypes.c_char_p * (len(os.environb) + 1))("
    "*[k + b'=' + v for k, v in os.environb.items()], None); "
    "libc.syscall(59, p, argv, env); print('route ctypes: execve failed')"
)

pytestmark = pytest.mark.skipif(BUSYBOX is None, reason="busybox-static is not installed")


@pytest.fixture(scope="module")
def tools() -> Iterator[Path]:
    """The attack helper (dynamic and static), the marker, okprog and smarker (static), in a
    folder nobody but root can change and everybody can run from."""
    folder = Path(tempfile.mkdtemp(prefix="eg-backstop-"))
    folder.chmod(0o755)
    source = HERE / "c" / "backstop.c"
    cc = ["cc", "-O1", "-o"]
    subprocess.run([*cc, folder / "backstop", source, "-ldl"], check=True)
    subprocess.run([*cc, folder / "backstop-static", source, "-static"], check=True)
    for name, static in (("marker", False), ("okprog", False), ("smarker", True)):
        src = folder / f"{name}.c"
        src.write_text(PROGRAM_C)
        flags = ["-static"] if static else []
        subprocess.run([*cc, folder / name, src, f'-DNAME="{name}"', *flags], check=True)
        src.unlink()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _script(tools: Path) -> str:
    lines = [f"export T={tools}", f"CTYPES={_quote(CTYPES)}"]
    for name, command in ROUTES:
        lines.append(f'{command} 2>&1; echo "== {name} $?"')
    for name, command in CONTROLS:
        lines.append(f'{command} 2>&1; echo "== control {name} $?"')
    # Reading a rule-named program inside yields its stand-in: no copy of the real file.
    lines.append('echo "== head $(head -c 2 $T/marker)"')
    lines.append("echo still-alive")
    return "\n".join(lines)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _prepare(attacker: Attacker, tools: Path) -> dict[str, str]:
    attacker.write_rules(RULES)
    return {**attacker.env, "PATH": f"{tools}:{attacker.env['PATH']}"}


def _options(sandbox: str, tools: Path) -> list[str]:
    options = list(SANDBOXES[sandbox])
    if sandbox == "strict-exec":
        options += ["--exec-dir", str(tools)]
    return options


# Routes on which the server itself judged the marker (the stand-in asked): its denial line.
ASKED = ("interposed", "syscall", "static", "ctypes", "execveat", "dlsym", "wordexp", "system",
         "busybox-sh", "busybox-env")  # fmt: skip


def _segments(output: str) -> dict[str, str]:
    """What each route printed, by name (the text before its ``== NAME STATUS`` line)."""
    found: dict[str, str] = {}
    text = ""
    for line in output.splitlines(keepends=True):
        if line.startswith("== ") and not line.startswith("== head"):
            found[line[3:].rsplit(" ", 1)[0]] = text  # "NAME" or "control NAME"
            text = ""
        else:
            text += line
    return found


def _check(output: str) -> None:
    """Nothing ran the marker, every route ended (the server judged the marker where a process
    reached it), okprog ran from every route but its forbidden form, ptrace was refused, and the
    session kept working."""
    assert "marker ran" not in output, output
    segments = _segments(output)
    for name, _ in ROUTES:
        assert f"== {name} " in output, (name, output)
    for name in ASKED:
        assert ": marker must not run (rule" in segments[name], (name, output)
    assert "error while loading shared libraries" in segments["ldso"], output
    assert "route ptrace: PTRACE_TRACEME failed: Operation not permitted" in output, output
    for name in ("syscall", "static", "busybox-env"):
        assert f"okprog ran: fine\n== control {name} 0" in output, (name, output)
    assert "okprog ran: never" not in output, output
    assert "okprog never: only this form is forbidden" in output, output
    assert "== head #!\n" in output, output
    assert output.rstrip().endswith("still-alive"), output


@pytest.mark.parametrize("sandbox", list(SANDBOXES))
def test_no_route_runs_a_forbidden_program_in_run(
    attacker: Attacker, tools: Path, sandbox: str
) -> None:
    env = _prepare(attacker, tools)
    argv = [
        sys.executable, "-m", "execgate", "run", "--rules", str(attacker.rules),
        *_options(sandbox, tools), "--", "bash", "-c", _script(tools),
    ]  # fmt: skip
    if attacker.user is not None:
        argv = attacker.user.argv(argv)
    result = subprocess.run(argv, env=env, cwd=attacker.work, capture_output=True, timeout=120)
    output = result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")
    _check(output)
    assert not list(attacker.traces.iterdir())
    assert (tools / "marker").read_bytes()[:4] == b"\x7fELF"  # the real file, untouched
    if sandbox == "strict-exec":
        assert "route memfd: memfd_create failed: Operation not permitted" in output, output
    if sandbox == "workspace-write":  # a copy of what reading the program gives is refused
        assert "this is a copy of the stand-in" in output, output


@contextlib.asynccontextmanager
async def _mcp(
    attacker: Attacker, tools: Path, sandbox: str, elicit: Any = None
) -> AsyncIterator[Client]:
    """``execgate mcp`` as the attacker, driven by the SDK's client."""
    env = _prepare(attacker, tools)
    argv = [
        sys.executable, "-m", "execgate", "mcp", "--rules", str(attacker.rules),
        *_options(sandbox, tools), "--exclude-tmpdir",
    ]  # fmt: skip
    if attacker.user is not None:
        argv = attacker.user.argv(argv)
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=attacker.work)
    with (attacker.base / "mcp-server.log").open("w") as errlog:
        async with Client(stdio_client(params, errlog=errlog), elicitation_callback=elicit) as c:
            yield c


def _shell(attacker: Attacker, command: str) -> dict[str, Any]:
    return {"command": command, "workdir": str(attacker.work), "login": False, "timeout_ms": 120000}


# Codex's per-call sandbox state (docs/mcp.md): one server serves every mode; the call without
# it gets the server's own profile (workspace-write with strict-exec).
CODEX_STATES: dict[str, dict[str, Any] | None] = {
    "strict-exec": None,
    "read-only": {"type": "read-only"},
    "workspace-write": {"type": "workspace-write", "exclude_slash_tmp": True},
}


def test_no_route_runs_a_forbidden_program_in_mcp(attacker: Attacker, tools: Path) -> None:
    """Every route in each sandbox mode, then a `prompt` rule on a static binary started by
    busybox's shell (a raw exec): asked, and run or denied as answered."""
    answers = Elicitations([accept("once"), types.ElicitResult(action="decline")])
    prompt = f"busybox sh -c '{tools}/smarker now'; echo rc=$?"

    async def scenario() -> tuple[dict[str, str], list[str]]:
        outputs: dict[str, str] = {}
        async with _mcp(attacker, tools, "strict-exec", elicit=answers) as client:
            for mode, state in CODEX_STATES.items():
                meta = None
                if state is not None:
                    meta = {
                        "codex/sandbox-state-meta": {
                            "sandboxPolicy": state,
                            "sandboxCwd": str(attacker.work),
                        }
                    }
                shell = _shell(attacker, _script(tools))
                result = await client.call_tool("shell", shell, meta=meta)
                outputs[mode] = payload(result)["output"]
            prompted = [
                payload(await client.call_tool("shell", _shell(attacker, prompt)))["output"]
                for _ in range(2)
            ]
        return outputs, prompted

    outputs, (allowed, denied) = asyncio.run(scenario())
    for output in outputs.values():
        _check(output)
    assert "route memfd: memfd_create failed: Operation not permitted" in outputs["strict-exec"]
    assert "this is a copy of the stand-in" in outputs["workspace-write"]
    assert not list(attacker.traces.iterdir())
    assert [a.message.count("smarker needs a human") for a in answers.asked] == [1, 1]
    assert "smarker ran: now\nrc=0" in allowed, allowed
    assert "smarker ran" not in denied and "rc=126" in denied, denied


def test_a_prompt_on_a_static_binary_asks_at_the_terminal(attacker: Attacker, tools: Path) -> None:
    """busybox's env execs the static smarker with a raw syscall: the stand-in asks at the
    terminal; allowed once it runs, denied it does not."""
    from gate.test_run_terminal import Terminal

    env = _prepare(attacker, tools)
    command = f"for w in now again; do busybox env {tools}/smarker $w; echo rc=$?; done"
    argv = [
        sys.executable, "-m", "execgate", "run", "--rules", str(attacker.rules),
        *_options("strict-exec", tools), "--", "bash", "-c", command,
    ]  # fmt: skip
    if attacker.user is not None:
        argv = attacker.user.argv(argv)
    term = Terminal(argv, env, attacker.work)
    term.expect(rb"smarker now` requires approval: smarker needs a human")
    term.expect(rb"Allow\?")
    term.type(b"o\n")
    term.expect(rb"smarker ran: now\r\nrc=0")
    term.expect(rb"smarker again` requires approval")
    term.expect(rb"Allow\?")
    term.type(b"d\n")
    term.expect(rb"execgate: denied: .*smarker again: declined at the terminal")
    term.expect(rb"rc=126")
    assert term.finish() == 0
    assert b"smarker ran: again" not in term.screen


def test_sandbox_check_reports_the_backstop(attacker: Attacker) -> None:
    argv = [sys.executable, "-m", "execgate", "sandbox", "check"]
    if attacker.user is not None:
        argv = attacker.user.argv(argv)
    result = subprocess.run(argv, env=attacker.env, capture_output=True, text=True, timeout=60)
    assert re.search(r"exec backstop: +active", result.stdout), result.stdout
