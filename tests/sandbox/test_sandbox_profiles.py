"""Each sandbox profile enforced for real: bash scripts run through execgate-launch with the
``sandbox`` flag try writes, execs and connections and report what the kernel allowed."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from egtest_launch import PYTHON, Result, env_list, run, run_in, sandboxed, sh

from execgate.gate.launcher import Launcher
from execgate.sandbox import SandboxSpec, SandboxSupport, build_spec

# check NAME CMD…: prints NAME=ok, or NAME=fail:<output> (one line).
CHECK = r"""
check() { local n=$1; shift; local o; if o=$("$@" 2>&1); then echo "$n=ok";
          else o=${o//$'\n'/ }; echo "$n=fail:$o"; fi; }
"""


def checks(spec: SandboxSpec | None, body: str, cwd: Path, **env: str) -> dict[str, str]:
    result = sandboxed(spec, CHECK + body, cwd=cwd, env={**_env(), **env})
    assert result.code == 0, result
    found = {}
    for line in result.output.splitlines():
        name, sep, value = line.partition("=")
        if sep:
            found[name] = value
    return found


def _env() -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in (e.split(b"=", 1) for e in env_list())}


REFUSED = ("Permission denied", "Read-only file system")  # Landlock, read-only mount


def denied(value: str, how: str | None = None) -> bool:
    reasons = REFUSED if how is None else (how,)
    return value.startswith("fail:") and any(r in value for r in reasons)


def spec_for(mode: str, cwd: Path, **kw: object) -> SandboxSpec:
    return build_spec(mode, cwd=cwd, env={"TMPDIR": "/tmp"}, **kw)  # type: ignore[arg-type]


# -- filesystem ------------------------------------------------------------------------------


def test_read_only_allows_reading_and_devices_but_no_write(workspace: Path, outside: Path) -> None:
    (outside / "existing").write_text("keep")
    found = checks(
        spec_for("read-only", workspace),
        f"""
        check read_etc cat /etc/passwd
        check list_root ls /
        check w_cwd sh -c 'echo x > {workspace}/f'
        check w_tmp sh -c 'echo x > /tmp/egt-ro-$$'
        check w_outside sh -c 'echo x > {outside}/f'
        check trunc_outside truncate -s 0 {outside}/existing
        check rm_outside rm -f {outside}/existing
        check dev_null sh -c 'echo x > /dev/null'
        check dev_zero head -c 4 /dev/zero
        check dev_urandom head -c 4 /dev/urandom
        check pty {PYTHON} -S -c 'import os; os.openpty()'
        """,
        cwd=workspace,
    )
    assert found["read_etc"] == found["list_root"] == "ok"
    for key in ("w_cwd", "w_tmp", "w_outside", "trunc_outside", "rm_outside"):
        assert denied(found[key]), (key, found[key])
    for key in ("dev_null", "dev_zero", "dev_urandom", "pty"):
        assert found[key] == "ok", (key, found[key])
    assert (outside / "existing").read_text() == "keep"


def test_given_stdout_file_can_be_reopened_but_nothing_next_to_it(
    workspace: Path, outside: Path
) -> None:
    """/dev/stdout on a file outside every writable root: the inode the descriptor names is
    granted with the descriptor's own access, its neighbours are not."""
    log = outside / "log"
    spec = spec_for("read-only", workspace)

    async def go() -> Result:
        launcher = await Launcher.start(spec, new_session=True)
        try:
            with open(log, "ab") as out:
                script = f"echo one; echo two >> /dev/stdout; echo x > {outside}/neighbour"
                return await run_in(
                    launcher, ["/bin/bash", "-c", script], cwd=workspace, fds={1: out.fileno()}
                )
        finally:
            await launcher.shutdown()

    result = run(go)
    assert log.read_text() == "one\ntwo\n"
    assert denied("fail:" + result.output) and not (outside / "neighbour").exists()


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_metadata_outside_the_roots_cannot_change(
    mode: str, workspace: Path, outside: Path
) -> None:
    """chmod, chown, utimes and xattrs are no Landlock rights: the read-only mount tree is
    what stops them (for root, on every file of the system)."""
    target = outside / "target"
    target.write_text("x")
    target.chmod(0o600)
    before = target.stat()
    found = checks(
        spec_for(mode, workspace),
        f"""
        check chmod chmod 4777 {target}
        check utime touch -d 2000-01-01 {target}
        check chown chown 0:0 {target}
        check xattr {PYTHON} -S -c 'import os; os.setxattr("{target}", "user.eg", b"1")'
        check inside_chmod sh -c 'touch f && chmod 700 f'
        """,
        cwd=workspace,
    )
    for key in ("chmod", "utime", "chown", "xattr"):
        assert denied(found[key], "Read-only file system"), (key, found[key])
    after = target.stat()
    assert (after.st_mode, after.st_mtime_ns) == (before.st_mode, before.st_mtime_ns)
    assert found["inside_chmod"] == ("ok" if mode == "workspace-write" else found["inside_chmod"])


def test_workspace_write_allows_the_roots_and_nothing_else(
    workspace: Path, outside: Path, tmp_path: Path
) -> None:
    extra = outside / "extra"
    extra.mkdir()
    (outside / "existing").write_text("keep")
    spec = spec_for("workspace-write", workspace, writable_roots=[extra])
    found = checks(
        spec,
        f"""
        check w_cwd sh -c 'echo x > f && mkdir d && mv f d/g && ln -s d/g s && ln d/g h && rm -r d'
        check w_tmp sh -c 'echo x > {tmp_path}/f'
        check w_shm sh -c 'echo x > /dev/shm/egt-$$ && rm /dev/shm/egt-$$'
        check w_extra sh -c 'echo x > {extra}/f'
        check w_outside sh -c 'echo x > {outside}/f'
        check mv_out mv {workspace}/h {outside}/h
        check trunc_outside truncate -s 0 {outside}/existing
        check w_home sh -c 'echo x > /root/.egt-test'
        """,
        cwd=workspace,
    )
    for key in ("w_cwd", "w_tmp", "w_shm", "w_extra"):
        assert found[key] == "ok", (key, found[key])
    for key in ("w_outside", "mv_out", "trunc_outside", "w_home"):
        assert denied(found[key]), (key, found[key])
    assert (extra / "f").exists() and (tmp_path / "f").exists()
    assert not (outside / "f").exists() and (outside / "existing").read_text() == "keep"


def test_tmp_and_tmpdir_can_be_excluded(workspace: Path, outside: Path, tmp_path: Path) -> None:
    tmpdir = outside / "tmpdir"
    tmpdir.mkdir()
    script = f"""
        check w_tmp sh -c 'echo x > {tmp_path}/f'
        check w_shm sh -c 'echo x > /dev/shm/egt-$$ && rm /dev/shm/egt-$$'
        check w_tmpdir sh -c 'echo x > {tmpdir}/f'
    """
    env = {"TMPDIR": str(tmpdir)}
    default = build_spec("workspace-write", cwd=workspace, env=env)
    found = checks(default, script, cwd=workspace)
    assert found == {"w_tmp": "ok", "w_shm": "ok", "w_tmpdir": "ok"}
    no_tmp = build_spec("workspace-write", cwd=workspace, env=env, exclude_tmp=True)
    found = checks(no_tmp, script, cwd=workspace)
    assert denied(found["w_tmp"]) and denied(found["w_shm"]) and found["w_tmpdir"] == "ok"
    no_tmpdir = build_spec("workspace-write", cwd=workspace, env=env, exclude_tmpdir=True)
    found = checks(no_tmpdir, script, cwd=workspace)
    assert found["w_tmp"] == "ok" and denied(found["w_tmpdir"])


# -- .git & co. ------------------------------------------------------------------------------


def make_repo(path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / ".codex").mkdir()
    (path / ".execgate").mkdir()


GIT_PROBES = """
check w_git_config sh -c 'echo "[x]" >> .git/config'
check new_in_git touch .git/hooks/post-commit
check rm_git rm -rf .git
check mv_git mv .git moved
check w_codex touch .codex/x
check w_execgate touch .execgate/x
check w_work sh -c 'echo x > work.txt'
check git_reads git rev-parse --git-dir
"""


def test_git_codex_and_execgate_stay_read_only_inside_a_writable_root(workspace: Path) -> None:
    make_repo(workspace)
    found = checks(spec_for("workspace-write", workspace), GIT_PROBES, cwd=workspace)
    for key in ("w_git_config", "new_in_git", "rm_git", "mv_git", "w_codex", "w_execgate"):
        assert found[key].startswith("fail:"), (key, found[key])
    assert denied(found["w_git_config"], "Read-only file system")
    assert found["w_work"] == "ok" and found["git_reads"] == "ok"
    assert (workspace / ".git" / "config").read_text().count("[x]") == 0
    assert not (workspace / ".git" / "hooks" / "post-commit").exists()


def test_writable_git_lifts_only_the_git_protection(workspace: Path) -> None:
    make_repo(workspace)
    spec = spec_for("workspace-write", workspace, writable_git=True)
    found = checks(spec, GIT_PROBES.replace("check rm_git rm -rf .git\n", ""), cwd=workspace)
    assert found["w_git_config"] == "ok" and found["new_in_git"] == "ok"
    assert found["w_codex"].startswith("fail:") and found["w_execgate"].startswith("fail:")


def test_protection_covers_extra_roots_git_files_and_a_git_made_after_start(
    workspace: Path, outside: Path
) -> None:
    extra = outside / "other"
    make_repo(extra)
    (workspace / ".git").write_text("gitdir: /somewhere/else\n")  # a worktree-style .git file
    late = outside / "late"
    late.mkdir()
    spec = spec_for("workspace-write", workspace, writable_roots=[extra, late])

    async def go() -> dict[str, str]:
        launcher = await Launcher.start(spec, new_session=True)
        try:
            (late / ".git").mkdir()  # after the launcher started, before the spawn
            result = await sh(
                launcher,
                CHECK
                + f"""
                check extra_git touch {extra}/.git/x
                check extra_work touch {extra}/x
                check git_file sh -c 'echo "gitdir: /evil" > .git'
                check late_git touch {late}/.git/x
                """,
                cwd=workspace,
            )
            return dict(line.split("=", 1) for line in result.output.splitlines())
        finally:
            await launcher.shutdown()

    found = run(go)
    assert found["extra_git"].startswith("fail:") and found["extra_work"] == "ok"
    assert found["git_file"].startswith("fail:")
    assert found["late_git"].startswith("fail:")
    assert (workspace / ".git").read_text() == "gitdir: /somewhere/else\n"


def test_read_only_carve_out_keeps_its_unix_socket_reachable(workspace: Path) -> None:
    """What the session directory gets when it lies inside a writable root."""
    session = workspace / "session"
    session.mkdir()
    spec = spec_for("workspace-write", workspace).with_gate_paths(session_dir=session)
    assert session in spec.readonly_paths and not spec.allows_write(session / "gate.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(session / "gate.sock"))
        server.listen(8)
        found = checks(
            spec,
            f"""
            check replace_socket sh -c 'rm -f session/gate.sock'
            check new_file touch session/policy.snap
            check connect {PYTHON} -S -c 'import socket; socket.socket(socket.AF_UNIX).connect("session/gate.sock")'
            """,  # noqa: E501
            cwd=workspace,
        )
    assert found["replace_socket"].startswith("fail:") and found["new_file"].startswith("fail:")
    assert found["connect"] == "ok"


# -- network ---------------------------------------------------------------------------------


@pytest.fixture
def tcp_listener() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield s


@pytest.fixture
def udp_receiver() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(5)
        yield s


NET_PROBES = """
check tcp {py} -S -c 'import socket; socket.create_connection(("127.0.0.1", {tcp}), 5)'
check udp {py} -S -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"ping", ("127.0.0.1", {udp}))'
check tcp6 {py} -S -c 'import socket; socket.socket(socket.AF_INET6)'
check netlink {py} -S -c 'import socket; socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)'
check unix {py} -S -c 'import socket; socket.socket(socket.AF_UNIX).connect("{unix}")'
check unix_pair {py} -S -c 'import socket; socket.socketpair()'
check bash_tcp bash -c 'exec 3<>/dev/tcp/127.0.0.1/{tcp}'
"""  # noqa: E501


@pytest.fixture
def unix_listener(outside: Path) -> Iterator[Path]:
    path = outside / "outside.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))
        s.listen(16)
        yield path


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_network_off_blocks_tcp_and_udp_but_not_unix_sockets(
    mode: str,
    workspace: Path,
    tcp_listener: socket.socket,
    udp_receiver: socket.socket,
    unix_listener: Path,
) -> None:
    body = NET_PROBES.format(
        py=PYTHON,
        tcp=tcp_listener.getsockname()[1],
        udp=udp_receiver.getsockname()[1],
        unix=unix_listener,
    )
    found = checks(spec_for(mode, workspace), body, cwd=workspace)
    for key in ("tcp", "udp", "tcp6", "netlink", "bash_tcp"):
        assert denied(found[key], "Operation not permitted"), (key, found[key])
    assert found["unix"] == "ok" and found["unix_pair"] == "ok"


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_network_on_allows_tcp_and_udp(
    mode: str,
    workspace: Path,
    tcp_listener: socket.socket,
    udp_receiver: socket.socket,
    unix_listener: Path,
) -> None:
    body = NET_PROBES.format(
        py=PYTHON,
        tcp=tcp_listener.getsockname()[1],
        udp=udp_receiver.getsockname()[1],
        unix=unix_listener,
    )
    found = checks(spec_for(mode, workspace, network=True), body, cwd=workspace)
    assert all(value == "ok" for value in found.values()), found
    assert udp_receiver.recvfrom(16)[0] == b"ping"


def test_unix_sockets_work_without_a_sandbox_too(workspace: Path, unix_listener: Path) -> None:
    connect = f"import socket; socket.socket(socket.AF_UNIX).connect('{unix_listener}')"
    found = checks(None, f'check unix {PYTHON} -S -c "{connect}"', cwd=workspace)
    assert found["unix"] == "ok"


LANDLOCK_NET = """
import errno, socket, sys
s = socket.socket(fileno=3)
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
    print("connect=ok")
except OSError as e:
    print("connect=" + errno.errorcode[e.errno])
b = socket.socket(fileno=4)
try:
    b.bind(("127.0.0.1", 0))
    print("bind=ok")
except OSError as e:
    print("bind=" + errno.errorcode[e.errno])
"""


def test_landlock_denies_tcp_even_on_a_socket_made_outside(
    workspace: Path, support: SandboxSupport, tcp_listener: socket.socket
) -> None:
    """The second layer: a TCP socket handed in from outside (seccomp never sees its
    creation) still cannot connect or bind (Landlock ABI >= 4)."""
    if support.landlock_abi < 4:
        pytest.skip("Landlock ABI < 4: no TCP rules")
    port = str(tcp_listener.getsockname()[1])

    def attempt(spec: SandboxSpec) -> dict[str, str]:
        with socket.socket() as c, socket.socket() as b:
            result = sandboxed(
                spec, f"exec {PYTHON} -S -c '{LANDLOCK_NET}' {port}", cwd=workspace,
                fds={3: c.fileno(), 4: b.fileno()},
            )  # fmt: skip
        return dict(line.split("=") for line in result.output.split())

    assert attempt(spec_for("workspace-write", workspace)) == {
        "connect": "EACCES",
        "bind": "EACCES",
    }
    on = attempt(spec_for("workspace-write", workspace, network=True))
    assert on == {"connect": "ok", "bind": "ok"}


ABSTRACT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1].replace("@", "\\0", 1))
    print("ok")
except OSError as e:
    print(e.strerror)
"""


def test_abstract_unix_sockets_outside_are_unreachable_with_the_network_off(
    workspace: Path, support: SandboxSupport
) -> None:
    if support.landlock_abi < 6:
        pytest.skip("Landlock ABI < 6: no abstract socket scoping")
    name = f"@execgate-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(name.replace("@", "\0", 1))
        server.listen(4)
        script = f"exec {PYTHON} -S -c '{ABSTRACT}' {name}"
        off = sandboxed(spec_for("workspace-write", workspace), script, cwd=workspace)
        on = sandboxed(spec_for("workspace-write", workspace, network=True), script, cwd=workspace)
    assert off.output.strip() == "Operation not permitted"
    assert on.output.strip() == "ok"


# -- exec ------------------------------------------------------------------------------------


def test_strict_exec_refuses_a_copied_binary(workspace: Path) -> None:
    shutil.copy("/bin/true", workspace / "mytrue")
    (workspace / "script.sh").write_text("#!/bin/sh\necho script ran\n")
    (workspace / "script.sh").chmod(0o755)
    body = """
        check system /bin/true
        check copied ./mytrue
        check script ./script.sh
        check script_via_sh sh ./script.sh
    """
    strict = checks(spec_for("workspace-write", workspace, strict_exec=True), body, cwd=workspace)
    assert strict["system"] == "ok"
    assert denied(strict["copied"]) and denied(strict["script"])
    assert strict["script_via_sh"] == "ok"  # an interpreter reading a file is not an exec
    loose = checks(spec_for("workspace-write", workspace), body, cwd=workspace)
    assert loose["copied"] == "ok" and loose["script"] == "ok"
    listed = spec_for("workspace-write", workspace, strict_exec=True, exec_dirs=[workspace])
    assert checks(listed, body, cwd=workspace)["copied"] == "ok"


def test_strict_exec_keeps_the_gate_wrapper_executable(workspace: Path) -> None:
    from execgate.native import WRAPPER, native_path

    wrapper = native_path(WRAPPER)
    found = checks(
        spec_for("read-only", workspace, strict_exec=True),
        f"check wrapper {wrapper}",  # usage error (status 2), not EACCES (126)
        cwd=workspace,
    )
    assert "Permission denied" not in found["wrapper"]


# -- escalation, shells, kernel surfaces -----------------------------------------------------


def test_an_unsandboxed_spawn_writes_and_connects_where_the_sandbox_forbids_it(
    workspace: Path, outside: Path, tcp_listener: socket.socket
) -> None:
    make_repo(workspace)
    port = tcp_listener.getsockname()[1]
    body = (
        CHECK
        + f"""
        check w_outside sh -c 'echo x > {outside}/f'
        check w_git touch .git/escalated
        check tcp {PYTHON} -S -c 'import socket; socket.create_connection(("127.0.0.1", {port}), 5)'
        """
    )

    async def go() -> tuple[dict[str, str], dict[str, str]]:
        launcher = await Launcher.start(spec_for("workspace-write", workspace), new_session=True)
        try:
            inside = await sh(launcher, body, cwd=workspace, sandboxed=True)
            escalated = await sh(launcher, body, cwd=workspace, sandboxed=False)
        finally:
            await launcher.shutdown()

        def parse(out: str) -> dict[str, str]:
            return dict(line.split("=", 1) for line in out.splitlines())

        return parse(inside.output), parse(escalated.output)

    inside, escalated = run(go)
    assert all(v.startswith("fail:") for v in inside.values()), inside
    assert escalated == {"w_outside": "ok", "w_git": "ok", "tcp": "ok"}


@pytest.mark.parametrize("mode", ["read-only", "workspace-write"])
def test_bash_dash_and_python_run_inside(mode: str, workspace: Path) -> None:
    found = checks(
        spec_for(mode, workspace),
        f"""
        check bash bash -c 'x=$(echo sub | tr a-z A-Z); [ "$x" = SUB ]'
        check dash dash -c 'echo a | cat >/dev/null'
        check python {PYTHON} -c 'import subprocess; subprocess.run(["true"], check=True)'
        check stdout_reopen sh -c 'echo x > /dev/stdout'
        """,
        cwd=workspace,
    )
    assert all(v == "ok" for v in found.values()), found


def test_confined_processes_have_no_capabilities_and_no_new_privileges(workspace: Path) -> None:
    result = sandboxed(
        spec_for("workspace-write", workspace),
        "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status",
        cwd=workspace,
    )
    status = dict(line.split(":\t") for line in result.output.splitlines())
    assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"
    for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[key], 16) == 0, (key, status[key])


KERNEL_SURFACES = """
import ctypes, errno, fcntl, os, termios
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
r = libc.syscall(425, 8, params)  # io_uring_setup
print("io_uring=" + ("ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]))
leader, follower = os.openpty()
try:
    fcntl.ioctl(follower, termios.TIOCSTI, b"x")
    print("tiocsti=ok")
except OSError as e:
    print("tiocsti=" + errno.errorcode[e.errno])
"""


def test_io_uring_and_terminal_injection_are_refused(workspace: Path) -> None:
    result = sandboxed(
        spec_for("workspace-write", workspace, network=True),
        f"exec {PYTHON} -S -c '{KERNEL_SURFACES}'",
        cwd=workspace,
    )
    assert dict(line.split("=") for line in result.output.split()) == {
        "io_uring": "ENOSYS",
        "tiocsti": "EPERM",
    }


def test_confined_processes_cannot_signal_unconfined_ones(
    workspace: Path, support: SandboxSupport
) -> None:
    if support.landlock_abi < 6:
        pytest.skip("Landlock ABI < 6: no signal scoping")

    async def go() -> tuple[str, str]:
        launcher = await Launcher.start(spec_for("workspace-write", workspace), new_session=True)
        try:
            with open(os.devnull, "r+b") as null:
                target = await launcher.spawn(
                    path=b"/bin/sleep", argv=[b"sleep", b"100"], env=env_list(), cwd=b"/",
                    fds={0: null.fileno()}, sandboxed=False,
                )  # fmt: skip
            script = f"kill -TERM {target.pid} 2>&1; sleep 100 & kill -TERM $! && echo own-ok"
            inside = await sh(launcher, script, cwd=workspace)
            return inside.output, "alive" if target.returncode is None else "dead"
        finally:
            await launcher.shutdown()

    output, target = run(go)
    assert "Operation not permitted" in output and "own-ok" in output
    assert target == "alive"


PTRACE = "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
PTRACE += "print(libc.ptrace(16, int(sys.argv[1]), 0, 0), ctypes.get_errno())"  # PTRACE_ATTACH


def test_confined_processes_cannot_reach_into_unconfined_ones(workspace: Path) -> None:
    """An escalated program (same uid) cannot be ptraced, nor its memory, environment or
    working directory read through /proc, from inside: it would be a way out."""

    async def go() -> dict[str, str]:
        launcher = await Launcher.start(spec_for("workspace-write", workspace), new_session=True)
        try:
            with open(os.devnull, "r+b") as null:
                target = await launcher.spawn(
                    path=b"/bin/sleep", argv=[b"sleep", b"100"], env=env_list(), cwd=b"/",
                    fds={0: null.fileno()}, sandboxed=False,
                )  # fmt: skip
            pid = target.pid
            result = await sh(
                launcher,
                CHECK
                + f"""
                check mem head -c1 /proc/{pid}/mem
                check environ cat /proc/{pid}/environ
                check cwd ls /proc/{pid}/cwd/
                check ptrace sh -c '[ "$({PYTHON} -S -c "{PTRACE}" {pid})" = "-1 1" ]'
                """,
                cwd=workspace,
            )
            return dict(line.split("=", 1) for line in result.output.splitlines())
        finally:
            await launcher.shutdown()

    found = run(go)
    assert denied(found["mem"]) and denied(found["environ"]) and denied(found["cwd"])
    assert found["ptrace"] == "ok"  # ptrace(PTRACE_ATTACH) returned -1 with EPERM


def test_an_unprivileged_launcher_protects_git_through_a_user_namespace(
    support: SandboxSupport, workspace: Path, outside: Path
) -> None:
    if support.mount_namespace is None or not support.user_namespaces:
        pytest.skip("no user namespaces")
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root to switch to an unprivileged user")
    make_repo(workspace)
    for path in (workspace, outside):
        subprocess.run(["chmod", "-R", "a+rwX", str(path)], check=True)
    mine = outside / "mine"
    mine.write_text("x")
    os.chown(mine, 65534, 65534)
    spec = spec_for("workspace-write", workspace)

    async def go() -> dict[str, str]:
        from execgate.gate.channel import Channel
        from execgate.native import LAUNCHER, native_path

        ours, theirs = socket.socketpair()
        args = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
        args += [str(native_path(LAUNCHER)), "--control", str(theirs.fileno())]
        process = subprocess.Popen(
            args + spec.launcher_args(), pass_fds=(theirs.fileno(),), start_new_session=True
        )
        theirs.close()
        launcher = Launcher(process, Channel(ours), spec)
        try:
            result = await sh(
                launcher,
                CHECK
                + f"""
                check uid test "$(id -u)" = 65534
                check w_work sh -c 'echo x > work.txt'
                check w_git sh -c 'echo x >> .git/config'
                check w_outside sh -c 'echo x > {outside}/f'
                check chmod_own chmod 777 {mine}
                """,
                cwd=workspace,
            )
            return dict(line.split("=", 1) for line in result.output.splitlines())
        finally:
            await launcher.shutdown()

    found = run(go)
    assert found["uid"] == "ok" and found["w_work"] == "ok"
    assert denied(found["w_git"], "Read-only file system")
    assert found["w_outside"].startswith("fail:")
    assert denied(found["chmod_own"], "Read-only file system")  # its own file, via the userns


def test_a_sandboxed_spawn_runs_through_run_in(workspace: Path) -> None:
    async def go() -> str:
        launcher = await Launcher.start(spec_for("read-only", workspace), new_session=True)
        try:
            return (await run_in(launcher, ["/bin/echo", "hello"], cwd=workspace)).output
        finally:
            await launcher.shutdown()

    assert run(go) == "hello\n"
