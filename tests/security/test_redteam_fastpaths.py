"""Red team of this session's fast paths, from inside real `execgate run --sandbox
workspace-write` sessions, as root and as an unprivileged user.

Standing claims (docs/protocol.md §4 "Standing claims"): an escalation the launcher grants
without the server must still never start in a git repository the sandbox made after the
server's look (the server's check at the judgement is gone from that path: only the launcher's
own look at the claim stands between a planted `core.fsmonitor` and code outside the sandbox);
and a claimer that is gone, a descriptor that is not the stand-in, and malformed frames are
misses or closed connections that leave the launcher serving.

The escalated environment (docs/policy.md), which standing claims share with tickets: variables
that a program reads as command-line options or as its package source must not come from the
caller, or a narrow rule's fixed arguments do not hold (`TAR_OPTIONS`, `PIP_*`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from .test_standing_claims import escalations, folders, run_session

CLAIMER = Path(__file__).with_name("redteam_claim.py")


def _template_repository(base: Path, witness: Path) -> Path:
    """A repository (one commit, an index) whose `core.fsmonitor` leaves ``witness`` when git
    runs it: `git status` does."""
    repo = base / "tpl"
    git = ["git", "-C", str(repo), "-c", "user.email=r@t", "-c", "user.name=rt"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "f").write_text("f\n")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    subprocess.run([*git, "config", "core.fsmonitor", f"touch {witness}; false"], check=True)
    return repo


def test_a_standing_git_never_starts_in_a_repository_planted_after_the_judgement(
    place: tuple[Any, Path],
) -> None:
    user, base = place
    _, out = folders(base)
    witness = out / "PWNED"  # only a git outside the sandbox can make it
    tpl = _template_repository(base, witness)
    rules = 'prefix_rule(["git", "status"], "allow")\n'
    dirs = ["a", "b/c", "d"]
    quiet = ">/dev/null 2>&1"
    script = f"""
mkdir -p {" ".join(dirs)}
for d in {" ".join(dirs)}; do (cd $d && git status {quiet}; git status {quiet}); done
cp -r {tpl}/.git a/.git                     # a repository in the working directory
cp -r {tpl}/.git b/.git                     # one in a folder above it
cp -r {tpl}/.git repo.git && printf 'gitdir: ../repo.git\\n' > d/.git  # a gitfile
for d in {" ".join(dirs)}; do (cd $d && git status {quiet}; git status {quiet}); done
cd a && RT_PATH=/usr/bin/git RT_ARGV='["git", "status"]' python3 {CLAIMER} exact
echo alive
"""
    stdout, stderr, log = run_session(user, base, rules, script)
    assert "alive" in stdout, (stdout, stderr)
    assert not witness.exists(), (stdout, stderr, log)
    # Before the plant: each folder's repeat was a standing claim (the attack met the fast
    # path); after it: no escalation at all, standing or not.
    assert escalations(log, "git status") == [False, True] * 3, log
    assert "exact miss" in stdout, stdout
    in_place = [line for line in log if "not escalated: it would start in the git" in line]
    assert len(in_place) == 6, log


def test_sly_and_malformed_standing_claims_are_misses_and_the_launcher_keeps_serving(
    place: tuple[Any, Path],
) -> None:
    user, base = place
    _, out = folders(base)
    (out / "t").touch()
    rules = 'prefix_rule(["touch"], "allow")\n'
    modes = ["exact", "orphan", "memfd", "truncated", "argc", "nfds", "nofds", "header", "exact"]
    argv = json.dumps(["touch", f"{out}/t"])
    script = f"""
touch {out}/t; touch {out}/t
RT_PATH=/usr/bin/touch RT_ARGV={shlex.quote(argv)} {sys.executable} {CLAIMER} {" ".join(modes)}
touch {out}/t && echo alive
"""
    stdout, stderr, log = run_session(user, base, rules, script)
    assert "alive" in stdout, (stdout, stderr)
    answers = dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)
    lines = [line.split(" ", 1) for line in stdout.splitlines() if " " in line]
    got = [answer for mode, answer in lines if mode == "exact"]
    assert len(got) == 2 and all(a.startswith("go") for a in got), (stdout, stderr)
    for mode in ("orphan", "memfd"):
        assert answers[mode] == "miss", (mode, stdout, stderr)
    for mode in ("truncated", "argc", "nfds", "nofds", "header"):
        assert answers[mode] in ("closed", "miss") or answers[mode].startswith("refused"), (
            mode,
            stdout,
        )
    # one record per execution: 2 + the two exact claims + the last touch, 3 of them standing
    assert escalations(log, f"touch {out}/t") == [False, True, True, True, True], log


def test_an_escalated_program_takes_no_code_from_the_callers_option_variables(
    place: tuple[Any, Path],
) -> None:
    """`TAR_OPTIONS` is read by tar as if it were on its command line: a narrow rule that
    escalates one exact `tar` command would otherwise run whatever the sandbox names in
    `--checkpoint-action=exec=` outside the sandbox (and its repeat as a standing claim)."""
    user, base = place
    ws, out = folders(base)
    (ws / "data").write_text("d\n")
    witness = out / "PWNED"
    (ws / "evil").write_text(f"#!/bin/sh\ntouch {witness}\n")
    (ws / "evil").chmod(0o755)
    rules = f'prefix_rule(["tar", "-cf", "{out}/b.tar", "data"], "allow")\n'
    evil = f"--checkpoint=1 --checkpoint-action=exec={ws}/evil"
    script = f"""
tar -cf {out}/b.tar data; tar -cf {out}/b.tar data
TAR_OPTIONS={shlex.quote(evil)} tar -cf {out}/b.tar data
echo alive
"""
    stdout, stderr, log = run_session(user, base, rules, script)
    assert "alive" in stdout, (stdout, stderr)
    assert escalations(log, f"tar -cf {out}/b.tar data") == [False, True, True], log
    assert (out / "b.tar").exists()
    assert not witness.exists(), (stdout, stderr, log)


def _wheel(folder: Path, name: str, version: str, code: bytes) -> None:
    """A wheel of ``name`` ``version`` whose package is ``code``."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": code,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
        for n, d in files.items()
    ]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,", ""]).encode()
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        for n, d in files.items():
            z.writestr(n, d)


def test_an_escalated_pip_takes_no_package_source_from_its_caller(
    place: tuple[Any, Path],
) -> None:
    """A narrow rule escalates one exact `pip install` (a name, a version, a target): with the
    caller's `PIP_NO_INDEX`/`PIP_FIND_LINKS` it would install, outside the sandbox, a package
    of that name and version the sandbox wrote itself (a wheel in the workspace)."""
    user, base = place
    ws, out = folders(base)
    (ws / "pkgs").mkdir()
    _wheel(ws / "pkgs", "rtpkg", "1.0", b"PWNED = True\n")
    (base / "empty").mkdir()  # the session's own (offline) package source: nothing there
    python = os.path.realpath(sys.executable)
    pip = [python, "-m", "pip", "install", "-q", "--no-cache-dir", "--no-deps", "--target",
           f"{out}/lib", "rtpkg==1.0"]  # fmt: skip
    rules = f'prefix_rule({json.dumps(pip)}, "allow")\n'
    script = f"""
PIP_NO_INDEX=1 PIP_FIND_LINKS={ws}/pkgs {shlex.join(pip)}
echo alive
"""
    own = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(base / "empty")}
    stdout, stderr, log = run_session(user, base, rules, script, own=own)
    assert "alive" in stdout, (stdout, stderr)
    assert len([line for line in log if "escalated " in line and "-m pip install" in line]) == 1
    assert not (out / "lib" / "rtpkg").exists(), (stdout, stderr, log)


def test_an_escalated_program_finds_no_program_of_the_sandbox_on_the_callers_path(
    place: tuple[Any, Path],
) -> None:
    """`tar -z` starts `gzip` by name: with the caller's `PATH` it would find the sandbox's own
    `gzip` first, and that child, named by no rule, runs where its escalated parent runs:
    outside the sandbox (also for the standing claim that repeats the escalation)."""
    user, base = place
    ws, out = folders(base)
    (ws / "data").write_text("d\n")
    (ws / "bin").mkdir()
    witness = out / "PWNED"
    (ws / "bin" / "gzip").write_text(f"#!/bin/sh\ntouch {witness}\ncat\n")
    (ws / "bin" / "gzip").chmod(0o755)
    command = f"tar -czf {out}/b.tgz data"
    rules = f'prefix_rule({json.dumps(command.split())}, "allow")\n'
    script = f"""
{command}; {command}
PATH={ws}/bin:$PATH {command}; echo rc=$?
echo alive
"""
    stdout, stderr, log = run_session(user, base, rules, script)
    assert "alive" in stdout, (stdout, stderr)
    assert escalations(log, command) == [False, True, True], log
    assert "rc=0" in stdout, (stdout, stderr)  # the session's own gzip did the work
    assert not witness.exists(), (stdout, stderr, log)


def test_an_escalated_programs_child_written_by_the_sandbox_does_not_run_outside(
    place: tuple[Any, Path],
) -> None:
    user, base = place
    ws, out = folders(base)
    (ws / "data").write_text("d\n")
    (ws / "bin").mkdir()
    witness = out / "PWNED"
    (ws / "bin" / "cat").write_text("#!/bin/sh\n")  # the session's PATH has ws/bin first
    (ws / "bin" / "cat").chmod(0o755)
    command = f"tar -czf {out}/b.tgz data"
    rules = f'prefix_rule({json.dumps(command.split())}, "allow")\n'
    script = f"""
printf '#!/bin/sh\\ntouch {witness}\\nexec /bin/cat\\n' > {ws}/bin/gzip && chmod +x {ws}/bin/gzip
{command}; echo rc=$?
echo alive
"""
    path = f"{ws}/bin:{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    stdout, stderr, log = run_session(user, base, rules, script, own={"PATH": path})
    assert "alive" in stdout, (stdout, stderr)
    assert escalations(log, command) == [False], log
    assert not witness.exists(), (stdout, stderr, log)
    inside = [line for line in log if f"{ws}/bin/gzip is where the sandbox can write" in line]
    assert inside, log


def test_what_an_escalated_program_starts_from_where_the_sandbox_writes_runs_inside(
    place: tuple[Any, Path],
) -> None:
    """Programs (binaries too, which would not ask by the policy's snapshot alone), the
    dynamic loader's target and a script reached through a link the sandbox can re-point,
    started by an escalated program: each runs inside the sandbox (it cannot write outside),
    while a system program started the same way still runs outside, and so does a file of
    the workspace that a rule names by its path."""
    user, base = place
    ws, out = folders(base)
    (ws / "bin").mkdir()
    (out / "tool.sh").write_text('#!/bin/sh\nmkdir "$@"\n')  # a script the sandbox cannot change
    (out / "tool.sh").chmod(0o755)
    rules = f"""prefix_rule(["env"], "allow")
prefix_rule(["{ws}/bin/named"], "allow")
"""
    loader = "/lib64/ld-linux-x86-64.so.2"
    script = f"""
cp /usr/bin/mkdir {ws}/bin/mk && cp /usr/bin/touch {ws}/bin/named  # (sizes no rule names)
ln -s /usr/bin/mkdir {ws}/bin/link && ln -s {out}/tool.sh {ws}/bin/tool
printf '#!/bin/sh\nmkdir "$@"\n' > {ws}/mk.sh && chmod +x {ws}/mk.sh
env {ws}/bin/mk {out}/binary; echo binary=$?
env {loader} {ws}/bin/mk {out}/loaded; echo loaded=$?
env {ws}/bin/link {out}/linked; echo linked=$?
env {ws}/mk.sh {out}/script; echo script=$?
env {ws}/bin/tool {out}/relinked; echo relinked=$?
env /usr/bin/mkdir {out}/system; echo system=$?
env {ws}/bin/named {out}/named; echo named=$?
echo alive
"""
    stdout, stderr, log = run_session(user, base, rules, script)
    assert "alive" in stdout, (stdout, stderr)
    # (a script's interpreter reads it by the name it was run by: through a link the sandbox
    # could re-point after the judgement)
    for inside in ("binary", "loaded", "script", "relinked"):
        assert not (out / inside).exists(), (inside, stdout, stderr, log)
        assert f"{inside}=0" not in stdout, (inside, stdout)
    # A link the sandbox made to a system program: the program is the system's, and the
    # kernel runs the descriptor that was judged (a re-pointed link changes nothing).
    for outside in ("linked", "system", "named"):
        assert (out / outside).exists(), (outside, stdout, stderr, log)
    assert len([line for line in log if "is where the sandbox can write" in line]) == 4, log


def test_a_shell_that_forges_its_snapshot_still_has_named_programs_judged_and_never_waits(
    place: tuple[Any, Path],
) -> None:
    """The interposed fork() maps the session's snapshot in the forking shell (docs/
    architecture.md). A shell that points EXECGATE_SNAPSHOT at a FIFO (a fork that would wait
    on it), at a file of its own (a malformed snapshot), or at nothing, before it forks and
    before a new shell starts, changes nothing: the gate's variables are the ones captured at
    load, every exec of a rule-named program is still the server's to judge, and no fork hangs.
    A fork made with the raw system call skips the interposer: its child maps the snapshot
    itself, as before."""
    user, base = place
    _, out = folders(base)
    rules = 'prefix_rule(["touch"], "forbidden")\n'
    script = f"""
mkfifo fifo; printf 'EGSNAP1' > own.snap
for forged in "$PWD/fifo" "$PWD/own.snap" /nonexistent ""; do
  (export EXECGATE_SNAPSHOT="$forged"; touch {out}/in-subshell; echo "rc=$?")
  EXECGATE_SNAPSHOT="$forged" bash -c 'touch {out}/in-new-shell; echo "rc=$?"'
done
python3 -c 'import ctypes, os
nr = {{"x86_64": 56, "aarch64": 220}}[os.uname().machine]  # clone(SIGCHLD): no interposer
pid = ctypes.CDLL(None, use_errno=True).syscall(nr, 17, 0, 0, 0, 0)
if pid == 0: os.execvp("touch", ["touch", "{out}/raw-fork"])
os.waitpid(pid, 0)'
echo alive
"""
    stdout, stderr, _ = run_session(user, base, rules, script)
    assert "alive" in stdout, (stdout, stderr)
    assert stdout.count("rc=126") == 8, (stdout, stderr)
    assert stderr.count("execgate: denied: touch") >= 9, stderr
    assert not any(out.iterdir()), list(out.iterdir())
