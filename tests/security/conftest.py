"""Fixtures for attacks from inside a gated session and for admin requirements.

* ``attacker``: a real ``execgate run``, as root or as the unprivileged user, in each sandbox
  mode, with a forbidden marker program. The marker leaves its trace inside the workspace
  (writable in every mode, so a marker that ran anywhere would be seen); ``outside`` is a folder
  no sandbox lets a confined process write (workspace-write modes exclude /tmp, where it lives),
  for witnesses of code that ran outside.
* ``world``: homes, a workspace and rules for attacks on execgate's own trust boundary, as root
  and as the unprivileged user (helpers: securityharness.py).
* ``server``, ``keys``, ``homes``, ``as_user_under_admin``: a loopback HTTP server that serves a
  requirements document and its signature (with ETag and Cache-Control), Ed25519 keys, isolated
  homes, and a way to run a command as the unprivileged user with a test folder mounted on
  ``/etc/execgate`` (a private mount namespace made as root: an ordinary user cannot do it, so it
  does not widen what the user can do; it only lets the test play the admin).
"""

from __future__ import annotations

import base64
import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .securityharness import World, end_world, new_world

MARKER_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    const char *name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    char path[4096];
    snprintf(path, sizeof path, "%s/ran-%s", TRACES, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0666);
    if (fd >= 0) { dprintf(fd, "%d\n", (int)getpid()); close(fd); }
    printf("marker ran\n");
    return 0;
}
"""

MODES = ("off", "workspace-write", "strict-exec")


@dataclass
class Attacker:
    who: str  # "root" or "user"
    base: Path
    work: Path  # the workspace (cwd of the session)
    outside: Path  # not writable from any sandbox
    bin: Path  # on PATH; holds the forbidden `marker`
    traces: Path
    env: dict[str, str]
    user: Any  # tests/conftest.py's UnprivilegedUser, or None for root
    rules: Path

    def write_rules(self, text: str) -> None:
        self.rules.write_text(textwrap.dedent(text))
        self.rules.chmod(0o644)

    def mode_options(self, mode: str) -> list[str]:
        if mode == "off":
            return ["--sandbox", "off"]
        options = ["--sandbox", "workspace-write", "--exclude-tmp"]
        if mode == "strict-exec":
            options += ["--strict-exec", "--exec-dir", str(self.bin)]
        return options

    def run(
        self,
        command: str,
        *,
        mode: str = "off",
        rules: bool = True,
        options: Sequence[str] = (),
        env: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[bytes]:
        """``execgate run [--rules] MODE-OPTIONS OPTIONS -- bash -c COMMAND`` as the attacker."""
        argv = [
            sys.executable, "-m", "execgate", "run",
            *(["--rules", str(self.rules)] if rules else []),
            *self.mode_options(mode), *options, "--", "bash", "-c", command,
        ]  # fmt: skip
        full_env = {**self.env, **(env or {})}
        if self.user is not None:
            return subprocess.run(
                self.user.argv(argv),
                env=full_env,
                cwd=self.work,
                capture_output=True,
                timeout=timeout,
            )
        return subprocess.run(
            argv, env=full_env, cwd=self.work, capture_output=True, timeout=timeout
        )

    def ran(self, name: str = "marker") -> bool:
        return (self.traces / f"ran-{name}").exists()

    def give(self, path: Path) -> None:
        """Hand ``path`` (a tree) to the attacker."""
        if self.user is not None:
            self.user.chown_tree(path)


def compile_marker(out: Path, traces: Path) -> None:
    source = out.with_suffix(".c")
    source.write_text(MARKER_C)
    subprocess.run(["cc", "-O1", f'-DTRACES="{traces}"', "-o", out, source], check=True)
    source.unlink()


@pytest.fixture(params=["root", "user"])
def attacker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Attacker]:
    user: Any = None
    if request.param == "user":
        user = request.getfixturevalue("unprivileged")
        base = user.make_dir()
    else:
        base = tmp_path / "attack"
        base.mkdir()
    dirs = {name: base / name for name in ("work", "outside", "bin", "home", "xhome", "xsys")}
    for path in dirs.values():
        path.mkdir()
    traces = dirs["work"] / ".traces"
    traces.mkdir()
    compile_marker(dirs["bin"] / "marker", traces)
    env = {
        "PATH": f"{dirs['bin']}:{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin"
        ":/usr/sbin:/sbin",
        "LANG": "C.UTF-8",
        "HOME": str(dirs["home"]),
        "EXECGATE_HOME": str(dirs["xhome"]),
        "EXECGATE_SYSTEM_DIR": str(dirs["xsys"]),
        "CODEX_HOME": str(dirs["home"] / ".codex"),
        "EXECGATE_CODEX_SYSTEM_DIR": str(dirs["xsys"] / "codex"),
    }
    a = Attacker(
        who=request.param,
        base=base,
        work=dirs["work"],
        outside=dirs["outside"],
        bin=dirs["bin"],
        traces=traces,
        env=env,
        user=user,
        rules=base / "test.rules",
    )
    a.write_rules('prefix_rule(["marker"], "forbidden", justification="marker must not run")\n')
    a.give(base)
    yield a
    if user is None:
        shutil.rmtree(base, ignore_errors=True)


sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "mcp"))  # mcpharness

EXECGATE = [sys.executable, "-m", "execgate"]
SYSTEM_DIR = Path("/etc/execgate")

FORBID_MARKER = """\
[rules]
prefix_rules = [
  { pattern = [{ token = "marker" }], decision = "forbidden", justification = "admin: no marker" },
]
"""


@dataclass
class Served:
    """What the loopback server serves; tests change it between requests and read the log."""

    document: bytes = FORBID_MARKER.encode()
    signature: bytes | None = None  # served at URL + ".sig" (404 when None)
    status: int = 200  # for the document
    cache_control: str | None = "max-age=3600"
    etag: str = '"v1"'
    log: list[tuple[str, int]] = field(default_factory=list)  # (path, status answered)

    def count(self, suffix: str, status: int | None = None) -> int:
        return sum(
            1
            for path, answered in self.log
            if path.endswith(suffix) and (status is None or answered == status)
        )


@dataclass
class Server:
    url: str
    served: Served
    httpd: ThreadingHTTPServer

    def stop(self) -> None:
        """Stop answering: later connections are refused."""
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    served = Served()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.endswith(".sig"):
                body, status = served.signature, 200 if served.signature is not None else 404
                self._answer(status, body or b"", etag=None)
                return
            if served.status == 200 and self.headers.get("If-None-Match") == served.etag:
                self._answer(304, b"", etag=served.etag)
                return
            self._answer(served.status, served.document, etag=served.etag)

        def _answer(self, status: int, body: bytes, *, etag: str | None) -> None:
            served.log.append((self.path, status))
            self.send_response(status)
            if etag:
                self.send_header("ETag", etag)
            if served.cache_control:
                self.send_header("Cache-Control", served.cache_control)
            if status != 304:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if status != 304:
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    server = Server(f"http://127.0.0.1:{httpd.server_address[1]}/requirements.toml", served, httpd)
    try:
        yield server
    finally:
        if thread.is_alive():
            server.stop()
        thread.join(10)


@dataclass
class Keys:
    private: Ed25519PrivateKey

    def sign(self, document: bytes) -> bytes:
        """The detached signature as served: base64 of the 64 bytes."""
        return base64.b64encode(self.private.sign(document))

    @property
    def public_base64(self) -> str:
        raw = self.private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return base64.b64encode(raw).decode()

    @property
    def public_pem(self) -> str:
        return (
            self.private.public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            .decode()
        )


@pytest.fixture
def keys() -> Keys:
    return Keys(Ed25519PrivateKey.generate())


@dataclass
class Homes:
    """Isolated locations for execgate (as root, the environment variables move them)."""

    root: Path
    home: Path
    execgate_home: Path
    system: Path
    codex_system: Path
    work: Path
    bin: Path

    def env(self) -> dict[str, str]:
        return {
            "PATH": f"{self.bin}:{os.path.dirname(sys.executable)}:/usr/bin:/bin",
            "HOME": str(self.home),
            "EXECGATE_HOME": str(self.execgate_home),
            "EXECGATE_SYSTEM_DIR": str(self.system),
            "CODEX_HOME": str(self.home / ".codex"),
            "EXECGATE_CODEX_SYSTEM_DIR": str(self.codex_system),
            "LANG": "C.UTF-8",
            "no_proxy": "*",
        }

    def requirements(self, text: str) -> Path:
        path = self.system / "requirements.toml"
        path.write_text(text, encoding="utf-8")
        return path


def make_marker(folder: Path) -> None:
    """``marker``: a program that leaves ``marker-ran`` in its working directory."""
    marker = folder / "marker"
    marker.write_text('#!/bin/sh\necho "marker ran" > marker-ran\necho "marker ran"\n')
    marker.chmod(0o755)


@pytest.fixture
def homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Homes:
    names = ("home", "execgate_home", "system", "codex_system", "work", "bin")
    dirs = {name: tmp_path / name for name in names}
    for directory in dirs.values():
        directory.mkdir()
    make_marker(dirs["bin"])
    homes = Homes(tmp_path, **dirs)
    for key, value in homes.env().items():
        if key != "PATH":
            monkeypatch.setenv(key, value)
    for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.delenv("EXECGATE_NO_CACHE", raising=False)
    return homes


def run_execgate(
    args: Sequence[str], homes: Homes, *, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EXECGATE, *args],
        env=homes.env(),
        cwd=cwd or homes.work,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def system_mountpoint() -> Iterator[Path]:
    """``/etc/execgate`` as an (empty) mount point. An empty folder means what a missing one
    means (no admin rules), so making it for the run changes nothing; it is removed after."""
    if os.geteuid() != 0:
        pytest.skip("needs root to play the admin")
    made = not SYSTEM_DIR.exists()
    if made:
        SYSTEM_DIR.mkdir(mode=0o755)
    try:
        yield SYSTEM_DIR
    finally:
        if made:
            with contextlib.suppress(OSError):
                SYSTEM_DIR.rmdir()


def as_user_under_admin(
    user: Any,  # tests/conftest.py's UnprivilegedUser
    system: Path,
    command: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    timeout: float = 120,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``command`` as the unprivileged user, with ``system`` mounted on /etc/execgate in a
    private mount namespace (made as root, then dropped to the user with setpriv)."""
    inner = shlex.join(user.argv(command))
    script = (
        f"mount --bind {shlex.quote(str(system))} {SYSTEM_DIR} && "
        f"cd {shlex.quote(str(cwd))} && exec {inner}"
    )
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        env=user.env(env),
        capture_output=True,
        timeout=timeout,
    )


@pytest.fixture(params=["root", "unprivileged"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    """A world of homes, a workspace and rules, as root and as the unprivileged user."""
    user = None
    root = tmp_path
    if request.param == "unprivileged":
        user = request.getfixturevalue("unprivileged")
        root = user.make_dir()
    world = new_world(root, user)
    yield world
    end_world(world)


@pytest.fixture(params=["root", "unprivileged"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Any, Path]:
    """(None, a folder) for root, or (the unprivileged user, a folder it owns)."""
    if request.param == "root":
        tmp_path.chmod(0o755)
        return None, tmp_path
    user = request.getfixturevalue("unprivileged")
    return user, user.make_dir()


def give_to(base: Path, user: Any) -> None:
    """Everything the test prepared belongs to the user who attacks (root: nothing to do)."""
    if user is None:
        return
    for dirpath, dirnames, filenames in os.walk(base):
        for name in [*dirnames, *filenames]:
            os.chown(os.path.join(dirpath, name), user.uid, user.gid, follow_symlinks=False)
