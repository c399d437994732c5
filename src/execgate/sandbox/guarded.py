"""What no confined process may change or reach, whatever the writable roots are.

* execgate's installation: everything a session runs or loads (the package with its native
  ``_bin``, the ``execgate`` console script and its folder, the Python environment, every
  ``sys.path`` entry — the dependencies — and the interpreter with its standard library);
* execgate's and Codex's state (``paths.state_paths``: rules, ``config.toml``, trust list,
  caches, logs, approvals);
* the ``.execgate`` and ``.codex`` folders of every trusted project (created when missing and
  writable), so no session plants project rules for the next one;
* the control folder (``paths.control_dir``) and the terminal multiplexers' socket folders
  (tmux, GNU screen), hidden altogether: a gated process must not reach a control socket, let
  alone answer a question with it (``tmux send-keys`` into its own prompt).

A writable root that is, or lies inside, a state folder is refused: nothing inside a writable
root's own folder can be carved out of it. So is a hidden folder holding a writable root.

A session adds these to its sandbox (``SandboxSpec.with_gate_paths``); only the ones inside a
writable root become read-only carve-outs (the rest of the filesystem is read-only anyway).
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import shutil
import site
import sys
import sysconfig
from pathlib import Path

import execgate
from execgate import paths
from execgate.errors import ExecgateError
from execgate.files import ensure_control_dir, is_own_private_dir, make_private_dir
from execgate.policy.layers import trusted_project_folders
from execgate.sandbox.spec import SandboxSpec, path_under

#: The installed commands: ``execgate`` (native, native/entry.c) and the Python command line
#: it hands everything but a fast ``run`` to.
CONSOLE_SCRIPTS = ("execgate", "execgate-py")


def _console_scripts() -> list[Path]:
    """Where the ``execgate`` commands live: this process's own script, the ones on ``PATH``
    and the ones pip installs (each prefix's scheme and the user scheme)."""
    return [p for p in _console_script_candidates() if os.path.lexists(p)]


def _console_script_candidates() -> list[Path]:
    folders: list[str] = []
    if os.path.basename(sys.argv[0] or "") in CONSOLE_SCRIPTS:
        folders.append(os.path.dirname(os.path.abspath(sys.argv[0])))
    for name in CONSOLE_SCRIPTS:
        on_path = shutil.which(name)
        if on_path:
            folders.append(os.path.dirname(on_path))
    folders += [_scheme_path("scripts", prefix) for prefix in _prefixes()]
    with contextlib.suppress(KeyError):
        folders.append(sysconfig.get_path("scripts", sysconfig.get_preferred_scheme("user")))
    # Each command beside the others: however this one was started (``execgate`` hands over
    # to ``execgate-py``), the same files are found.
    return [Path(folder, name) for folder in folders for name in CONSOLE_SCRIPTS]


def _venv_prefix() -> str | None:
    """The virtual environment this interpreter belongs to (its ``pyvenv.cfg``), found as
    ``site`` finds it, whether or not ``site`` ran (the server of a native start runs with
    ``-I -S``: its ``sys.prefix`` is the base one)."""
    here = os.path.dirname(os.path.abspath(sys.executable))
    for folder in (here, os.path.dirname(here)):
        if os.path.isfile(os.path.join(folder, "pyvenv.cfg")):
            return folder
    return None


def _prefixes() -> list[str]:
    """The environment's prefix and the base installation's, however this interpreter was
    started."""
    venv = _venv_prefix()
    found = [*([venv] if venv else []), sys.prefix, sys.exec_prefix, sys.base_prefix]
    found.append(sys.base_exec_prefix)
    return list(dict.fromkeys(found))


def _scheme_path(key: str, prefix: str) -> str:
    """Where the default install scheme puts ``key`` for an interpreter at ``prefix``."""
    at = {"base": prefix, "platbase": prefix, "installed_base": prefix}
    return sysconfig.get_path(key, "posix_prefix", vars={**at, "installed_platbase": prefix})


@functools.cache
def installation_paths() -> tuple[Path, ...]:
    """Everything execgate runs or loads (found once per process, sorted). A console
    script's folder is included whole, so a symlinked script (pipx's ``~/.local/bin/execgate``)
    cannot be replaced either.

    Found the same whichever way this interpreter was started (console script, ``-m``, or the
    ``-I -S`` server of a native start with the plan's ``sys.path`` and ``argv[0]``), so a
    start-up plan covers a sandbox that carves them out of a writable root."""
    found = [Path(execgate.__file__).resolve().parent]
    for script in _console_scripts():
        found += [script.parent, Path(os.path.realpath(script))]
    found.append(Path(os.path.realpath(sys.executable)))
    for prefix in _prefixes():
        found.append(Path(prefix))
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            found.append(Path(_scheme_path(key, prefix)))
    # sys.path, but not the working directory ``python -m`` puts first (nor '' for ``-c``):
    # that is where the command runs, not what it loads execgate from.
    cwd = os.getcwd()
    for entry in sys.path:
        if entry and os.path.isabs(entry) and entry != cwd:
            found.append(Path(entry))
    return tuple(sorted({p for p in found if os.path.exists(p)}))


def _user_site() -> list[Path]:
    """The user site-packages folder when an ``execgate`` started normally would load it
    (``.pth`` files and ``usercustomize`` there run in every later ``execgate``), existing or
    not. As ``site`` decides it from the interpreter, not from this process's own flags: a
    virtual environment loads it only with ``include-system-site-packages = true``."""
    venv = _venv_prefix()
    if venv is not None:
        try:
            with open(os.path.join(venv, "pyvenv.cfg"), encoding="utf-8") as cfg:
                settings = dict(line.partition("=")[::2] for line in cfg)
        except (OSError, ValueError):
            return []
        values = {k.strip().lower(): v.strip().lower() for k, v in settings.items()}
        if values.get("include-system-site-packages") != "true":
            return []
    return [Path(site.getusersitepackages())]


def _under(path: Path, folder: Path) -> bool:
    return path_under(path, folder)


def _refuse_roots_in_state(spec: SandboxSpec) -> None:
    """A writable root is the top of what the launcher can carve out: a state folder that is
    a root, or holds one, would stay writable (rules, trust list for the next session)."""
    if spec.mode != "workspace-write":
        return
    roots = [(root, Path(os.path.realpath(root))) for root in spec.writable_roots]
    for state in paths.state_paths():
        real = Path(os.path.realpath(state))
        for root, real_root in roots:
            if _under(real_root, real):
                raise ExecgateError(
                    f"the writable root {root} is inside execgate's state folder {real}, "
                    "which no sandbox may write; work in another directory"
                )


def _multiplexer_candidates() -> list[str]:
    uid = os.getuid()
    found: list[str] = []
    tmux = os.environ.get("TMUX", "").split(",", 1)[0]
    if os.path.isabs(tmux):
        found.append(os.path.dirname(tmux))
    tmux_tmpdir = os.environ.get("TMUX_TMPDIR")
    for base in ["/tmp", *([tmux_tmpdir] if tmux_tmpdir and os.path.isabs(tmux_tmpdir) else [])]:
        found.append(os.path.join(base, f"tmux-{uid}"))
    screen = os.environ.get("SCREENDIR")
    if screen and os.path.isabs(screen):
        found.append(screen)
    with contextlib.suppress(KeyError):  # a uid without a name has no screen folder
        found.append(f"/run/screen/S-{pwd.getpwuid(uid).pw_name}")
    return found


def multiplexer_dirs() -> list[Path]:
    """The existing folders of the terminal multiplexers' control sockets (resolved): a
    confined process reaching one could type into any pane, its own prompt included."""
    dirs: list[Path] = []
    for folder in _multiplexer_candidates():
        real = Path(os.path.realpath(folder))
        if real.is_dir() and real not in dirs:
            dirs.append(real)
    return dirs


def _refuse_hiding_roots(spec: SandboxSpec, hidden: list[Path]) -> None:
    """A hidden folder that is or holds a writable root would hide the work itself."""
    for folder in hidden:
        for root in spec.writable_roots:
            if _under(Path(os.path.realpath(root)), folder):
                raise ExecgateError(
                    f"the writable root {root} is inside {folder}, a terminal multiplexer's "
                    "socket folder that every sandbox hides; move the socket elsewhere "
                    "(e.g. tmux -S) or work in another directory"
                )


def _make_missing_dirs(spec: SandboxSpec, folders: list[Path]) -> None:
    """Create the state and project rules folders (and the user site-packages) that do not
    exist yet but would be writable: a carve-out needs something to mount, and a missing rules
    folder inside a writable root could otherwise be created, with rules in it, from inside."""
    roots = [Path(os.path.realpath(r)) for r in spec.writable_roots]
    for path in [*paths.state_paths(), *_user_site(), *folders]:
        if os.path.lexists(path):
            continue
        # Inside a root counts even when a protected name covers it: ``--protect`` only
        # covers names that exist when a process is spawned.
        real = Path(os.path.realpath(path))
        if not spec.allows_write(path) and not any(_under(real, r) for r in roots):
            continue
        try:
            make_private_dir(path)
        except OSError:
            continue  # then the launcher has nothing to carve out, and says so by failing


def guard(spec: SandboxSpec) -> tuple[list[Path], list[Path]]:
    """The read-only and the hidden paths for a session sandboxed by ``spec`` (creating the
    control and state folders it must protect when they are missing)."""
    if not spec.confines:
        return [], []
    _refuse_roots_in_state(spec)
    multiplexers = multiplexer_dirs()
    _refuse_hiding_roots(spec, multiplexers)
    control = paths.control_dir()
    ensure_control_dir(control)
    projects = trusted_project_folders()
    _make_missing_dirs(spec, projects)
    readonly = [*installation_paths(), *_user_site(), *paths.state_paths(), *projects,
                *paths.record_files(), *_session_folders()]  # fmt: skip
    return [p for p in readonly if os.path.lexists(p)], [control, *multiplexers]


def _session_folders() -> list[Path]:
    """The folders every session's folder is made in (made now when missing, so that one
    made later, by another session, is inside a carve-out from this sandbox's first spawn
    on); one that is not this user's private folder is never used for a session."""
    found = []
    for folder in paths.shared_session_folders():  # $EXECGATE_HOME/run: a state path
        with contextlib.suppress(OSError):
            make_private_dir(folder)
        if is_own_private_dir(folder):
            found.append(folder)
    return found


def guard_inputs(spec: SandboxSpec) -> list[Path]:
    """Every path :func:`guard` and the spec's writable roots were found from, existing or
    not: a start-up plan's inputs (gate/runplan.py), so a change to any makes it stale. (The
    protected names in the roots are not: the launcher looks them up at each spawn, and the
    native front finds the known ones itself.)"""
    if not spec.confines:
        return []
    found = [*spec.writable_roots, Path("/tmp"), Path("/dev/shm"), Path("/etc/passwd")]
    tmpdir = os.environ.get("TMPDIR")
    if tmpdir and os.path.isabs(tmpdir):
        found.append(Path(tmpdir))
    found += [*installation_paths(), *_console_script_candidates(), *_user_site()]
    found += [*paths.state_paths(), paths.control_dir()]
    found += [*trusted_project_folders(), *paths.record_files(), *paths.shared_session_folders()]
    found += [Path(p) for p in _multiplexer_candidates()]
    return found
