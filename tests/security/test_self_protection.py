"""execgate's own files (issue #6 item 3): installed the README's way — a virtual environment
inside the project, which is the session's writable root — or with ``pip --user`` while the
home folder is the workspace, nothing a session runs can change what execgate runs or loads,
and a session refuses to start when a native file is not the one that was installed
(``_bin/manifest.json``).

The installations are real: pip installs this checkout into a venv created inside the
workspace, or into the user scheme of the base interpreter (the dependencies come from the test
environment through a ``.pth`` file).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .securityharness import CHECKOUT

RULES = 'prefix_rule(["marker"], "forbidden", justification="marker must not run")\n'


@dataclass
class Installed:
    kind: str  # "venv" or "user"
    workspace: Path  # the session's working directory: the installation is inside it
    home: Path
    prefix: Path  # the venv, or the user base (~/.local)
    script: Path  # the `execgate` console script
    package: Path  # site-packages/execgate
    user: Any | None  # the unprivileged user owning it all (when the tests run as root)

    @property
    def bin(self) -> Path:
        return self.package / "_bin"

    def execgate(
        self, *args: str, as_user: bool = False, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """``<venv>/bin/execgate ARGS`` in the workspace, by root or by the user, who owns the
        whole installation for the occasion (a sandboxed root has no capability left, so only
        the owner's writes are stopped by nothing but execgate)."""
        if self.user is not None:
            owner = (self.user.uid, self.user.gid) if as_user else (0, 0)
            subprocess.run(
                ["chown", "-R", "-h", f"{owner[0]}:{owner[1]}", str(self.home.parent)],
                check=True,
            )
        argv = [str(self.script), *args]
        home = self.home
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(home),
            "EXECGATE_HOME": str(home / ".execgate"),
            "CODEX_HOME": str(home / ".codex"),
            "EXECGATE_SYSTEM_DIR": str(home / "etc-execgate"),
            "EXECGATE_CODEX_SYSTEM_DIR": str(home / "etc-codex"),
        }
        if as_user:
            assert self.user is not None
            argv = self.user.argv(argv)
        return subprocess.run(
            argv, env=env, cwd=self.workspace, capture_output=True, text=True, timeout=timeout
        )

    def snapshot(self) -> dict[str, str]:
        """Every file of the installation by digest; links by target."""
        found: dict[str, str] = {}
        # ~/.local/state is XDG state (execgate's logs), not the installation in ~/.local
        state = self.prefix / "state"
        for path in sorted(self.prefix.rglob("*")):
            if path == state or state in path.parents:
                continue
            if path.is_symlink():
                found[str(path)] = "-> " + os.readlink(path)
            elif path.is_file():
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            elif path.is_dir():
                found[str(path)] = "dir"
        return found


def _pip_install(python: Path, *options: str, env: dict[str, str] | None = None) -> None:
    result = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", *options, str(CHECKOUT)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]


def _purelib(python: Path, *, user: bool = False, env: dict[str, str] | None = None) -> Path:
    code = (
        "import site; print(site.getusersitepackages())"
        if user
        else "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    )
    found = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return Path(found.stdout.strip())


@pytest.fixture(scope="session", params=["venv", "user"])
def installed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Installed:
    user = None
    if os.geteuid() == 0:
        with contextlib.suppress(pytest.skip.Exception):
            user = request.getfixturevalue("unprivileged")
    root = user.make_dir() if user else tmp_path_factory.mktemp("installed")
    home = root / "home"
    home.mkdir()
    # This environment's packages (execgate's dependencies, pip) for the new installation.
    deps = sysconfig.get_paths()["purelib"] + "\n"
    if request.param == "venv":
        workspace = root / "project"
        workspace.mkdir()
        prefix = workspace / ".venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
        python = prefix / "bin" / "python"
        site = _purelib(python)
        (site / "test-dependencies.pth").write_text(deps)
        _pip_install(python)
    else:  # pip --user, the home folder being the workspace
        workspace = home
        prefix = home / ".local"
        python = Path(sys.base_prefix) / "bin" / "python3"
        env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        site = _purelib(python, user=True, env=env)
        site.mkdir(parents=True)
        (site / "test-dependencies.pth").write_text(deps)
        _pip_install(python, "--user", env=env)
    (workspace / "rules").write_text(RULES)
    package = site / "execgate"
    assert (package / "_bin" / "manifest.json").is_file()
    script = prefix / "bin" / "execgate"
    assert script.is_file()
    return Installed(request.param, workspace, home, prefix, script, package, user)


#: name -> bash that tries it (exit status 0 = it worked).
ATTACKS = {
    "append to the interposer": 'printf x >> "$BIN/libexecgate.so"',
    "replace the interposer": 'cp /bin/true "$BIN/n" && mv -f "$BIN/n" "$BIN/libexecgate.so"',
    "rename the interposer": 'mv "$BIN/libexecgate.so" "$BIN/libexecgate.off"',
    "replace the launcher": 'cp /bin/true "$BIN/execgate-launch"',
    "rename the launcher": 'mv "$BIN/execgate-launch" "$BIN/execgate-launch.off"',
    "write the wrapper": 'printf x >> "$BIN/execgate-wrapper"',
    "rename the wrapper": 'mv "$BIN/execgate-wrapper" "$BIN/w"',
    "rewrite the manifest": 'printf "{}" > "$BIN/manifest.json"',
    "edit a module": 'printf "raise SystemExit(9)\\n" >> "$PKG/cli/__init__.py"',
    "add a module": 'printf "x = 1\\n" > "$PKG/evil.py"',
    "add a .pth file": 'printf "import os\\n" > "$PKG/../evil.pth"',
    "edit the console script": 'printf "\\nexit 0\\n" >> "$SCRIPT"',
    "replace the console script": 'ln -sf /bin/true "$SCRIPT"',
    "edit the Python command line": 'printf "\\nexit 0\\n" >> "$SCRIPT-py"',
    "replace the Python command line": 'ln -sf /bin/true "$SCRIPT-py"',
}
#: Only for a venv: its interpreter and configuration.
VENV_ATTACKS = {
    "replace the venv's python": 'ln -sf /bin/sh "$PREFIX/bin/python"',
    "rename the venv's python": 'mv "$PREFIX/bin/python3" "$PREFIX/bin/python3.off"',
    "edit pyvenv.cfg": 'printf "include-system-site-packages = true\\n" >> "$PREFIX/pyvenv.cfg"',
}


def _attacks(installed: Installed) -> dict[str, str]:
    return {**ATTACKS, **(VENV_ATTACKS if installed.kind == "venv" else {})}


def _script(installed: Installed) -> str:
    lines = [
        f"BIN={installed.bin}; PKG={installed.package}; PREFIX={installed.prefix}",
        f"SCRIPT={installed.script}",
        'try_it() { name=$1; shift; ( eval "$1" ) 2>/dev/null; echo "$name=$?"; }',
    ]
    for name, attack in _attacks(installed).items():
        lines.append(f"try_it {name.replace(' ', '_').replace(chr(39), '')!r} {attack!r}")
    lines.append('printf ok > ./written && echo "workspace=$?"')
    return "\n".join(lines)


def _results(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


@pytest.mark.parametrize("strict", [False, True], ids=["workspace-write", "strict-exec"])
@pytest.mark.parametrize("who", ["root", "unprivileged"])
def test_a_session_cannot_change_what_execgate_runs_or_loads(
    installed: Installed, who: str, strict: bool
) -> None:
    if who == "unprivileged" and installed.user is None:
        pytest.skip("needs root to create the unprivileged user")
    before = installed.snapshot()
    options = ["--rules", "rules", "--sandbox", "workspace-write", *(["--strict-exec"] * strict)]
    written = installed.workspace / "written"
    written.unlink(missing_ok=True)
    result = installed.execgate(
        "run", *options, "--", "bash", "-c", _script(installed), as_user=who == "unprivileged"
    )
    assert result.returncode == 0, result.stderr
    verdicts = _results(result.stdout)
    assert verdicts.pop("workspace") == "0"  # the folder holding it is writable otherwise
    assert len(verdicts) == len(_attacks(installed))
    assert all(status != "0" for status in verdicts.values()), verdicts
    assert installed.snapshot() == before
    # The installation still works: the next session opens (the manifest checks out).
    again = installed.execgate("run", *options, "--", "true", as_user=who == "unprivileged")
    assert again.returncode == 0, again.stderr


@contextlib.contextmanager
def _replaced(path: Path, make: Any) -> Iterator[None]:
    """``path`` replaced by what ``make(path)`` creates, restored afterwards."""
    saved = path.with_name(path.name + ".saved")
    os.rename(path, saved)
    try:
        make(path)
        yield
    finally:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            path.unlink()
        os.rename(saved, path)


def _changed_copy(path: Path) -> None:
    original = path.with_name(path.name + ".saved")
    shutil.copy2(original, path)
    with path.open("ab") as handle:
        handle.write(b"\0")


def _one_line_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("execgate: error: "), lines
    for word in words:
        assert word in lines[0], lines


@pytest.mark.parametrize("name", ["libexecgate.so", "execgate-wrapper", "execgate-launch"])
@pytest.mark.parametrize("sandbox", ["off", "workspace-write"])
def test_a_session_refuses_native_files_that_differ_from_the_manifest(
    installed: Installed, name: str, sandbox: str
) -> None:
    with _replaced(installed.bin / name, _changed_copy):
        result = installed.execgate("run", "--sandbox", sandbox, "--", "true")
    _one_line_error(result, name, "not the one that was installed")
    assert installed.execgate("run", "--sandbox", sandbox, "--", "true").returncode == 0


def test_a_session_refuses_an_unreadable_interposer(installed: Installed) -> None:
    interposer = installed.bin / "libexecgate.so"
    # Not a regular file (root reads anything else): a FIFO in its place.
    with _replaced(interposer, os.mkfifo):
        result = installed.execgate("run", "--", "true", timeout=30)
    _one_line_error(result, "libexecgate.so", "not a regular file")
    if installed.user is None:
        return
    # Unreadable by the user who runs the session.
    mode = interposer.stat().st_mode
    interposer.chmod(0)
    try:
        result = installed.execgate("run", "--", "true", as_user=True, timeout=30)
    finally:
        interposer.chmod(mode)
    _one_line_error(result, "libexecgate.so", "Permission denied")
    assert installed.execgate("run", "--", "true", as_user=True).returncode == 0
