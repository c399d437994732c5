"""Codex's ``permissionProfile`` (``_meta["codex/sandbox-state"]`` of every 0.169 tool call)
mapped onto a spec, exactly or not at all.

Shapes, as Codex 0.169 sends them (captured from the real client; docs/mcp.md)::

    {"type": "disabled"}                                     danger-full-access
    {"type": "external", "network": "restricted"|"enabled"}  an outer sandbox confines
    {"type": "managed", "network": "restricted"|"enabled",
     "file_system": {"type": "unrestricted"}
                  | {"type": "restricted", "entries": [ENTRY, ...], "glob_scan_max_depth": N}}

    ENTRY = {"path": PATH, "access": "read"|"write"|"none", "missing_path_behavior": "skip"}
    PATH  = {"type": "path", "path": "/abs"}
          | {"type": "special", "value": {"kind": "root"|"minimal"|"current_working_directory"
                                                 |"tmpdir"|"slash_tmp"}}
          | {"type": "special", "value": {"kind": "project_roots", "subpath": "rel"}}
          | {"type": "glob_pattern", "pattern": "..."}

Codex's precedence: the most specific entry for a path wins; on a tie ``none`` beats ``write``
beats ``read``. execgate confines writes, not reads, so a profile must let ``:root`` be read
(everything is readable in every execgate profile); ``write`` entries become writable roots,
``read`` entries inside them read-only carve-outs, ``none`` entries hidden folders. Whatever
cannot be enforced exactly (a read restriction, a glob that grants or denies, an unknown kind, a
writable folder inside a read-only one, a file to hide) raises :class:`CodexProfileError` naming
it: the caller refuses the call rather than run it in a sandbox the client did not ask for.

The result is the client's wish; the server then keeps its writable roots within its own bounds
(:meth:`SandboxSpec.within`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from execgate.config import SandboxConfig
from execgate.sandbox.codex import CodexPolicyError, spec_from_codex_policy
from execgate.sandbox.spec import OFF, PROTECTED_NAMES, SandboxSpec

ROOT: Final = Path("/")
ROOT_KIND: Final = {"kind": "root"}
SLASH_TMP: Final = Path("/tmp")
NETWORK: Final = {"restricted": False, "enabled": True}
ACCESS_RANK: Final = {"read": 0, "write": 1, "none": 2}  # Codex's tie-break order
MISSING_PATH_BEHAVIORS: Final = ("skip",)


class CodexProfileError(CodexPolicyError):
    """A ``permissionProfile`` execgate cannot enforce exactly (the message names the part)."""


@dataclass(frozen=True, slots=True)
class _Entry:
    path: Path
    access: str
    shown: str  # how the entry is named in messages


def sandbox_cwd(value: object) -> Path:
    """Codex's ``sandboxCwd``: a ``file://`` URI (0.169) or an absolute path (older clients)."""
    if not isinstance(value, str) or not value:
        raise CodexProfileError(f"`sandboxCwd` must be a file URI or an absolute path: {value!r}")
    if value.startswith("file:"):
        parts = urlsplit(value)
        if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
            raise CodexProfileError(f"`sandboxCwd` {value!r} is not a local file URI")
        value = unquote(parts.path)
    if not os.path.isabs(value):
        raise CodexProfileError(f"`sandboxCwd` {value!r} is not absolute")
    return Path(os.path.normpath(value))


def _network(profile: Mapping[str, Any]) -> bool:
    value = profile.get("network")
    if value not in NETWORK:
        raise CodexProfileError(
            f'permissionProfile: `network` must be "restricted" or "enabled", got {value!r}'
        )
    return NETWORK[value]


def _absolute(value: object, what: str) -> Path:
    if not isinstance(value, str) or not os.path.isabs(value):
        raise CodexProfileError(f"permissionProfile: {what} {value!r} is not an absolute path")
    return Path(os.path.realpath(value))


def _special(value: object, *, cwd: Path, env: Mapping[str, str]) -> Path | None:
    """The folder a special path names (None: nothing here, as for an unset ``$TMPDIR``)."""
    kind = value.get("kind") if isinstance(value, Mapping) else None
    if kind == "root":
        return ROOT
    if kind == "slash_tmp":
        return SLASH_TMP
    if kind == "tmpdir":
        tmpdir = env.get("TMPDIR", "")
        return Path(os.path.realpath(tmpdir)) if os.path.isabs(tmpdir) else None
    if kind == "current_working_directory":
        return Path(os.path.realpath(cwd))
    if kind == "project_roots":
        assert isinstance(value, Mapping)
        sub = value.get("subpath")
        if sub is None:
            return Path(os.path.realpath(cwd))
        if not isinstance(sub, str) or os.path.isabs(sub) or ".." in PurePosixPath(sub).parts:
            raise CodexProfileError(
                f"permissionProfile: project_roots subpath {sub!r} is not a relative path "
                "inside the project"
            )
        return Path(os.path.realpath(cwd / sub))
    raise CodexProfileError(f"permissionProfile: unknown special path {value!r}")


def _entries(raw: object, *, cwd: Path, env: Mapping[str, str]) -> list[_Entry]:
    if not isinstance(raw, list):
        raise CodexProfileError("permissionProfile: `file_system.entries` must be a list")
    entries: list[_Entry] = []
    for item in raw:
        if not isinstance(item, Mapping):
            raise CodexProfileError(f"permissionProfile: entry {item!r} is not an object")
        access, path = item.get("access"), item.get("path")
        if access not in ACCESS_RANK:
            raise CodexProfileError(f"permissionProfile: unknown access {access!r} in {item!r}")
        missing = item.get("missing_path_behavior")
        if missing is not None and missing not in MISSING_PATH_BEHAVIORS:
            raise CodexProfileError(
                f"permissionProfile: unknown missing_path_behavior {missing!r} in {item!r}"
            )
        kind = path.get("type") if isinstance(path, Mapping) else None
        if kind == "path":
            assert isinstance(path, Mapping)
            entries.append(_Entry(_absolute(path.get("path"), "path"), access, path["path"]))
        elif kind == "special":
            assert isinstance(path, Mapping)
            value = path.get("value")
            if isinstance(value, Mapping) and value.get("kind") == "minimal":
                if access != "read":  # the platform's defaults: readable in every profile
                    raise CodexProfileError(
                        f"permissionProfile: `:minimal` with access {access!r} cannot be "
                        "enforced (only reading it can)"
                    )
                continue
            target = _special(value, cwd=cwd, env=env)
            if target is not None:
                shown = f":{value['kind']}" if isinstance(value, Mapping) else repr(value)
                entries.append(_Entry(target, access, shown))
        elif kind == "glob_pattern":
            assert isinstance(path, Mapping)
            if access != "read":  # reading is allowed everywhere anyway
                raise CodexProfileError(
                    f"permissionProfile: glob pattern {path.get('pattern')!r} with access "
                    f"{access!r} cannot be enforced (execgate confines folders, not patterns)"
                )
        else:
            raise CodexProfileError(f"permissionProfile: unknown path {path!r}")
    return entries


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _effective(entries: Sequence[_Entry]) -> dict[Path, _Entry]:
    """One entry per path: on a tie ``none`` beats ``write`` beats ``read``."""
    chosen: dict[Path, _Entry] = {}
    for entry in entries:
        old = chosen.get(entry.path)
        if old is None or ACCESS_RANK[entry.access] > ACCESS_RANK[old.access]:
            chosen[entry.path] = entry
    return chosen


def _nearest(path: Path, entries: Mapping[Path, _Entry]) -> _Entry | None:
    """The most specific entry strictly above ``path``."""
    above = [e for p, e in entries.items() if p != path and _under(path, p)]
    return max(above, key=lambda e: len(e.path.parts), default=None)


def spec_from_permission_profile(
    profile: object,
    *,
    cwd: Path,
    config: SandboxConfig | None = None,
    env: Mapping[str, str] | None = None,
) -> SandboxSpec:
    """The spec enforcing ``profile`` (Codex's ``permissionProfile``) for a client whose
    ``sandboxCwd`` is ``cwd``. ``config`` contributes what a profile cannot say (strict-exec,
    exec dirs, ``writable_git``); ``env`` gives ``$TMPDIR`` (default ``os.environ``)."""
    config = config or SandboxConfig()
    env = os.environ if env is None else env
    if not isinstance(profile, Mapping):
        raise CodexProfileError("permissionProfile must be a JSON object")
    kind = profile.get("type")
    if kind == "disabled":
        return OFF
    if kind == "external":
        _network(profile)
        return OFF  # confinement is the outer sandbox's job (as for legacy external-sandbox)
    if kind != "managed":
        raise CodexProfileError(
            f"permissionProfile: unknown type {kind!r} (expected managed, disabled or external)"
        )
    network = _network(profile)
    file_system = profile.get("file_system")
    fs_kind = file_system.get("type") if isinstance(file_system, Mapping) else None
    if fs_kind == "unrestricted":
        raw: list[Any] = [{"path": {"type": "special", "value": ROOT_KIND}, "access": "write"}]
    elif fs_kind == "restricted":
        assert isinstance(file_system, Mapping)
        raw = file_system.get("entries", [])
    else:
        raise CodexProfileError(f"permissionProfile: unknown file_system {file_system!r}")

    entries = _effective(_entries(raw, cwd=cwd, env=env))
    root = entries.get(ROOT)
    if root is None or root.access == "none":
        raise CodexProfileError(
            "permissionProfile: reading is limited to listed paths (no `:root` read entry); "
            "execgate confines writes, not reads"
        )
    writable: list[Path] = []
    readonly: list[Path] = []
    hidden: list[Path] = []
    # What each entry makes of its folder: "write", "read" (read-only because everything is),
    # "carve" (read-only inside a writable folder) or "none" (hidden).
    role: dict[Path, str] = {}
    for path in sorted(entries, key=lambda p: len(p.parts)):
        entry = entries[path]
        outer = _nearest(path, entries)
        around = role[outer.path] if outer is not None else "read"
        if entry.access == "write":
            if around in ("carve", "none"):
                assert outer is not None
                raise CodexProfileError(
                    f"permissionProfile: {entry.shown} is writable inside {outer.shown}, which "
                    f"is {'hidden' if around == 'none' else 'read-only'}: execgate cannot open "
                    "a writable folder inside a read-only one"
                )
            role[path] = "write"
            writable.append(path)
        elif entry.access == "read":
            if around == "none":
                assert outer is not None
                raise CodexProfileError(
                    f"permissionProfile: {entry.shown} is readable inside {outer.shown}, which "
                    "is hidden: execgate cannot show a folder inside a hidden one"
                )
            role[path] = "read" if around == "read" else "carve"
            if around == "write":
                readonly.append(path)
        else:
            if path.exists() and not path.is_dir():
                raise CodexProfileError(
                    f"permissionProfile: {entry.shown} is a file; execgate can hide folders only"
                )
            role[path] = "none"
            if around != "none":
                hidden.append(path)
    names = tuple(n for n in PROTECTED_NAMES if n != ".git" or not config.writable_git)
    exec_dirs = tuple(Path(os.path.realpath(d)) for d in config.exec_dirs)
    return SandboxSpec(
        mode="workspace-write" if writable else "read-only",
        writable_roots=tuple(writable),
        readonly_paths=tuple(readonly),
        hidden_paths=tuple(hidden),
        protected_names=names,
        network=network,
        strict_exec=config.strict_exec,
        exec_dirs=exec_dirs if config.strict_exec else (),
    )


def spec_from_sandbox_state(
    state: object,
    *,
    server_cwd: Path,
    config: SandboxConfig | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[SandboxSpec, str]:
    """The spec for one Codex sandbox state (``_meta["codex/sandbox-state"]``, or the params
    of ``codex/sandbox-state/update``) and which field it came from: ``permissionProfile``
    (0.169) when present, else the older ``sandboxPolicy`` (a relative ``sandboxCwd`` is
    taken from ``server_cwd``, as before). A state with neither is refused."""
    if not isinstance(state, Mapping):
        raise CodexProfileError("the sandbox state must be a JSON object")
    if "permissionProfile" in state:
        cwd = sandbox_cwd(state.get("sandboxCwd"))
        spec = spec_from_permission_profile(
            state["permissionProfile"], cwd=cwd, config=config, env=env
        )
        return spec, "permissionProfile"
    if "sandboxPolicy" in state:
        raw_cwd = state.get("sandboxCwd")
        if not isinstance(raw_cwd, str):
            raise CodexPolicyError(f"`sandboxCwd` must be a string, got {raw_cwd!r}")
        cwd = sandbox_cwd(raw_cwd) if raw_cwd.startswith("file:") else server_cwd / raw_cwd
        return spec_from_codex_policy(state["sandboxPolicy"], cwd=cwd, config=config, env=env), (
            "sandboxPolicy"
        )
    raise CodexProfileError(
        "the sandbox state has neither `permissionProfile` nor `sandboxPolicy` "
        f"(keys: {', '.join(sorted(map(str, state))) or 'none'})"
    )
