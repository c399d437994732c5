"""The policy snapshot fast path (protocol §6): ask only about programs it names."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess

import pytest

from execgate.gate.content import ContentIndex, RuleFile
from execgate.gate.snapshot import Snapshot, with_ask_folders

from .gateserver import encode_snapshot
from .support import Gate, marker


def asked(gate: Gate) -> list[bytes]:
    return [q.path for q in gate.server.requests]


def test_unnamed_programs_do_not_ask(gate: Gate) -> None:
    gate.server.write_snapshot(encode_snapshot([b"forbidden", b"rm"]))
    r = gate.sh("/bin/true; /bin/echo a | cat; allowed b; forbidden c; echo rc=$?")
    assert r.stdout == b"a\nallowed:b\nrc=126\n"
    # the binaries decide locally; `allowed` is a script, and scripts always ask (their
    # interpreter can be a link or another script: only the server follows that)
    assert asked(gate) == [str(gate.bin / "allowed").encode(), str(gate.bin / "forbidden").encode()]
    assert not gate.forbidden_ran()


def test_fast_path_needs_no_server(gate: Gate) -> None:
    """With the snapshot saying "nobody cares", nothing connects at all."""
    sess = gate.work / "other-session"
    sess.mkdir()
    (sess / "policy.snap").write_bytes(encode_snapshot([b"forbidden"]))
    env = dict(gate.env, EXECGATE_SOCKET=str(sess / "gate.sock"))
    r = gate.run(["bash", "-c", "/bin/echo fast; forbidden; echo rc=$?"], env=env)
    assert r.stdout == b"fast\nrc=126\n"
    assert b"execgate server unreachable" in r.stderr


def test_match_by_each_name(gate: Gate) -> None:
    w = gate.work
    tool = shutil.copy("/bin/echo", w / "tool")
    os.symlink(tool, w / "viaLink")
    moved = shutil.copy("/bin/echo", w / "moved")
    st = os.stat(moved)
    os.rename(moved, w / "renamed")
    cases = [
        ([b"tool"], [], "./tool x", True),  # basename(PATH)
        ([b"tool"], [], "./viaLink x", True),  # basename(REALPATH)
        ([str(w / "viaLink").encode()], [], "./viaLink x", False),  # PATH is w/./viaLink
        ([(str(w) + "/./viaLink").encode()], [], "./viaLink x", True),  # PATH exactly
        ([str(w / "tool").encode()], [], "./viaLink x", True),  # REALPATH
        ([], [(st.st_dev, st.st_ino)], "./renamed x", True),  # (DEV, INO): renamed
        ([b"echo"], [], "./renamed x", False),
    ]
    for names, files, cmd, expect in cases:
        gate.server.clear()
        gate.server.write_snapshot(encode_snapshot(names, files))
        r = gate.sh(cmd)
        assert r.stdout == b"x\n"
        assert bool(gate.server.requests) == expect, (names, files, cmd)


def test_the_canonical_path_through_symlinks(gate: Gate) -> None:
    """REALPATH (the snapshot's canonical name) is the file's path with every symlink resolved,
    as /proc would give it: relative and absolute links, of folders and of files, chains, and
    `..` after a link (physical, not lexical)."""
    w = gate.work
    (w / "d1" / "d2").mkdir(parents=True)
    tool = shutil.copy("/bin/echo", w / "d1" / "d2" / "tool")
    os.symlink("d1/d2", w / "rel")
    os.symlink(w / "d1", w / "abs")
    os.symlink("../d2/tool", w / "d1" / "d2" / "up")
    os.symlink("rel/up", w / "chain")
    os.symlink("abs/d2/..", w / "dotdot")
    cmds = ["./rel/tool", "./abs/d2/tool", "./chain", "./dotdot/d2/./tool", f"{w}//rel///up"]
    cmds += ["./rel/../d2/tool", "d1/d2/tool"]
    gate.server.write_snapshot(encode_snapshot([os.fsencode(os.path.realpath(tool))]))
    for cmd in cmds:
        gate.server.clear()
        r = gate.sh(f"{cmd} x")
        assert r.stdout == b"x\n", cmd
        assert len(gate.server.requests) == 1, cmd
    gate.server.clear()
    gate.server.write_snapshot(encode_snapshot([os.fsencode(w / "chain")]))
    assert gate.sh("./rel/tool x").stdout == b"x\n"
    assert not gate.server.requests  # a name of the file that is not its canonical path


def test_a_program_of_a_listed_size_asks(gate: Gate) -> None:
    """A copy of a rule-named file has its size: a program of a size in the snapshot asks (the
    server tells a copy by content), also as a memfd executed by descriptor or by its
    ``/proc/self/fd`` name; a program of another size does not."""
    w = gate.work
    copy = shutil.copy("/bin/echo", w / "copy")
    size = os.stat(copy).st_size
    memfd = (
        "import os, sys\n"
        "fd = os.memfd_create('copy', 0)\n"
        "os.write(fd, open('/bin/echo', 'rb').read())\n"
        "if os.fork() == 0:\n"
        "    os.execve(f'/proc/self/fd/{fd}', ['echo', 'x'], os.environ)\n"
        "os.wait()\n"
        "os.execve(fd, ['echo', 'x'], os.environ)\n"
    )
    for sizes, expect in (([size - 1, size + 1], 0), ([1, size], 1)):
        gate.server.write_snapshot(encode_snapshot([b"unrelated"], [], sizes=sizes))
        gate.server.clear()
        assert gate.sh("./copy x").stdout == b"x\n"
        assert len(gate.server.requests) == expect, sizes
        gate.server.clear()
        r = gate.run(["python3", "-c", memfd])
        assert r.stdout == b"x\nx\n", r.stderr
        assert len(gate.server.requests) == 2 * expect, (sizes, asked(gate))


def test_files_that_the_snapshot_cannot_vouch_for_always_ask(gate: Gate) -> None:
    """A file with other hard links (one of its names may be a rule's, and the snapshot can lag
    behind a file replaced at that name) and a set-id or capability program (it would leave the
    gate) reach the server whatever the snapshot says; an ordinary file does not."""
    w = gate.work
    plain = shutil.copy("/bin/echo", w / "plain")
    linked = shutil.copy("/bin/echo", w / "linked")
    os.link(linked, w / "alias")
    setgid = shutil.copy("/bin/echo", w / "setgid")
    os.chmod(setgid, 0o2755)
    setgid_no_exec = shutil.copy("/bin/echo", w / "setgid-no-exec")
    os.chmod(setgid_no_exec, 0o2745)  # no group execute: not set-gid for the kernel
    cases = [("./plain x", False), ("./alias x", True), ("./linked x", True),
             ("./setgid x", True), ("./setgid-no-exec x", False)]  # fmt: skip
    if shutil.which("setcap") and os.geteuid() == 0:
        caps = shutil.copy("/bin/echo", w / "caps")
        subprocess.run(["setcap", "cap_net_bind_service+ep", caps], check=True)
        cases.append(("./caps x", True))
    gate.server.write_snapshot(encode_snapshot([b"unrelated"], []))
    for cmd, expect in cases:
        gate.server.clear()
        r = gate.sh(cmd)
        assert r.stdout == b"x\n", (cmd, r.stderr)
        assert bool(gate.server.requests) == expect, cmd
    assert os.path.exists(plain)


def test_a_program_in_an_ask_folder_asks(gate: Gate) -> None:
    """An escalated program's snapshot lists the folders its sandbox can write: a program
    whose canonical path lies there asks (by a link from elsewhere too); one in a folder that
    only starts with the same letters, or elsewhere, does not; "/" lists everything."""
    w = gate.work
    (w / "ws" / "bin").mkdir(parents=True)
    (w / "wsx").mkdir()
    for where in ("ws/bin/tool", "wsx/tool", "tool"):
        shutil.copy("/bin/echo", w / where)
    os.symlink(w / "ws" / "bin" / "tool", w / "link")
    cases = [("./ws/bin/tool x", True), ("./link x", True), ("./wsx/tool x", False),
             ("./tool x", False), ("/bin/echo x", False)]  # fmt: skip
    for folders, everything in (([str(w / "ws").encode(), b"/nowhere"], False), ([b"/"], True)):
        gate.server.write_snapshot(encode_snapshot([b"unrelated"], ask_folders=folders))
        for cmd, expect in cases:
            gate.server.clear()
            assert gate.sh(cmd).stdout == b"x\n", cmd
            assert bool(gate.server.requests) == (expect or everything), (folders, cmd)


def test_script_interpreter_named(gate: Gate) -> None:
    s = gate.work / "s"
    s.write_text(f"#!{gate.bin}/allowed via-interp\n")
    s.chmod(0o755)
    gate.server.write_snapshot(encode_snapshot([b"allowed"]))
    r = gate.sh("./s")
    assert r.stdout == b"allowed:via-interp ./s\n"
    assert asked(gate) == [str(gate.work).encode() + b"/./s"]
    gate.server.clear()
    gate.server.write_snapshot(encode_snapshot([str(gate.bin / "allowed").encode()]))
    gate.sh("./s")
    assert len(gate.server.requests) == 1


def test_ask_always(gate: Gate) -> None:
    gate.server.write_snapshot(encode_snapshot([b"rm"], flags=1))
    gate.sh("/bin/true; /bin/echo a")
    assert asked(gate) == [b"/bin/true", b"/bin/echo"]


def _corrupt(good: bytes, how: str) -> bytes:
    b = bytearray(good)
    if how == "magic":
        b[0:8] = b"EGSNAP2\0"
    elif how == "truncated":
        b = b[:-4]
    elif how == "names-outside":
        b[12:16] = struct.pack("<I", 1000)
    elif how == "files-offset":
        b[32:40] = struct.pack("<Q", 1 << 40)
    elif how == "unsorted":
        a, c = bytes(b[64:72]), bytes(b[72:80])
        b[64:72], b[72:80] = c, a
    elif how == "flags":
        b[8:12] = struct.pack("<I", 2)
    elif how == "sizes-outside":
        b[20:24] = struct.pack("<I", 1000)
    elif how == "sizes-unsorted":
        a, c = bytes(b[-16:-8]), bytes(b[-8:])
        b[-16:-8], b[-8:] = c, a
    elif how == "reserved":
        b[52] = 1
    elif how == "ask-folders-outside":
        b[48:52] = struct.pack("<I", 1)
        b[56:64] = struct.pack("<Q", len(b) - 2)
    elif how in ("ask-folder-relative", "ask-folder-slash", "ask-folder-nul", "ask-folder-long"):
        folder = {"ask-folder-relative": b"usr/bin", "ask-folder-slash": b"/usr/bin/",
                  "ask-folder-nul": b"/usr\0/bin", "ask-folder-long": b"/usr/bin"}[how]  # fmt: skip
        b[48:52] = struct.pack("<I", 1)
        b[56:64] = struct.pack("<Q", len(b))
        length = len(folder) + (1 if how == "ask-folder-long" else 0)
        b += struct.pack("<I", length) + folder
    elif how == "short":
        b = b[:40]
    elif how == "empty":
        b = bytearray()
    return bytes(b)


@pytest.mark.parametrize(
    "how",
    [
        "magic",
        "truncated",
        "names-outside",
        "files-offset",
        "unsorted",
        "sizes-outside",
        "sizes-unsorted",
        "flags",
        "reserved",
        "ask-folders-outside",
        "ask-folder-relative",
        "ask-folder-slash",
        "ask-folder-nul",
        "ask-folder-long",
        "short",
        "empty",
        "missing",
    ],
)
def test_malformed_snapshot_asks(gate: Gate, how: str) -> None:
    good = encode_snapshot([b"a", b"b", b"c"], [(1, 2)], sizes=[1, 2])
    if how == "missing":
        gate.server.snap_path.unlink()
    else:
        gate.server.write_snapshot(_corrupt(good, how))
    gate.sh("/bin/true")
    assert asked(gate) == [b"/bin/true"]


def test_replaced_snapshot_is_reread(gate: Gate) -> None:
    """One long-lived process: the cached snapshot is dropped when the file is replaced."""
    gate.server.write_snapshot(encode_snapshot([b"rm"]))
    code = (
        "import os, sys\n"
        "def run():\n"
        "    pid = os.posix_spawn('/bin/true', ['true'], os.environ); os.waitpid(pid, 0)\n"
        "run(); run(); print('one', flush=True)\n"
        "sys.stdin.readline()\n"
        "run(); print('two', flush=True)\n"
    )
    p = subprocess.Popen(
        ["python3", "-c", code],
        env=gate.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=gate.work,
    )
    assert p.stdout is not None and p.stdin is not None
    assert p.stdout.readline() == b"one\n"
    assert asked(gate) == []
    gate.server.write_snapshot(encode_snapshot([b"true"]))
    p.stdin.write(b"go\n")
    p.stdin.flush()
    assert p.stdout.readline() == b"two\n"
    assert p.wait(60) == 0
    assert asked(gate) == [b"/bin/true"]
    _ = marker


def test_the_servers_snapshot_is_the_documented_format() -> None:
    """The server's encoder and the independent one above agree (else every exec would ask,
    which no gating test would notice)."""
    snapshot = Snapshot(
        names={b"rm", b"git"},
        files={(3, 4), (1, 2)},
        contents=ContentIndex(
            {7: (RuleFile("/a", 1, 2, ("a",)),), 500: (RuleFile("/b", 3, 4, ("b",)),)}
        ),
    )
    expected = encode_snapshot([b"git", b"rm"], [(1, 2), (3, 4)], sizes=[7, 500])
    assert snapshot.encode() == expected
    assert snapshot.encode(ask_always=True) == encode_snapshot(
        [b"git", b"rm"], [(1, 2), (3, 4)], sizes=[7, 500], flags=1
    )
    folders = ["/home/u/ws/", "/tmp", "/home/u/ws", "/"]
    assert with_ask_folders(snapshot.encode(), folders) == encode_snapshot(
        [b"git", b"rm"],
        [(1, 2), (3, 4)],
        sizes=[7, 500],
        ask_folders=[b"/home/u/ws", b"/tmp", b"/"],
    )
