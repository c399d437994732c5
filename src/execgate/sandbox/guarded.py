"""What no confined process may change or reach, whatever the writable roots are.

* execgate's installation: everything a session runs or loads (the package with its native
  ``_bin``, the ``execgate`` console script and its folder, the Python environment, every
  ``sys.path`` entry — the dependencies — and the interpreter with its standard library);
* execgate's and Codex's state (``paths.state_paths``: rules, ``config.toml``, trust list,
  caches, logs, approvals);
* the control folder (``paths.control_dir``), hidden altogether: a gated process must not
  reach a control socket, let alone answer a question with it.

A session adds these to its sandbox (``SandboxSpec.with_gate_paths``); only the ones inside a
writable root become read-only carve-outs (the rest of the filesystem is read-only anyway).
"""

from __future__ import annotations

import functools
import os
import shutil
import site
import stat
import sys
import sysconfig
from pathlib import Path

import execgate
from execgate import paths
from execgate.errors import ExecgateError
from execgate.files import make_private_dir
from execgate.sandbox.spec import SandboxSpec

CONSOLE_SCRIPT = "execgate"


def _console_scripts() -> list[Path]:
    """Where the ``execgate`` command lives: this process's own script, the one on ``PATH``
    and the ones pip installs (prefix and user scheme)."""
    found: list[str] = []
    if os.path.basename(sys.argv[0] or "") == CONSOLE_SCRIPT:
        found.append(os.path.abspath(sys.argv[0]))
    on_path = shutil.which(CONSOLE_SCRIPT)
    if on_path:
        found.append(on_path)
    for scheme in (sysconfig.get_default_scheme(), sysconfig.get_preferred_scheme("user")):
        try:
            found.append(os.path.join(sysconfig.get_path("scripts", scheme), CONSOLE_SCRIPT))
        except KeyError:
            continue
    return [Path(p) for p in found if os.path.lexists(p)]


@functools.cache
def installation_paths() -> tuple[Path, ...]:
    """Everything execgate runs or loads (found once per process). A console script's
    folder is included whole, so a symlinked script (pipx's ``~/.local/bin/execgate``) cannot
    be replaced either."""
    found = [Path(execgate.__file__).resolve().parent]
    for script in _console_scripts():
        found += [script.parent, Path(os.path.realpath(script))]
    found += [Path(sys.prefix), Path(sys.exec_prefix), Path(sys.base_prefix)]
    found.append(Path(os.path.realpath(sys.executable)))
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with_key = sysconfig.get_paths().get(key)
        if with_key:
            found.append(Path(with_key))
    for entry in sys.path:
        if entry and os.path.isabs(entry):
            found.append(Path(entry))
    return tuple(p for p in found if os.path.exists(p))


def _user_site() -> list[Path]:
    """The user site-packages folder when this interpreter would load it (``.pth`` files and
    ``usercustomize`` there run in every later ``execgate``), existing or not."""
    if not site.ENABLE_USER_SITE:
        return []
    return [Path(site.getusersitepackages())]


def _make_missing_dirs(spec: SandboxSpec) -> None:
    """Create the state folders (and the user site-packages) that do not exist yet but would
    be writable: a carve-out needs something to mount, and a missing rules folder inside a
    writable root could otherwise be created, with rules in it, from inside."""
    for path in [*paths.state_paths(), *_user_site()]:
        if os.path.lexists(path) or not spec.allows_write(path):
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
    control = paths.control_dir()
    ensure_control_dir(control)
    _make_missing_dirs(spec)
    readonly = [*installation_paths(), *_user_site(), *paths.state_paths()]
    return [p for p in readonly if os.path.lexists(p)], [control]


def ensure_control_dir(folder: Path) -> Path:
    """Create the control folder (0700) if needed; refuse one that is not a directory of ours
    (a symlink, or someone else's folder in ``/tmp``)."""
    try:
        make_private_dir(folder)
        st = os.lstat(folder)
    except OSError as exc:
        raise ExecgateError(f"cannot create the control folder {folder}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ExecgateError(
            f"the control folder {folder} is not a private folder of this user (mode 0700); "
            "remove it"
        )
    return folder
