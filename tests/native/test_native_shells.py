"""Real programs under the gate: shells and the utilities that start other programs.

Every case runs a forbidden marker (denied by the server's rule: it must not run) and allowed
programs (they must run, with exactly their argv, and their exit status must come through)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from .support import Gate, marker


def argvs(gate: Gate, name: str) -> list[list[bytes]]:
    return [list(r.argv) for r in gate.server.requests if r.path.endswith(b"/" + name.encode())]


@pytest.mark.parametrize("shell", ["bash", "dash"])
def test_shell_constructs(gate: Gate, shell: str) -> None:
    script = r"""
f() { allowed "in function" "$@"; }
f one
( allowed subshell )
allowed pipe | cat
x=$(allowed subst); echo "got $x"
eval 'allowed "via eval"'
/bin/echo absolute
forbidden direct; echo "rc1=$?"
( forbidden in-subshell ); echo "rc2=$?"
echo | forbidden in-pipe; echo "rc3=$?"
y=$(forbidden in-subst); echo "rc4=$?"
eval 'forbidden via-eval'; echo "rc5=$?"
g() { forbidden "in function"; }; g; echo "rc6=$?"
sh -c 'forbidden nested-shell'; echo "rc7=$?"
exit 3
"""
    r = gate.sh(script, shell=shell)
    out = r.stdout.decode()
    assert r.returncode == 3
    assert not gate.forbidden_ran(), out
    assert "allowed:in function one" in out
    assert "allowed:subshell" in out and "allowed:pipe" in out
    assert "got allowed:subst" in out and "allowed:via eval" in out and "absolute" in out
    for i in range(1, 8):
        assert f"rc{i}=126" in out, out
    assert "forbidden ran" not in out
    err = r.stderr.decode()
    assert "execgate: denied: forbidden direct: forbidden by test rule" in err
    assert [b"allowed", b"in function", b"one"] in argvs(gate, "allowed")
    assert [b"allowed", b"via eval"] in argvs(gate, "allowed")


def test_alias(gate: Gate) -> None:
    r = gate.sh("shopt -s expand_aliases\nalias a='forbidden via-alias'\na\necho rc=$?")
    assert b"rc=126" in r.stdout
    assert not gate.forbidden_ran()


def test_env_and_env_i(gate: Gate) -> None:
    r = gate.sh(f"""
env allowed via-env
env -i {gate.bin}/allowed via-env-i
env forbidden a; echo rc1=$?
env -i {gate.bin}/forbidden b; echo rc2=$?
env -i PATH={gate.bin} /bin/sh -c 'forbidden c'; echo rc3=$?
""")
    out = r.stdout.decode()
    assert "allowed:via-env" in out and "allowed:via-env-i" in out
    assert "rc1=126" in out and "rc2=126" in out and "rc3=126" in out
    assert not gate.forbidden_ran()


def test_xargs_find_nohup_timeout(gate: Gate) -> None:
    (gate.work / "d").mkdir()
    (gate.work / "d" / "f1").write_text("")
    r = gate.sh("""
printf 'x\\ny\\n' | xargs -n1 allowed xa
printf 'x\\n' | xargs forbidden; echo rc1=$?
find d -name f1 -exec allowed found {} \\;
find d -name f1 -exec forbidden {} \\; ; echo rc2=$?
find d -name f1 -exec allowed plus {} +
nohup allowed nohup-ran 2>/dev/null
nohup forbidden n 2>/dev/null; echo rc3=$?
timeout 30 allowed timed
timeout 30 forbidden t; echo rc4=$?
""")
    out = r.stdout.decode()
    for s in (
        "allowed:xa x",
        "allowed:xa y",
        "allowed:found d/f1",
        "allowed:plus d/f1",
        "allowed:timed",
    ):
        assert s in out, out
    nohup_out = gate.work / "nohup.out"
    assert "allowed:nohup-ran" in out or "allowed:nohup-ran" in nohup_out.read_text()
    assert "rc1=126" in out or "rc1=123" in out  # xargs reports 126 (cannot run) or 123
    assert "rc3=126" in out and "rc4=126" in out
    assert not gate.forbidden_ran()


def test_make_recipes(gate: Gate) -> None:
    if not shutil.which("make"):
        pytest.skip("make not installed")
    (gate.work / "Makefile").write_text(
        "all: ok bad\nok:\n\tallowed from-make\nbad:\n\tforbidden from-make\n"
    )
    r = gate.run(["make", "-k"])
    assert b"allowed:from-make" in r.stdout
    assert r.returncode != 0
    assert not gate.forbidden_ran()
    # make runs recipes through /bin/sh (posix_spawn) or directly (execvp): both were gated
    assert any(list(req.argv)[:1] == [b"allowed"] for req in gate.server.requests)


def test_shebang_scripts(gate: Gate) -> None:
    marker(gate.work, "s1.sh", "allowed from-s1")
    s2 = gate.work / "s2"
    s2.write_text(f"#!{gate.bin}/forbidden interp-arg\nbody\n")
    s2.chmod(0o755)
    r = gate.sh("./s1.sh; ./s2; echo rc=$?")
    assert b"allowed:from-s1" in r.stdout
    assert b"rc=126" in r.stdout
    assert not gate.forbidden_ran()
    req = next(q for q in gate.server.requests if q.path.endswith(b"/s1.sh"))
    assert req.interp == b"/bin/sh" and req.interp_arg == b""
    assert req.argv == (b"./s1.sh",)
    req2 = next(q for q in gate.server.requests if q.path.endswith(b"/s2"))
    assert req2.interp == str(gate.bin / "forbidden").encode()
    assert req2.interp_arg == b"interp-arg"


def test_shebang_interpreter_is_checked(gate: Gate) -> None:
    """A script whose interpreter the rule forbids: denied on the interpreter's name."""
    from .gateserver import Deny, Run

    def rule(req):  # type: ignore[no-untyped-def]
        if req.interp.endswith(b"/forbidden"):
            return Deny("execgate: denied: interp")
        return Run()

    gate.server.rule = rule
    s = gate.work / "s3"
    s.write_text(f"#!{gate.bin}/forbidden\n")
    s.chmod(0o755)
    r = gate.sh("./s3; echo rc=$?")
    assert b"rc=126" in r.stdout and not gate.forbidden_ran()


def test_python_subprocess_os_system_posix_spawn(gate: Gate) -> None:
    code = f"""
import os, subprocess, sys
r = subprocess.run(['allowed', 'sp'], capture_output=True)   # vfork + execv, close_fds=True
print(r.returncode, r.stdout.decode().strip())
try:
    subprocess.run(['forbidden', 'x'])
except PermissionError as e:
    print('PermissionError', e.errno)
print('system', os.system('allowed os-system'))
print('system-bad', os.system('forbidden y') >> 8)
pid = os.posix_spawn('{gate.bin}/allowed', ['allowed', 'ps'], os.environ)
print('spawn', os.waitpid(pid, 0)[1])
pid = os.posix_spawn('{gate.bin}/forbidden', ['forbidden'], os.environ)
print('spawn-denied', os.waitpid(pid, 0)[1] >> 8)
r = subprocess.run('allowed shell', shell=True, capture_output=True)
print(r.stdout.decode().strip())
sys.exit(5)
"""
    r = gate.run(["python3", "-c", code])
    out = r.stdout.decode()
    assert r.returncode == 5, r.stderr
    assert "0 allowed:sp" in out
    assert "PermissionError 13" in out
    assert "allowed:os-system" in out and "system 0" in out
    assert "system-bad 126" in out
    assert "allowed:ps" in out and "spawn 0" in out
    assert "spawn-denied 126" in out  # decided by the wrapper posix_spawn starts
    assert "allowed:shell" in out
    assert not gate.forbidden_ran()
    vias = {r.via for r in gate.server.requests}
    assert {"execv", "posix_spawn", "system"} <= vias or {"execve", "posix_spawn", "system"} <= vias


def test_perl_system(gate: Gate) -> None:
    if not shutil.which("perl"):
        pytest.skip("perl not installed")
    script = (
        'system("allowed", "from-perl"); print "rc=", system("forbidden z") >> 8, "\\n";'
        ' exec("allowed", "perl-exec")'
    )
    r = gate.run(["perl", "-e", script])
    out = r.stdout.decode()
    assert "allowed:from-perl" in out and "allowed:perl-exec" in out
    assert not gate.forbidden_ran()


def test_exit_status_and_argv_exact(gate: Gate) -> None:
    weird = b"\xff\xfe-not-utf8"
    script = b'/bin/sh -c "exit 42" sh "" "$1" ""; echo rc=$?'
    r = subprocess.run(
        [b"bash", b"-c", script, b"bash", weird],
        env=gate.env,
        cwd=gate.work,
        capture_output=True,
        timeout=60,
    )
    assert b"rc=42" in r.stdout
    req = next(q for q in gate.server.requests if q.argv[:2] == (b"/bin/sh", b"-c"))
    assert req.argv == (b"/bin/sh", b"-c", b"exit 42", b"sh", b"", weird, b"")


def test_caller_side_path_search_asks_once(gate: Gate) -> None:
    """dash (and Python's os.execvp) search PATH themselves and try the next directory after
    a denial; the same file there is refused without a second question or message."""
    other = gate.work / "bin2"
    other.mkdir()
    (other / "forbidden").symlink_to(gate.bin / "forbidden")
    env = dict(gate.env, PATH=f"{gate.bin}:{other}:/usr/bin:/bin")
    r = gate.run(["dash", "-c", "forbidden x; echo rc=$?"], env=env)
    assert r.stdout == b"rc=126\n"
    assert r.stderr.count(b"execgate: denied:") == 1
    r = gate.run(["python3", "-c", "import os; os.execvp('forbidden', ['forbidden'])"], env=env)
    assert r.returncode == 1 and r.stderr.count(b"execgate: denied:") == 1
    assert len(gate.server.requests) == 2
    assert not gate.forbidden_ran()
