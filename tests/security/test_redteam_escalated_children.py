"""Red team of what an escalated program starts (docs/sandbox.md "what an escalated program
**starts**", docs/protocol.md §3 "Tokens and peers", §6 ask folders), from inside real
`execgate run --sandbox workspace-write` sessions, as root and as an unprivileged user.

The promise: when a program escalated by an allow rule (here `env`, `/usr/bin/python3`, whose
children the confined caller names) execs a file the sandbox could have written or re-pointed
(the program, a `#!` interpreter, the script read by name, the dynamic loader's target), that
exec runs inside the sandbox, unless a rule names that very file. A witness made in a folder
the sandbox cannot write (``outside``) proves code ran outside.

Resisted (regression tests): interpreter chains and relative interpreters, the loader with
options before its target, copies of the loader, hard links, `O_TMPFILE` and deleted files run
through `/proc/self/fd/N`, a binary reached through an inherited directory descriptor,
`posix_spawn`/`posix_spawnp`/vfork from an escalated Python, a `PATH` search, a caller's
`EXECGATE_SNAPSHOT`, a republished snapshot (a rule-named file of the workspace replaced), and
a writable root named through a symlink.

Found by this red team and closed since: a memfd (no path at all: the escalated snapshot asks
about a file without a name, and the server runs a file whose path no longer leads to it
inside), the loader's target or a script named through `/proc/self/…` or `/dev/fd/N/…` (names
only the caller can resolve: the server takes them as unknown), and a script the sandbox
writes into a file outside the roots that it holds open for writing (the session's own stdout
log: Landlock does not stop `fchmod`), named through `/proc/self/fd/1`. A binary written that
way is refused by the kernel (ETXTBSY: the session's front holds the file open for writing);
one named by its own path outside the roots would run outside if that ever stopped.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import give_to
from .test_standing_claims import MODE, folders, run_session

LOADER = "/lib64/ld-linux-x86-64.so.2"

# Run inside the sandbox by python3: make an executable file the sandbox wrote, of KIND, and
# have the escalated `env` exec it by a /proc path. Prints "KIND VIA STATUS".
MEMFD = r"""
import os, subprocess, sys
kind, via, witness = sys.argv[1:4]
fd = os.memfd_create("evil", 0)  # inheritable: the claim hands it to the escalated env
if kind == "script":
    os.write(fd, f"#!/bin/sh\nmkdir {witness}\n".encode())
else:  # any ELF the sandbox likes; a copy of mkdir (a size no rule names) will do
    with open("/usr/bin/mkdir", "rb") as f:
        os.write(fd, f.read())
os.fchmod(fd, 0o755)
path = f"/proc/{os.getpid()}/fd/{fd}" if via == "pid" else f"/proc/self/fd/{fd}"
r = subprocess.run(["env", path, witness], pass_fds=[fd])
print(kind, via, r.returncode, flush=True)
"""

# Inside the sandbox: a script in a file the sandbox can only reach by descriptor (O_TMPFILE
# in the workspace, or a workspace file deleted after opening), run by the escalated env.
UNLINKED = r"""
import os, subprocess, sys
kind, witness = sys.argv[1:3]
evil = f"#!/bin/sh\nmkdir {witness}\n".encode()
if kind == "tmpfile":
    fd = os.open(".", os.O_TMPFILE | os.O_RDWR, 0o755)
    os.write(fd, evil)
    os.fchmod(fd, 0o755)
else:
    with open("del.sh", "wb") as f:
        f.write(evil)
    os.chmod("del.sh", 0o755)
    fd = os.open("del.sh", os.O_RDONLY)
    os.unlink("del.sh")
r = subprocess.run(["env", f"/proc/self/fd/{fd}"], pass_fds=[fd])
print(kind, r.returncode, flush=True)
"""

# Inside the sandbox: its stdout is a regular file outside every writable root (the user ran
# `execgate run … > log`). Write a script into it, make it executable, and have the escalated
# env run it through the descriptor it inherits.
STDOUT_FILE = r"""
import os, subprocess, sys
kind, witness = sys.argv[1:3]
os.ftruncate(1, 0)
os.lseek(1, 0, os.SEEK_SET)
if kind == "script":
    os.write(1, f"#!/bin/sh\nmkdir {witness}\n".encode())
else:
    with open("/usr/bin/mkdir", "rb") as f:
        os.write(1, f.read())
os.fchmod(1, 0o755)
r = subprocess.run(["env", "/proc/self/fd/1", witness])
print("stdout-file", r.returncode, file=sys.stderr, flush=True)
"""


def _made(out: Path, names: list[str]) -> list[str]:
    return [name for name in names if (out / name).exists()]


def test_files_the_sandbox_wrote_in_its_roots_run_inside_by_every_route(
    place: tuple[Any, Path],
) -> None:
    """Each route by which an escalated program can start a file of the workspace (or a
    system file through a folder of it) runs that exec inside the sandbox."""
    user, base = place
    ws, out = folders(base)
    (ws / "bin").mkdir()
    (ws / "unlinked.py").write_text(UNLINKED)
    # Scripts the sandbox cannot change, whose interpreter is the sandbox's: by absolute path
    # (a chain: script → script) and by a name relative to the escalated program's cwd.
    (out / "chain.sh").write_text(f"#!{ws}/interp.sh\n")
    (out / "rel.sh").write_text("#!bin/mk\n")
    for name in ("chain.sh", "rel.sh"):
        (out / name).chmod(0o755)
    rules = f"""prefix_rule(["env"], "allow")
prefix_rule(["/usr/bin/python3"], "allow")
prefix_rule(["{ws}/bin/named"], "allow")
"""
    py = "/usr/bin/python3 -c"
    mk = f"{ws}/bin/mk"
    spawn = f'import os; os.waitpid(os.posix_spawn("{mk}", ["mk", "{out}/spawn"], os.environ), 0)'
    spawnp = (
        f'import os; env = dict(os.environ, PATH="{ws}/bin"); '
        f'os.waitpid(os.posix_spawnp("mk", ["mk", "{out}/spawnp"], env), 0)'
    )
    vfork = f'import subprocess; subprocess.run(["{mk}", "{out}/vfork"])'
    script = f"""
cp /usr/bin/mkdir {mk} && cp /usr/bin/touch {ws}/bin/named
printf '#!/bin/sh\\nmkdir {out}/chain\\n' > interp.sh && chmod +x interp.sh
env {out}/chain.sh; echo chain=$?
env {out}/rel.sh {out}/rel; echo rel=$?
env {LOADER} --argv0 x --library-path /nowhere --inhibit-cache {mk} {out}/ldopts; echo ldopts=$?
cp {LOADER} {ws}/ld.so && env {ws}/ld.so {mk} {out}/ldcopy; echo ldcopy=$?
env {LOADER} /proc/self/cwd/bin/mk {out}/ldcwd; echo ldcwd=$?
ln {mk} {ws}/hardlink && env {ws}/hardlink {out}/hardlink; echo hardlink=$?
python3 unlinked.py tmpfile {out}/tmpfile
python3 unlinked.py deleted {out}/deleted
exec 200<{ws}/bin
env /proc/self/fd/200/mk {out}/dirfd; echo dirfd=$?
exec 200<&-
{py} {shlex.quote(spawn)}; echo spawn=$?
{py} {shlex.quote(spawnp)}; echo spawnp=$?
{py} {shlex.quote(vfork)}; echo vfork=$?
env PATH={ws}/bin mk {out}/pathsearch; echo pathsearch=$?
env -u EXECGATE_SNAPSHOT EXECGATE_SNAPSHOT=/dev/null {mk} {out}/snapvar; echo snapvar=$?
rm {ws}/bin/named && cp /usr/bin/touch {ws}/bin/named  # a watched change: republished
env true
env {mk} {out}/republished; echo republished=$?
echo alive
"""
    stdout, stderr, log = run_session(user, base, rules, script)
    assert "alive" in stdout, (stdout, stderr)
    names = ["chain", "rel", "ldopts", "ldcopy", "ldcwd", "hardlink", "tmpfile", "deleted"]
    names += ["dirfd", "spawn", "spawnp", "vfork", "pathsearch", "snapvar", "republished"]
    assert _made(out, names) == [], (stdout, stderr, log)
    # the escalated Python really was escalated (its children were the gate's to place)
    assert any("escalated /usr/bin/python3 -c" in line for line in log), log
    inside = [line for line in log if ": run inside the sandbox: " in line]
    assert len(inside) >= 13, log


def test_a_memfd_the_sandbox_wrote_does_not_run_outside(place: tuple[Any, Path]) -> None:
    """The sandbox writes a program into a memfd (not sealed: plain workspace-write leaves
    `memfd_create` alone) and has the escalated `env` exec it as `/proc/self/fd/N` (the claim
    hands the escalated program every inheritable descriptor) or as `/proc/PID/fd/N` of the
    confined caller (the escalated env may open it: it runs outside Landlock's scope)."""
    user, base = place
    ws, out = folders(base)
    (ws / "memfd.py").write_text(MEMFD)
    rules = 'prefix_rule(["env"], "allow")\n'
    runs = [("script", "self"), ("binary", "self"), ("script", "pid"), ("binary", "pid")]
    script = "".join(f"python3 memfd.py {k} {v} {out}/{k}-{v}\n" for k, v in runs)
    stdout, stderr, log = run_session(user, base, rules, script + "echo alive\n")
    assert "alive" in stdout, (stdout, stderr)
    assert _made(out, [f"{k}-{v}" for k, v in runs]) == [], (stdout, stderr, log)


def test_the_loaders_target_through_an_inherited_directory_descriptor_runs_inside(
    place: tuple[Any, Path],
) -> None:
    """`ld.so /proc/self/fd/N/prog` (also `/dev/fd/N/prog`) where N is a directory of the
    workspace the confined caller opened: the loader opens its target by that path in the
    escalated process after the judgement. (The same program named directly is caught: the
    client sends its descriptor, whose canonical path is in the workspace.)"""
    user, base = place
    ws, out = folders(base)
    rules = 'prefix_rule(["env"], "allow")\n'
    script = f"""
cp /usr/bin/mkdir {ws}/mk
exec 200<{ws}
env {LOADER} /proc/self/fd/200/mk {out}/procfd; echo procfd=$?
env {LOADER} /dev/fd/200/mk {out}/devfd; echo devfd=$?
echo alive
"""
    stdout, stderr, log = run_session(user, base, rules, script)
    assert "alive" in stdout, (stdout, stderr)
    assert _made(out, ["procfd", "devfd"]) == [], (stdout, stderr, log)


@pytest.mark.parametrize("kind", ["script", "binary"])
def test_a_file_the_sandbox_writes_through_an_inherited_descriptor_runs_inside(
    place: tuple[Any, Path], kind: str
) -> None:
    """`execgate run … > outside/session.log`: the confined shell's stdout is that file."""
    user, base = place
    ws, out = folders(base)
    (ws / "h.py").write_text(STDOUT_FILE)
    (base / "r.rules").write_text('prefix_rule(["env"], "allow")\n')
    give_to(base, user)
    witness, log = out / "stdout-file", out / "session.log"
    cmd = [sys.executable, "-m", "execgate", "run", "--rules", str(base / "r.rules"), *MODE,
           "--", "bash", "-c", f"python3 h.py {kind} {witness}; echo alive >&2"]  # fmt: skip
    shell = ["sh", "-c", f"exec {shlex.join(cmd)} > {shlex.quote(str(log))}"]
    path = f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    env = {"EXECGATE_HOME": str(base / "home"), "PATH": path, "LANG": "C.UTF-8"}
    if user is None:
        r = subprocess.run(shell, cwd=ws, env={**os.environ, **env}, capture_output=True,
                           timeout=60)  # fmt: skip
    else:
        r = user.run(shell, cwd=ws, env=env, timeout=60)
    stderr = r.stderr.decode()
    assert "alive" in stderr, stderr
    assert not witness.exists(), stderr


def test_a_writable_root_named_through_a_symlink_is_an_ask_folder_by_its_real_path(
    place: tuple[Any, Path],
) -> None:
    """`--writable-root LINK` (LINK a symlink to a folder): the escalated snapshot and the
    server's check list the canonical folder, so a binary there asks and runs inside, by
    either name."""
    user, base = place
    _, out = folders(base)
    (base / "real").mkdir()
    (base / "link").symlink_to(base / "real")
    rules = 'prefix_rule(["env"], "allow")\n'
    script = f"""
cp /usr/bin/mkdir {base}/link/mk; echo copied=$?
env {base}/link/mk {out}/bylink; echo bylink=$?
env {base}/real/mk {out}/byreal; echo byreal=$?
echo alive
"""
    options = ("--writable-root", str(base / "link"))
    stdout, stderr, log = run_session(user, base, rules, script, options)
    assert "alive" in stdout, (stdout, stderr)
    assert _made(out, ["bylink", "byreal"]) == [], (stdout, stderr, log)
    assert "copied=0" in stdout, (stdout, stderr)  # the root is writable through the link
    assert len([line for line in log if "is where the sandbox can write" in line]) == 2, log
