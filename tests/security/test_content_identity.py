"""A copy of a rule-named program is that program, under any name, anywhere (issue 10,
"Program identity by content").

Every route runs for real inside `execgate run` and `execgate mcp`, with the sandbox off and in
workspace-write, as root and as the unprivileged user: a renamed copy of the forbidden marker
(an ELF), a hard link, a copy of the dynamic loader used as loader (for the marker and for a
copy of it), a memfd copy run with `fexecve` and through `/proc/self/fd/N`. None may run; a
copy with one byte changed (same size) is another program and runs, and once rewritten to the
marker's bytes again (same inode) it is the marker again. A prompt rule on the marker asks about
a copy, and the copy then runs (in place: an escalation needs a rule naming the very file) or
not, as answered."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import mcp_types as types
import pytest
from mcpharness import Elicitations, accept, payload, shell_args

from execgate.gate.snapshot import LOADERS

from .conftest import Attacker, compile_marker
from .securityharness import MODES, World

ROUTES_MODES = ("off", "workspace-write")
LOADER = next(path for path in LOADERS if os.path.exists(path))
RULES = """\
prefix_rule(["marker"], "forbidden", justification="marker must not run")
prefix_rule(["askme"], "prompt", justification="ask first")
"""

# Runs a copy of a program from a memfd: by descriptor (fexecve) or by its /proc/self/fd name.
MEMEXEC = """\
import os, sys
how, source, name = sys.argv[1:]
fd = os.memfd_create(name, 0)
data = memoryview(open(source, "rb").read())
while data:
    data = data[os.write(fd, data):]
try:
    os.execve(fd if how == "fexecve" else f"/proc/self/fd/{fd}", [name], dict(os.environ))
except OSError as exc:
    print(f"{name}: {exc.strerror}", file=sys.stderr)
    sys.exit(126)
"""

# `hard` is a hard link to the marker (made by the test: a sandbox's workspace is another mount).
ROUTES = f"""\
M=$(command -v marker)
cp "$M" ./renamed; ./renamed; echo renamed=$?
./hard; echo hard=$?
cp {LOADER} ./myld; ./myld "$M"; echo myld=$?
./myld ./renamed; echo myld-copy=$?
python3 memexec.py fexecve "$M" memcopy; echo memfd=$?
python3 memexec.py procfd "$M" procfd; echo procfd=$?
cp "$M" ./changed; S=$(stat -c %s ./changed); B=$(tail -c1 ./changed | od -An -tu1)
printf "\\\\$(printf %03o $(( (B + 1) % 256 )))" | dd of=./changed bs=1 seek=$((S - 1)) \\
  conv=notrunc status=none
./changed; echo changed=$?
cat "$M" > ./changed; ./changed; echo restored=$?
cp "$(command -v askme)" ./asked; ./asked; echo asked=$?
echo alive
"""
DENIED = ("renamed", "hard", "myld", "myld-copy", "memfd", "procfd", "restored")


def _prepare(bin_dir: Path, work: Path) -> None:
    """``askme``: the marker with one more byte (another program, which a prompt rule names),
    ``hard``: a hard link to the marker, and the memfd helper."""
    shutil.copy(bin_dir / "marker", bin_dir / "askme")
    with (bin_dir / "askme").open("ab") as askme:
        askme.write(b"\0")
    os.link(bin_dir / "marker", work / "hard")
    (work / "memexec.py").write_text(MEMEXEC)


def _check_routes(output: str, traces: Path, *, asked: bool) -> None:
    results = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    assert "alive" in output, output
    assert {route: results.get(route) for route in DENIED} == dict.fromkeys(DENIED, "126"), output
    assert output.count("marker must not run") >= len(DENIED), output
    assert results.get("changed") == "0", output  # another program: no rule, it runs
    assert results.get("asked") == ("0" if asked else "126"), output
    expected = ["ran-asked", "ran-changed"] if asked else ["ran-changed"]
    assert sorted(p.name for p in traces.iterdir()) == expected, output


@pytest.mark.parametrize("mode", ROUTES_MODES)
def test_run_copies_are_judged_as_the_program(attacker: Attacker, mode: str) -> None:
    """The prompt rule on ``askme`` is answered by ``--on-prompt deny``, which says so."""
    attacker.write_rules(RULES)
    _prepare(attacker.bin, attacker.work)
    attacker.give(attacker.base)
    result = attacker.run(ROUTES, mode=mode, options=["--on-prompt", "deny"])
    output = (result.stdout + result.stderr).decode()
    _check_routes(output, attacker.traces, asked=False)
    assert "execgate: denied: ./asked: ask first; prompts are set to deny" in output, output


def test_run_an_allow_rule_escalates_only_the_very_file(attacker: Attacker) -> None:
    """A copy of an allowed program (``touch``) is judged as it, but an escalation needs a rule
    naming the very file that runs: the copy, which the attacker could rewrite, runs in place,
    inside the sandbox, and cannot write outside; the real ``touch`` is escalated and can."""
    attacker.write_rules('prefix_rule(["touch"], "allow")\n')
    out = attacker.outside
    script = (
        f"touch {out}/by-touch; echo touch=$?; "
        f'cp "$(command -v touch)" ./t; ./t {out}/by-copy; echo copy=$?; echo alive'
    )
    result = attacker.run(script, mode="workspace-write")
    assert b"touch=0" in result.stdout and b"alive" in result.stdout, result
    assert b"copy=0" not in result.stdout, result
    assert (out / "by-touch").exists(), result
    assert not (out / "by-copy").exists(), result


def _mcp_world(world: World) -> Path:
    """The world's ``marker`` made the compiled marker (traces in the workdir), and RULES."""
    m = world.mcp
    traces = m.work / ".traces"
    traces.mkdir()
    for name in ("marker", "askme"):
        (m.bin / name).unlink()
    compile_marker(m.bin / "marker", traces)
    _prepare(m.bin, m.work)
    m.write_rules(RULES)
    if world.user is not None:
        world.user.chown_tree(m.root)
    return traces


@pytest.mark.parametrize("mode", ROUTES_MODES)
def test_mcp_copies_are_judged_as_the_program(world: World, mode: str) -> None:
    """The prompt rule on ``askme`` asks about its copy: approved it runs (in place: escalation
    needs a rule naming the very file), declined it does not."""
    traces = _mcp_world(world)
    answers = Elicitations([accept("once"), types.ElicitResult(action="decline")])

    async def scenario() -> str:
        async with world.client(*MODES[mode], elicit=answers) as client:
            routes = payload(await client.call_tool("shell", shell_args(world.mcp, ROUTES)))
            _check_routes(str(routes["output"]), traces, asked=True)
            for trace in traces.iterdir():
                trace.unlink()
            again = "./asked; echo asked=$?"
            declined = payload(await client.call_tool("shell", shell_args(world.mcp, again)))
            return str(declined["output"])

    declined = asyncio.run(scenario())
    assert len(answers.asked) == 2, answers.asked
    assert all("./asked" in question.message for question in answers.asked), answers.asked
    assert "asked=126" in declined and "marker ran" not in declined, declined
    assert not any(traces.iterdir())


def test_a_copy_that_cannot_be_read_is_not_cleared(attacker: Attacker) -> None:
    """Fail closed: an execute-only copy of the marker's size cannot be compared (as the
    unprivileged user) and is denied; root reads it and finds the marker."""
    script = (
        'cp "$(command -v marker)" ./hidden; chmod 111 ./hidden; ./hidden; echo rc=$?; echo alive'
    )
    result = attacker.run(script)
    assert b"rc=126\nalive" in result.stdout, result
    assert not attacker.ran("hidden")
    expected = b"cannot be told" if attacker.user is not None else b"marker must not run"
    assert expected in result.stderr, result.stderr
