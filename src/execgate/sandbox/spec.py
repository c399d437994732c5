"""What a session's sandbox allows: :class:`SandboxSpec`, built from CLI flags and config.

The spec is plain data. ``execgate-launch`` enforces it in every child spawned with the
``sandbox`` flag (docs/sandbox.md); :meth:`SandboxSpec.launcher_args` is the translation.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, Literal, TypeGuard

from execgate.config import SANDBOX_MODES, SandboxConfig
from execgate.errors import ExecgateError

SandboxMode = Literal["read-only", "workspace-write", "off"]

#: Names kept read-only inside every writable root (``.git`` unless ``--writable-git``).
PROTECTED_NAMES: Final[tuple[str, ...]] = (".git", ".codex", ".execgate")

#: Where programs may be executed from under ``strict-exec`` (plus ``exec_dirs``); built into
#: the launcher, listed here for messages and docs.
SYSTEM_EXEC_DIRS: Final[tuple[str, ...]] = (
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt",
)  # fmt: skip

#: The port the proxy listens on inside a proxy-mode sandbox's network namespace (its own
#: loopback: nothing else can hold it there).
PROXY_PORT: Final = 3128

#: ``--network`` values.
NETWORK_MODES: Final = ("on", "off", "proxy")

#: Writable in workspace-write along with /tmp (and excluded with it).
SHARED_MEMORY_DIR: Final = Path("/dev/shm")


def is_mode(value: object) -> TypeGuard[SandboxMode]:
    return isinstance(value, str) and value in SANDBOX_MODES


def _under(path: Path, root: Path) -> bool:
    """``path`` is ``root`` or lies below it (lexically)."""
    return path_under(path, root)


def path_under(path: Path, root: Path) -> bool:
    """``path`` is ``root`` or lies below it (lexically): ``root in path.parents``, without
    building every parent (sessions check hundreds of paths when they open)."""
    if not (path.is_absolute() and root.is_absolute()):
        return path == root or root in path.parents
    p, r = str(path), str(root)
    return p == r or p.startswith(r if r.endswith("/") else r + "/")


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """A sandbox profile with everything resolved: absolute, canonical paths.

    * ``writable_roots``: where workspace-write allows writes (ignored by other modes).
    * ``readonly_paths``: kept read-only even when inside a writable root (e.g. the session
      directory); they need a private mount namespace when they are.
    * ``protected_names``: ``<root>/<name>`` kept read-only in every writable root, looked up
      by the launcher at each spawn (so a ``.git`` created later is protected from then on).
    * ``exec_dirs``: extra directories or files programs may be executed from under
      ``strict_exec``.
    * ``hidden_paths``: directories confined processes must not reach at all (control
      sockets): an empty read-only directory is mounted over each (needs a mount namespace).
    * ``network_proxy``: no network but a network namespace with only loopback, where the
      session's proxy listens on :data:`PROXY_PORT` (``network`` must be off).
    """

    mode: SandboxMode = "off"
    writable_roots: tuple[Path, ...] = ()
    readonly_paths: tuple[Path, ...] = ()
    protected_names: tuple[str, ...] = PROTECTED_NAMES
    network: bool = False
    strict_exec: bool = False
    exec_dirs: tuple[Path, ...] = ()
    hidden_paths: tuple[Path, ...] = ()
    network_proxy: bool = False
    # The session's stand-in table (gate/standins.py): the programs rules name are covered by
    # stand-ins in every confined spawn (the kernel exec backstop).
    standin_table: Path | None = None
    # The (dev, ino) of the protected names that existed when the front end started
    # (:func:`existing_carveouts`); None: the launcher looks when it starts. A read-only `.git`
    # in a folder the sandbox can write is trusted at a claim only if it is one of them
    # (native/gitrepo.h): one made later was made by this or an earlier session's sandbox.
    known_carveouts: tuple[tuple[int, int], ...] | None = None

    def __post_init__(self) -> None:
        if self.network and self.network_proxy:
            raise ValueError("network on and network through the proxy exclude each other")
        if not is_mode(self.mode):
            raise ValueError(f"unknown sandbox mode {self.mode!r}")
        paths = (*self.writable_roots, *self.readonly_paths, *self.exec_dirs, *self.hidden_paths)
        for path in paths:
            if not path.is_absolute():
                raise ValueError(f"sandbox path {path} is not absolute")
        for name in self.protected_names:
            if not name or "/" in name or name in (".", ".."):
                raise ValueError(f"protected name {name!r} is not a single file name")

    @property
    def confines(self) -> bool:
        """Whether spawns with the ``sandbox`` flag are confined at all."""
        return self.mode != "off"

    def launcher_args(self) -> list[str]:
        """The ``execgate-launch`` command-line options for this spec (protocol §7)."""
        args = ["--sandbox", self.mode]
        if not self.confines:
            return args
        if self.mode == "workspace-write":
            for root in self.writable_roots:
                args += ["--writable", str(root)]
            for name in self.protected_names:
                args += ["--protect", name]
        for path in self.readonly_paths:
            args += ["--readonly", str(path)]
        for path in self.hidden_paths:
            args += ["--hide", str(path)]
        if self.standin_table is not None:
            args += ["--shadows", str(self.standin_table)]
        if self.known_carveouts is not None:
            known = ",".join(f"{dev}:{ino}" for dev, ino in self.known_carveouts)
            args += ["--known-carveouts", known]
        if self.network:
            args.append("--network")
        if self.network_proxy:
            args += ["--proxy-port", str(PROXY_PORT)]
        if self.strict_exec:
            args.append("--strict-exec")
            for path in self.exec_dirs:
                args += ["--exec-dir", str(path)]
        return args

    def layout_now(self) -> tuple[object, ...]:
        """What a confined spawn's set-up reads from the file system (native/sandbox.c
        ``collect``, the hidden folders): each writable root, ``<root>/<protected name>``,
        read-only and hidden path as it is now (its identity, and where it leads). Equal
        layouts give equal sandboxes: one set up earlier (a held shell's) is this one."""
        if not self.confines:
            return ()
        paths = [*self.readonly_paths, *self.hidden_paths]
        if self.mode == "workspace-write":
            paths += list(self.writable_roots)
            paths += [r / n for r in self.writable_roots for n in self.protected_names]
        return tuple(_identity_now(path) for path in paths)

    def allows_write(self, path: Path) -> bool:
        """Whether a confined process could write ``path`` (resolved), per this spec."""
        if self.mode == "off":
            return True
        if self.mode != "workspace-write":
            return False
        return _WriteCheck(self).allows(Path(os.path.realpath(path)))

    def first_writable(self, paths: Iterable[str]) -> str | None:
        """The first of the canonical ``paths`` a confined process could write, or None."""
        check = _WriteCheck(self)
        return next((path for path in paths if check.allows(Path(path))), None)

    def carve_outs(self) -> list[Path]:
        """Existing paths the launcher will bind-mount read-only today (what needs a mount
        namespace): protected names and read-only paths that lie inside a writable root."""
        if self.mode != "workspace-write":
            return []
        roots = [Path(os.path.realpath(r)) for r in self.writable_roots if r.exists()]
        found: list[Path] = []
        candidates = [r / n for r in roots for n in self.protected_names]
        candidates += list(self.readonly_paths)
        for candidate in candidates:
            if not os.path.lexists(candidate):
                continue
            target = Path(os.path.realpath(candidate))
            if any(_under(target, r) for r in roots) and target not in found:
                found.append(target)
        return found

    def with_gate_paths(
        self,
        *,
        session_dir: Path | None = None,
        executables: Iterable[Path] = (),
        readonly: Iterable[Path] = (),
        hidden: Iterable[Path] = (),
        standin_table: Path | None = None,
    ) -> SandboxSpec:
        """This spec plus what the gate itself needs inside the sandbox.

        * ``session_dir`` (socket, policy snapshot) must not be writable by confined
          processes: if it lies inside a writable root it becomes a read-only carve-out.
        * ``readonly`` (execgate's installation and state, see ``sandbox.guarded``) likewise;
          a path that is a writable root, or contains one, stays as the roots say (the user
          asked for it to be writable).
        * ``hidden`` (control-socket folders) are hidden from every confined process.
        * ``executables`` (``execgate-wrapper``, ``libexecgate.so``) must be readable (always
          true: the whole filesystem is) and executable under ``strict_exec``.
        * ``standin_table``: the stand-ins covering the programs rules name (the backstop).
        """
        spec = self
        if not spec.confines:
            return spec
        if standin_table is not None:
            spec = replace(spec, standin_table=standin_table)
        carve = [*([session_dir] if session_dir is not None else []), *readonly]
        added = list(spec.readonly_paths)
        check = _WriteCheck(spec)
        for path in carve:
            real = Path(os.path.realpath(path))
            if real in added or not check.allows(real):
                continue
            if any(_under(root, real) for root in spec.writable_roots):
                continue
            added.append(real)
        if len(added) != len(spec.readonly_paths):
            spec = replace(spec, readonly_paths=tuple(added))
        hide = [Path(os.path.realpath(p)) for p in hidden]
        hide = [p for p in hide if p not in spec.hidden_paths]
        if hide:
            spec = replace(spec, hidden_paths=(*spec.hidden_paths, *hide))
        extra = [Path(os.path.realpath(p)) for p in executables]
        extra = [p for p in extra if p not in spec.exec_dirs]
        if extra:
            spec = replace(spec, exec_dirs=(*spec.exec_dirs, *extra))
        return spec

    def within(self, bounds: Sequence[Path]) -> tuple[SandboxSpec, list[Path]]:
        """This spec with its writable roots cut to ``bounds`` (canonical directories), and the
        roots that were cut: a root inside a bound stays, a root holding bounds (``/``) becomes
        those bounds, any other root goes. A client may narrow what is writable, never widen it."""
        kept: list[Path] = []
        cut: list[Path] = []
        for root in self.writable_roots:
            if any(_under(root, b) for b in bounds):
                kept.append(root)
                continue
            cut.append(root)
            kept += [b for b in bounds if _under(b, root)]
        if not cut:
            return self, []
        return replace(self, writable_roots=_dedupe(kept)), cut

    def describe(self) -> str:
        """One line for logs and messages."""
        if not self.confines:
            return "off (no confinement)"
        parts: list[str] = [self.mode]
        if self.mode == "workspace-write":
            roots = ", ".join(map(str, self.writable_roots)) or "none"
            parts.append(f"writable: {roots}")
            if self.protected_names:
                parts.append(f"read-only inside: {', '.join(self.protected_names)}")
            if self.readonly_paths:
                parts.append(f"read-only: {', '.join(map(str, self.readonly_paths))}")
        if self.hidden_paths:
            parts.append(f"hidden: {', '.join(map(str, self.hidden_paths))}")
        parts.append(
            "network on"
            if self.network
            else "network through the proxy"
            if self.network_proxy
            else "network off"
        )
        if self.strict_exec:
            parts.append("strict-exec")
        return "; ".join(parts)


OFF: Final = SandboxSpec()


def _identity_now(path: Path) -> tuple[object, ...]:
    """``path``'s own (dev, ino, mode), or None if missing; and where it resolves to, and
    that file's (dev, ino), when it is there."""
    try:
        st = os.lstat(path)
    except OSError:
        return (None,)
    real = os.path.realpath(path)
    try:
        target = os.stat(real)
    except OSError:
        return (st.st_dev, st.st_ino, st.st_mode, real)
    return (st.st_dev, st.st_ino, st.st_mode, real, target.st_dev, target.st_ino)


def existing_carveouts(
    roots: Iterable[Path], names: Iterable[str] = PROTECTED_NAMES
) -> tuple[tuple[int, int], ...]:
    """The (dev, ino) of every ``<root>/<name>`` that exists now (the entry and what a symlink
    points to), for :attr:`SandboxSpec.known_carveouts`."""
    found: list[tuple[int, int]] = []
    for root in roots:
        for name in names:
            for follow in (False, True):
                try:
                    st = os.stat(root / name, follow_symlinks=follow)
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) not in found:
                    found.append((st.st_dev, st.st_ino))
    return tuple(found)


class _WriteCheck:
    """:meth:`SandboxSpec.allows_write` for many paths: the read-only paths, and each root's
    protected names, resolved once."""

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self._readonly: list[Path] | None = None
        self._names: dict[Path, list[Path]] = {}

    def allows(self, path: Path) -> bool:
        """Whether a confined process could write ``path`` (already resolved)."""
        spec = self.spec
        if spec.mode == "off":
            return True
        if spec.mode != "workspace-write":
            return False
        roots = [r for r in spec.writable_roots if _under(path, r)]
        if not roots:
            return False
        if self._readonly is None:
            self._readonly = [Path(os.path.realpath(p)) for p in spec.readonly_paths]
        protected = list(self._readonly)
        for root in roots:
            names = self._names.get(root)
            if names is None:
                names = [Path(os.path.realpath(root / n)) for n in spec.protected_names]
                self._names[root] = names
            protected += names
        return not any(_under(path, p) for p in protected)


def _resolve(path: str | Path, cwd: Path) -> Path:
    expanded = Path(os.path.expanduser(path))
    return Path(os.path.realpath(cwd / expanded))


def _dedupe(paths: Iterable[Path]) -> tuple[Path, ...]:
    seen: list[Path] = []
    for path in paths:
        if path not in seen:
            seen.append(path)
    return tuple(seen)


def _config_path(value: str, key: str) -> str:
    expanded = os.path.expanduser(value)
    if not os.path.isabs(expanded):
        raise ExecgateError(f"config: `sandbox.{key}` entry {value!r} must be an absolute path")
    return expanded


def build_spec(
    mode: str | None = None,
    *,
    cwd: Path,
    config: SandboxConfig | None = None,
    default_mode: SandboxMode = "off",
    writable_roots: Sequence[str | Path] = (),
    network: bool | str | None = None,
    strict_exec: bool | None = None,
    exec_dirs: Sequence[str | Path] = (),
    exclude_tmp: bool | None = None,
    exclude_tmpdir: bool | None = None,
    writable_git: bool | None = None,
    env: Mapping[str, str] | None = None,
    network_rules: bool = False,
) -> SandboxSpec:
    """The spec for a session working in ``cwd``.

    Explicit arguments (CLI flags; ``None`` = not given) win over ``config``, which wins over
    ``default_mode``; directory lists add up. Relative paths are relative to ``cwd``.
    workspace-write's writable roots: ``cwd``, the configured and given roots, ``$TMPDIR``
    (from ``env``, default ``os.environ``) unless excluded, ``/tmp`` and ``/dev/shm`` unless
    excluded. ``network``: ``"on"``/``True``, ``"off"``/``False``, ``"proxy"``; not given, the
    config says, and a workspace-write session whose policy has ``network_rule``s in force
    (``network_rules``) goes through the proxy.
    """
    config = config or SandboxConfig()
    env = os.environ if env is None else env
    chosen = mode if mode is not None else config.mode if config.mode is not None else default_mode
    if not is_mode(chosen):
        raise ExecgateError(
            f"unknown sandbox mode {chosen!r} (choose one of {', '.join(SANDBOX_MODES)})"
        )
    cwd = Path(os.path.realpath(cwd))

    def pick(flag: bool | None, configured: bool) -> bool:
        return configured if flag is None else flag

    given_roots = [_resolve(r, cwd) for r in writable_roots]
    if chosen != "workspace-write" and given_roots:
        raise ExecgateError(
            f"--writable-root only applies to --sandbox workspace-write (the mode is {chosen})"
        )
    roots: list[Path] = []
    if chosen == "workspace-write":
        if not cwd.is_dir():
            raise ExecgateError(f"working directory {cwd} does not exist")
        roots.append(cwd)
        configured = [Path(_config_path(r, "writable_roots")) for r in config.writable_roots]
        for root in [*(Path(os.path.realpath(p)) for p in configured), *given_roots]:
            if not root.exists():
                raise ExecgateError(f"writable root {root} does not exist")
            roots.append(root)
        if not pick(exclude_tmpdir, config.exclude_tmpdir):
            tmpdir = env.get("TMPDIR")
            if tmpdir and os.path.isabs(tmpdir) and os.path.isdir(tmpdir):
                roots.append(Path(os.path.realpath(tmpdir)))
        if not pick(exclude_tmp, config.exclude_tmp):
            for shared in (Path("/tmp"), SHARED_MEMORY_DIR):
                if shared.is_dir():
                    roots.append(Path(os.path.realpath(shared)))

    names = PROTECTED_NAMES
    if pick(writable_git, config.writable_git):
        names = tuple(n for n in names if n != ".git")
    strict = pick(strict_exec, config.strict_exec)
    dirs: list[Path] = []
    if strict:
        dirs += [Path(os.path.realpath(_config_path(d, "exec_dirs"))) for d in config.exec_dirs]
        dirs += [_resolve(d, cwd) for d in exec_dirs]
    elif exec_dirs:
        raise ExecgateError("--exec-dir only applies with --strict-exec")
    if network is None:
        network_mode = "on" if config.network else "proxy" if config.network_proxy else "off"
        if network_mode == "off" and network_rules and chosen == "workspace-write":
            network_mode = "proxy"
    elif isinstance(network, bool):
        network_mode = "on" if network else "off"
    elif network in NETWORK_MODES:
        network_mode = network
    else:
        raise ExecgateError(f"unknown network mode {network!r} (on, off or proxy)")
    if network_mode == "proxy" and chosen == "off":
        if network == "proxy":
            raise ExecgateError(
                "--network proxy needs a sandbox (--sandbox read-only or workspace-write): "
                "with --sandbox off nothing is confined, the network included"
            )
        network_mode = "off"  # nothing is confined: there is no namespace to put a proxy in
    return SandboxSpec(
        mode=chosen,
        writable_roots=_dedupe(roots),
        protected_names=names,
        network=network_mode == "on",
        network_proxy=network_mode == "proxy",
        strict_exec=strict,
        exec_dirs=_dedupe(dirs),
    )


# -- command line ----------------------------------------------------------------------------


def add_sandbox_arguments(
    parser: argparse.ArgumentParser, *, default_mode: SandboxMode = "off"
) -> None:
    """Add the sandbox flags (``--sandbox MODE`` & co.) to a command's parser; read them back
    with :func:`sandbox_from_args` (``default_mode`` here is only for the help text)."""
    group = parser.add_argument_group("sandbox")
    group.add_argument(
        "--sandbox",
        dest="sandbox_mode",
        choices=SANDBOX_MODES,
        metavar="MODE",
        help="confine what runs: read-only, workspace-write or off "
        f"(default: sandbox.mode in config.toml, else {default_mode})",
    )
    group.add_argument(
        "--writable-root",
        dest="sandbox_writable_roots",
        action="append",
        default=[],
        metavar="DIR",
        help="another writable directory for workspace-write (repeatable)",
    )
    group.add_argument(
        "--network",
        dest="sandbox_network",
        nargs="?",
        const="on",
        choices=NETWORK_MODES,
        metavar="MODE",
        help="network access: on (no restriction; the default with no MODE), off, or proxy "
        "(only through the session's proxy, judged by network_rule; the default for "
        "workspace-write when network rules are in force; else off)",
    )
    group.add_argument(
        "--no-network", dest="sandbox_network", action="store_const", const="off",
        help="no network access (same as --network off)",
    )  # fmt: skip
    bool_flags = [
        (
            "--strict-exec",
            "sandbox_strict_exec",
            "execute programs only from system directories and --exec-dir ones",
        ),
        ("--exclude-tmp", "sandbox_exclude_tmp", "do not make /tmp (and /dev/shm) writable"),
        ("--exclude-tmpdir", "sandbox_exclude_tmpdir", "do not make $TMPDIR writable"),
        ("--writable-git", "sandbox_writable_git", "let .git in writable roots be written"),
    ]
    for flag, dest, text in bool_flags:
        group.add_argument(
            flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=text
        )
    group.add_argument(
        "--exec-dir",
        dest="sandbox_exec_dirs",
        action="append",
        default=[],
        metavar="DIR",
        help="another directory programs may be executed from under --strict-exec (repeatable)",
    )


def sandbox_from_args(
    args: argparse.Namespace,
    config: SandboxConfig | None,
    *,
    cwd: Path,
    default_mode: SandboxMode = "off",
    env: Mapping[str, str] | None = None,
    network_rules: bool = False,
) -> SandboxSpec:
    """The spec for flags added by :func:`add_sandbox_arguments`, over ``config``
    (``network_rules``: the policy has network rules in force, see :func:`build_spec`)."""
    return build_spec(
        args.sandbox_mode,
        cwd=cwd,
        config=config,
        default_mode=default_mode,
        writable_roots=args.sandbox_writable_roots,
        network=args.sandbox_network,
        strict_exec=args.sandbox_strict_exec,
        exec_dirs=args.sandbox_exec_dirs,
        exclude_tmp=args.sandbox_exclude_tmp,
        exclude_tmpdir=args.sandbox_exclude_tmpdir,
        writable_git=args.sandbox_writable_git,
        env=env,
        network_rules=network_rules,
    )
