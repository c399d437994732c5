"""Red team of the claim path's speed-ups (commits 02e5c53..2afda85), from inside real
`execgate run --sandbox workspace-write` sessions, as root and as an unprivileged user.

* native/claim.c ``table_fds``: the claimer learns its open descriptors from select()'s cut at
  the table's size instead of /proc/self/fd (it used poll()'s POLLNVAL too, which also marks
  every O_PATH descriptor: those were left out of the claim; now fcntl asks each number);
* native/interpose.c ``claim_here``: unshare(CLONE_VM) succeeding is taken as proof that the
  process is alone in its memory;
* native/gate.c ``resolve_path``: REALPATH (what the snapshot's names are checked against) is
  computed in user space, a readlink per component and then a check that it reaches the file
  (a stat at first, which followed a folder swapped for a symlink meanwhile and let a
  path-forbidden program run; now an open that follows no symlink);
* native/launch.c: a standing claim's ``go`` is owed for a millisecond, or sent with the
  program's end (``end_as_program`` in the claimer);
* native/launch.c: the launcher's pause (nice 19, 100 µs) after the last program ended.

The escalated program is ``tool`` (c/redteam_claimpath_tool.c), allowed by a rule and kept in a
folder no sandbox can write; the attacker is c/redteam_claimpath_attack.c or a shell loop.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from .test_standing_claims import escalations, folders, run_session

HERE = Path(__file__).resolve().parent
C = HERE / "c"


def _gcc(src: Path, out: Path) -> None:
    cmd = ["gcc", "-std=gnu11", "-O1", "-Wall", "-pthread", "-o", str(out), str(src)]
    subprocess.run(cmd, check=True)


def _arm(base: Path) -> tuple[Path, Path, Path, Path]:
    """(workspace, outside, tool, attack): tool in ``outside`` (read-only in the sandbox),
    the attacker in the workspace."""
    ws, out = folders(base)
    tool, attack = out / "tool", ws / "attack"
    _gcc(C / "redteam_claimpath_tool.c", tool)
    _gcc(C / "redteam_claimpath_attack.c", attack)
    return ws, out, tool, attack


def _traces(base: Path) -> Path:
    """A folder the sandbox cannot write and the server does not watch (writes into the
    watched folder of a rule-named file revoke every standing authorization)."""
    traces = base / "traces"
    traces.mkdir()
    return traces


def _tool_rules(tool: Path) -> str:
    return f'host_executable(name = "tool", paths = ["{tool}"])\nprefix_rule(["tool"], "allow")\n'


def _fd_lines(text: str) -> list[dict[int, str]]:
    """Each `tool fds` report: {number: 'cloexec=C TARGET'}, in order."""
    reports: list[dict[int, str]] = []
    for line in text.splitlines():
        if line.startswith("opened ") and (not reports or reports[-1]):
            reports.append({})
        m = re.match(r"fd (\d+) (.*)$", line)
        if m:
            if not reports:
                reports.append({})
            reports[-1][int(m.group(1))] = m.group(2)
    return reports


# -- 1. table_fds: which descriptors the escalated program gets --------------------------------

#: Descriptors of every kind the attacker opens before an escalated exec, at numbers that make
#: the table 512 wide (300) — and, with ``_BIG``, 1024 wide (the /proc listing takes over).
_KINDS = (
    "opath-cloexec@11 epoll@12 eventfd@13 pidfd@14 sock-shut@15 listen@16 file@17 cloexec@18 "
    "closed@19 file@63 cloexec@64 file@127 cloexec@128 file@300 cloexec@301 closed@302"
)
_BIG = "file@511 cloexec@512 file@700 cloexec@1000"


def test_an_escalated_program_gets_exactly_the_claimers_inheritable_descriptors(
    place: tuple[Any, Path],
) -> None:
    """table_fds (select's cut at the table's size, poll's POLLNVAL) must never let a
    close-on-exec or closed descriptor of the claimer, nor any descriptor of the launcher (its
    claim, control and report sockets, the folder watch, the files it keeps), reach a program
    outside the sandbox, and must see every inheritable one, whatever its kind (epoll, eventfd,
    pidfd, a socket shut down both ways, a listening socket) and number: at the edges of the
    table sizes 64, 128 and 512, and in a 1024-wide table (above 512: the /proc listing).
    Checked for the ticket claim (first exec, judged by the server) and the standing claim
    (the repeat), both claimed in-process."""
    user, base = place
    _ws, _out, tool, attack = _arm(base)
    script = f"""
{attack} fds {tool} {_KINDS}; echo rc=$?
{attack} fds {tool} {_KINDS}; echo rc=$?
{attack} fds {tool} {_KINDS} {_BIG}; echo rc=$?
{attack} fds {tool} {_KINDS} {_BIG}; echo rc=$?
"""
    stdout, stderr, log = run_session(user, base, _tool_rules(tool), script)
    assert stdout.count("rc=0") == 4, (stdout, stderr)
    assert escalations(log, "tool fds") == [False, True, True, True], log
    reports = _fd_lines(stdout)
    assert len(reports) == 4, stdout
    small = {0, 1, 2, 12, 13, 14, 15, 16, 17, 63, 127, 300}
    big = small | {511, 700}
    for report, want in zip(reports, (small, small, big, big), strict=True):
        assert set(report) == want, (sorted(report), sorted(want), stdout)
        assert all(v.startswith("cloexec=0 ") for v in report.values()), report
        kinds = {n: v.split(" ", 1)[1] for n, v in report.items()}
        assert kinds[12] == "anon_inode:[eventpoll]" and kinds[14] == "anon_inode:[pidfd]"
        assert kinds[15].startswith("socket:") and kinds[16].startswith("socket:")
        for n in (17, 63, 127, 300):
            assert kinds[n] == "/dev/null", kinds


def test_an_inheritable_o_path_descriptor_reaches_the_escalated_program(
    place: tuple[Any, Path],
) -> None:
    """The claimer's open O_PATH descriptor (not close-on-exec) is inherited by the escalated
    program like any other, with a small table as with a large one."""
    user, base = place
    _ws, _out, tool, attack = _arm(base)
    script = f"""
{attack} fds {tool} opath@10 opath-cloexec@11 file@700; echo rc=$?
{attack} fds {tool} opath@10 opath-cloexec@11; echo rc=$?
"""
    stdout, stderr, _log = run_session(user, base, _tool_rules(tool), script)
    assert stdout.count("rc=0") == 2, (stdout, stderr)
    big, small = _fd_lines(stdout)
    assert 10 in big and 11 not in big, big  # the /proc listing: right
    assert 10 in small and 11 not in small, small  # select + poll: the O_PATH one is missed


# -- 2. claim_here: who may claim in-process ---------------------------------------------------


def _claimers(stdout: str) -> dict[int, str]:
    """{claimer pid: its executable while its escalated program ran} (from `tool who`)."""
    seen = {
        int(m.group(1)): m.group(2) for m in re.finditer(r"^who (\d+) (\S+) \d+$", stdout, re.M)
    }
    pids = [int(m.group(1)) for m in re.finditer(r"^claimer (\d+)$", stdout, re.M)]
    return {pid: seen.get(pid, "gone") for pid in pids}


@pytest.mark.parametrize("how", ["clonevm", "vfork", "thread"])
def test_a_process_sharing_its_memory_claims_through_the_wrapper(
    place: tuple[Any, Path], how: str
) -> None:
    """unshare(CLONE_VM) must fail (EINVAL) for a raw clone(CLONE_VM) child without
    CLONE_VFORK or CLONE_THREAD (its parent runs on in the same memory), for a vfork child and
    for a second thread that execs: each claims through execgate-wrapper (a fresh process) and
    never in-process, where the claim's stack and heap would be the parent's or the other
    thread's. Seen from the escalated program: while it runs, its claimer's executable is the
    wrapper, not the attacker."""
    user, base = place
    _ws, _out, tool, attack = _arm(base)
    script = f"{attack} {how} {tool}; echo rc=$?\n{attack} {how} {tool}; echo rc=$?\n"
    stdout, stderr, log = run_session(user, base, _tool_rules(tool), script)
    assert stdout.count("rc=0") == 2, (stdout, stderr)
    claimers = _claimers(stdout)
    assert len(claimers) == 2, stdout
    assert set(claimers.values()) == {"execgate-wrapper"}, (claimers, stdout)
    assert escalations(log, "tool who") == [False, False], log  # the wrapper never stands


def test_a_faked_unshare_lets_a_threaded_process_claim_in_process_but_widens_nothing(
    place: tuple[Any, Path],
) -> None:
    """A sandboxed process may install a seccomp filter whose user notifications a cooperating
    process answers: it then makes unshare(CLONE_VM) return 0 with a second thread running, and
    claim_here takes the claim in-process (protocol §4 "In-process claims" says the process
    must be alone). That only hurts the attacker: the other thread runs on, in the sandbox, as
    a forked child would; what runs outside is exactly the judged program, once, with its
    exit status. Asserted: the thread's writes outside the workspace all fail while the
    escalated program runs, and each exec escalated once."""
    user, base = place
    _ws, out, tool, attack = _arm(base)
    script = (
        f"{attack} seccomp {tool} {out}; echo rc=$?\n{attack} seccomp {tool} {out}; echo rc=$?\n"
    )
    stdout, stderr, log = run_session(user, base, _tool_rules(tool), script)
    if "seccomp refused" in stdout:
        pytest.skip("no seccomp user notification here")
    assert stdout.count("rc=0") == 2, (stdout, stderr)
    assert "unshare with two threads says 0" in stdout, stdout  # the check is fooled
    assert not (out / "thread-escaped").exists(), (stdout, stderr)
    assert not (base / "thread-escaped").exists()
    assert escalations(log, "tool who") == [False, True], log


# -- 3. resolve_path: REALPATH in user space ---------------------------------------------------


def _resolve_race(user: Any, base: Path, *, before: bool) -> tuple[str, str]:
    """The forbidden program ``ws/late/prog`` (a path rule; made before the session when
    ``before``, else by the sandbox) exec'd 3000 times as ``ws/sw/prog`` while a thread
    exchanges ``sw`` (a folder with a harmless prog) and ``swl`` (a symlink to ``late``)."""
    ws, _out, tool, attack = _arm(base)
    rules = f'prefix_rule(["{ws}/late/prog"], "forbidden", justification="never")\n'
    make = f"mkdir late && cp {tool} late/prog && head -c 777 /dev/zero >> late/prog"
    if before:
        (ws / "late").mkdir()
        shutil.copy2(tool, ws / "late" / "prog")
        with (ws / "late" / "prog").open("ab") as f:
            f.write(b"\0" * 777)  # a size of its own: no other rule-named file's
        make = "true"
    script = f"""
cd {ws} && {make} && mkdir sw && cp /bin/true sw/prog && ln -s late swl
late/prog late {ws}/direct 0; echo direct rc=$?
{attack} resolve 3000 {ws}
"""
    stdout, stderr, _ = run_session(user, base, rules, script)
    assert "direct rc=126" in stdout and not (ws / "direct").exists(), (stdout, stderr)
    return stdout, stderr


def test_a_symlink_swap_never_hides_a_path_ruled_program_made_in_the_session(
    place: tuple[Any, Path],
) -> None:
    """The interposer asks about a program when its canonical path is a rule's name (protocol
    §6): REALPATH must be the file's canonical path, whatever the sandbox races. A program a
    path rule forbids, made by the sandbox during the session (its identity is in no snapshot
    yet), is exec'd through a path whose folder a thread keeps exchanging with a symlink to
    the program's folder: it must be denied each time it is the program that opened, never
    run."""
    user, base = place
    stdout, stderr = _resolve_race(user, base, before=False)
    m = re.search(r"resolve ran=(\d+) denied=(\d+) other=(\d+)", stdout)
    assert m, (stdout, stderr)
    assert int(m.group(2)) > 0, stdout  # the race did reach the forbidden program
    assert int(m.group(1)) == 0, stdout


def test_a_symlink_swap_never_hides_a_path_ruled_program_known_at_the_start(
    place: tuple[Any, Path],
) -> None:
    """The same race against a path-ruled program that existed when the session started: its
    (dev, ino) is in the snapshot, which asks whatever REALPATH says, and in the sandbox it is
    covered by a stand-in. Never run."""
    user, base = place
    stdout, stderr = _resolve_race(user, base, before=True)
    m = re.search(r"resolve ran=(\d+) denied=(\d+) other=(\d+)", stdout)
    assert m, (stdout, stderr)
    assert int(m.group(1)) == 0, stdout


# -- 4. the lazy `go` and end_as_program ------------------------------------------------------


def test_a_claimer_killed_around_its_go_takes_its_program_along(place: tuple[Any, Path]) -> None:
    """A standing claim's `go` is owed for a millisecond after its program exec'ed: a claimer
    killed in that window (or just after, or before it sent anything) has not been told the
    program runs, and the program must still be killed with it (its connection closes), never
    left running outside the sandbox. 40 standing claimers, each SIGKILLed 0-45 ms after it
    started; each program would leave a survivor file after 3 s. Only the two claims that were
    not killed may leave one."""
    user, base = place
    _ws, _out, tool, _attack = _arm(base)
    traces = _traces(base)
    survive = f"{tool} survive {traces} 3000"
    script = f"""
{survive}; {survive}
for i in $(seq 40); do
  ( exec {survive} ) & p=$!
  [ $((i % 10)) -eq 0 ] || sleep 0.00$((i % 10))
  kill -9 $p; wait $p 2>/dev/null
done
sleep 4; echo alive
"""
    stdout, stderr, log = run_session(user, base, _tool_rules(tool), script)
    assert "alive" in stdout, (stdout, stderr)
    survivors = sorted(p.name for p in traces.glob("survivor-*"))
    assert len(survivors) == 2, (survivors, stdout, stderr)
    standing = escalations(log, survive)
    assert standing[:2] == [False, True] and all(standing[1:]), standing


def test_concurrent_standing_claimers_each_end_as_their_own_program(
    place: tuple[Any, Path],
) -> None:
    """The lazy `go` is sent with the program's end when that comes first (end_as_program in
    the claimer): an end must never reach another claimer, be lost, or be taken for a `go`.
    Programs that exit 0-5 or die by SIGUSR1/SIGTERM are claimed 12 at a time, 6 rounds; every
    claimer must end exactly as its own program did, and each claim must be a standing one."""
    user, base = place
    _ws, _out, tool, _attack = _arm(base)
    cases = {f"exit {n}": n for n in range(6)}
    cases |= {"sig 10": 128 + signal.SIGUSR1, "sig 15": 128 + signal.SIGTERM}
    first = "\n".join(f"{tool} {c} 2>/dev/null" for c in cases)
    jobs = " ".join(f"'{c}'" for c in cases)
    script = f"""
{first}
for round in 1 2 3 4 5 6; do
  pids=(); want=()
  for c in {jobs} 'exit 1' 'sig 15' 'exit 0' 'exit 5'; do
    ( exec {tool} $c ) 2>/dev/null & pids+=($!); want+=("$c")
  done
  for k in "${{!pids[@]}}"; do wait ${{pids[$k]}}; echo "got ${{want[$k]}} = $?"; done
done
echo alive
"""
    stdout, stderr, log = run_session(user, base, _tool_rules(tool), script)
    assert "alive" in stdout, (stdout, stderr)
    got = re.findall(r"^got (\w+ \d+) = (\d+)$", stdout, re.M)
    assert len(got) == 6 * 12, stdout
    for case, status in got:
        assert int(status) == cases[case], (case, status, stdout)
    for case in cases:
        records = escalations(log, f"{tool} {case}")
        assert records[0] is False and all(records[1:]), (case, records)
        assert len(records) == 1 + 6 * (1 + (case in ("exit 1", "sig 15", "exit 0", "exit 5")))


def test_every_standing_claim_runs_its_program_exactly_once_and_is_recorded(
    place: tuple[Any, Path],
) -> None:
    """No ordering of claims, `go`s and ends runs a program twice (a `miss` after the program
    started would make the claimer ask the server and run it again) or without a record: 60
    standing claims of one program that appends a line outside the sandbox, 15 at a time;
    every claimer exits 0, and the file has exactly one line per claim and per record."""
    user, base = place
    _ws, _out, tool, _attack = _arm(base)
    traces = _traces(base)
    cmd = f"{tool} append {traces}/lines x"
    script = f"""
{cmd}
for round in 1 2 3 4; do
  for i in $(seq 15); do ( exec {cmd} ) & done
  fails=0; for j in $(jobs -p); do wait $j || fails=$((fails + 1)); done; echo fails=$fails
done
echo alive
"""
    stdout, stderr, log = run_session(user, base, _tool_rules(tool), script)
    assert "alive" in stdout and stdout.count("fails=0") == 4, (stdout, stderr)
    lines = (traces / "lines").read_text().splitlines()
    assert len(lines) == 61, lines
    assert len({line.split()[1] for line in lines}) == 61  # 61 processes, each ran once
    records = escalations(log, cmd)
    assert len(records) == 61 and records[0] is False and all(records[1:]), records


# -- 5. the launcher's pause before its exit ---------------------------------------------------


def _left_behind(needle: str) -> list[str]:
    """Command lines of live processes that mention ``needle``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmdline and int(pid) != os.getpid():
            found.append(f"{pid}: {cmdline}")
    return found


def test_nothing_claimed_as_the_session_ends_outlives_it(place: tuple[Any, Path]) -> None:
    """After the session's last program ends and no child is left, the launcher lowers its
    priority and sleeps 100 µs before it shuts down, without serving claims. The session's
    last act here is to leave claims in flight: a standing claimer started as the shell exits,
    a daemon (setsid, double fork) that claims 200 ms later, and a ticket claim's exec made by
    a grandchild. None of their programs (each leaves a survivor file after 1.5 s) may run on
    after `execgate run` has returned, no process of the session may be left, and the
    launcher must be gone."""
    user, base = place
    _ws, _out, tool, _attack = _arm(base)
    traces = _traces(base)
    survive = f"{tool} survive {traces} 1500"
    script = f"""
{survive}; {survive}
( exec {survive} ) &
setsid sh -c '( sleep 0.2; exec {survive} ) & ( sleep 0.3; exec {tool} survive {traces} 1600 ) &' &
exit 0
"""
    start = time.monotonic()
    stdout, stderr, log = run_session(user, base, _tool_rules(tool), script)
    assert time.monotonic() - start < 60, (stdout, stderr)
    time.sleep(2.5)
    survivors = sorted(p.name for p in traces.glob("survivor-*"))
    assert len(survivors) == 2, (survivors, stdout, stderr, log)
    assert _left_behind(str(traces)) == []
    assert _left_behind(str(base)) == []  # the launcher (its options name the workspace) too
