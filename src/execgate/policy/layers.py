"""Where rules come from, lowest layer first, and which projects are trusted.

1. built-in default (``default.rules`` in this package), unless ``config.toml`` says
   ``default_policy = false`` (rules of the user's own never switch it off: Codex writes a
   rules file on "don't ask again", and that must not cost the protection);
2. system: ``/etc/execgate/rules`` and Codex's ``/etc/codex/rules`` (see ``paths``);
3. user: ``$EXECGATE_HOME/rules`` and Codex's ``$CODEX_HOME/rules``;
4. project: ``<dir>/.execgate/rules`` and ``<dir>/.codex/rules`` for the repository root down to
   the working directory, only for trusted directories;
5. admin requirements (see ``requirements``), applied last -- also over rules files chosen
   with ``--rules`` (:func:`load_chosen_policy`).

Codex's folders are skipped when ``import_codex_rules = false``. A folder contributes the regular
files directly in it whose extension is ``.rules``, sorted by name -- Codex's exact rule, so
symlinks and sub-folders are ignored. Because the strictest decision wins, a higher layer can add
rules but never relax a lower layer's ``forbidden`` or ``prompt``.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from execgate import paths
from execgate.config import Config, load_config
from execgate.files import make_private_dir, open_private
from execgate.policy.cache import RulesCache
from execgate.policy.evaluate import Policy
from execgate.policy.language import FileRules, PolicyBuilder
from execgate.policy.loader import (
    compile_rules_file,
    compile_rules_text,
    default_cache,
)
from execgate.policy.model import PolicyError
from execgate.policy.requirements import Fetcher, fetch_url, load_requirements

LAYERS = ("default", "system", "user", "project", "requirements")  # and "file": --rules


class RulesSource(NamedTuple):
    """One loaded source: its layer and file (or URL, for requirements)."""

    layer: str
    path: Path


@dataclass(frozen=True)
class LoadedPolicy:
    """The effective policy for a working directory and how it was put together."""

    policy: Policy
    sources: list[RulesSource]
    # Files and folders whose change means the policy should be reloaded (existing or not).
    watch_paths: list[Path]
    # Set when admin requirements could not be obtained in fail-closed mode: deny every exec.
    fail_closed_reason: str | None = None
    warnings: list[str] = field(default_factory=list)
    # Every rules folder consulted, by layer, in load order (for `execgate rules list`).
    folders: list[RulesSource] = field(default_factory=list)
    # False for exactly the files given with --rules: no layers, no user layer to write "always"
    # answers to.
    layered: bool = True


def default_rules_path() -> Path:
    return Path(__file__).with_name("default.rules")


_HOMES_LINE = "HOMES = []"


def default_rules_text(home: str | None = None) -> str:
    """The built-in default policy, with ``HOMES`` naming the home directory to protect.

    The line is replaced in place, so line numbers stay those of the shipped file.
    """
    text = default_rules_path().read_text(encoding="utf-8")
    home = home if home is not None else os.environ.get("HOME", "")
    home = os.path.normpath(home) if home.startswith("/") else ""
    if home and home != "/":
        text = text.replace(_HOMES_LINE, f"HOMES = [{json.dumps(home, ensure_ascii=False)}]", 1)
    return text


def rules_files_in(folder: Path) -> list[Path]:
    """Codex's collection rule: regular ``*.rules`` files directly in ``folder``, sorted."""
    try:
        with os.scandir(folder) as entries:
            found = [
                Path(entry.path)
                for entry in entries
                if Path(entry.name).suffix == ".rules" and entry.is_file(follow_symlinks=False)
            ]
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise PolicyError(f"cannot read rules folder {folder}: {exc.strerror}") from None
    return sorted(found, key=lambda p: os.fsencode(p.name))


#: The folders of a project whose ``rules`` folder is a project layer.
PROJECT_FOLDERS = (".execgate", ".codex")

# --- trust ----------------------------------------------------------------------------------


def trust_file() -> Path:
    return paths.execgate_home() / "trusted-projects.toml"


def _canonical(directory: Path) -> Path:
    return Path(os.path.realpath(directory))


def repository_root(directory: Path) -> Path | None:
    """The nearest ancestor (or itself) holding a ``.git`` folder or file."""
    for candidate in (directory, *directory.parents):
        if (candidate / ".git").exists():
            return candidate
    return None


def project_root(directory: Path) -> Path:
    """What ``execgate trust`` trusts by default: the repository root, else the directory."""
    directory = _canonical(directory)
    return repository_root(directory) or directory


def _read_trusted(text: str, where: Path) -> list[str]:
    import tomllib  # here: most start-ups have no trust list to parse

    try:
        data = tomllib.loads(text) if text.strip() else {}
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"invalid TOML: {exc}", path=str(where)) from None
    trusted = data.get("trusted", [])
    if not isinstance(trusted, list) or not all(isinstance(t, str) for t in trusted):
        raise PolicyError("`trusted` must be a list of paths", path=str(where))
    return trusted


def trusted_projects() -> list[Path]:
    where = trust_file()
    try:
        text = where.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise PolicyError(f"cannot read the trust list: {exc.strerror}", path=str(where)) from None
    except UnicodeDecodeError as exc:
        raise PolicyError(_not_utf8(exc), path=str(where)) from None
    return [Path(p) for p in _read_trusted(text, where)]


def _not_utf8(exc: UnicodeDecodeError) -> str:
    return f"not UTF-8 text (byte {exc.start}); fix or remove the file"


def trusted_project_folders() -> list[Path]:
    """``<project>/.execgate`` and ``<project>/.codex`` of every trusted project, existing or
    not: a session must not create them (with rules inside) where it may write
    (``sandbox.guarded`` makes them read-only carve-outs)."""
    return [project / name for project in trusted_projects() for name in PROJECT_FOLDERS]


def is_trusted(directory: Path, trusted: list[Path] | None = None) -> bool:
    """Whether ``directory`` itself is on the trust list. Folders below a trusted one are not:
    a sandboxed session can create folders there, but not the trusted folders' own
    ``.execgate``/``.codex``, which every sandbox keeps read-only."""
    return _canonical(directory) in (trusted if trusted is not None else trusted_projects())


def _update_trust(directory: Path, add: bool) -> bool:
    where = trust_file()
    target = str(_canonical(directory))
    try:
        make_private_dir(where.parent)
        fd = open_private(where, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        raise PolicyError(f"cannot write the trust list: {exc.strerror}", path=str(where)) from None
    with os.fdopen(fd, "r+", encoding="utf-8") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            text = handle.read()
        except UnicodeDecodeError as exc:
            raise PolicyError(_not_utf8(exc), path=str(where)) from None
        trusted = _read_trusted(text, where)
        if (target in trusted) == add:
            return False
        trusted = [*trusted, target] if add else [t for t in trusted if t != target]
        handle.seek(0)
        handle.truncate()
        handle.write("# Projects whose .execgate/rules and .codex/rules execgate loads.\n")
        handle.write("# Managed by `execgate trust` / `execgate untrust`.\n")
        handle.write(
            "trusted = [\n"
            + "".join(f"    {json.dumps(t, ensure_ascii=False)},\n" for t in trusted)
            + "]\n"
        )
    return True


def trust_project(directory: Path) -> bool:
    """Put ``directory`` on the trust list (its own ``.execgate``/``.codex`` rules are read);
    ``False`` if it already was."""
    return _update_trust(directory, add=True)


def untrust_project(directory: Path) -> bool:
    return _update_trust(directory, add=False)


# --- layered loading ------------------------------------------------------------------------


def project_dirs(cwd: Path) -> list[Path]:
    """The repository root down to ``cwd`` (just ``cwd`` outside a repository)."""
    cwd = _canonical(cwd)
    root = repository_root(cwd)
    if root is None:
        return [cwd]
    chain = [cwd]
    for parent in cwd.parents:
        chain.append(parent)
        if parent == root:
            break
    return list(reversed(chain))


def rules_folders(cwd: Path, config: Config) -> Iterator[RulesSource]:
    """Every rules folder to consult, lowest layer first (the default layer excluded)."""
    codex = config.import_codex_rules
    yield RulesSource("system", paths.system_dir() / "rules")
    if codex:
        yield RulesSource("system", paths.codex_system_dir() / "rules")
    yield RulesSource("user", paths.user_rules_dir())
    if codex:
        yield RulesSource("user", paths.codex_home() / "rules")
    trusted = trusted_projects()
    for directory in project_dirs(cwd):
        if is_trusted(directory, trusted):
            yield RulesSource("project", directory / ".execgate" / "rules")
            if codex:
                yield RulesSource("project", directory / ".codex" / "rules")


def load_layered_policy(
    cwd: Path,
    *,
    config: Config | None = None,
    cache: RulesCache | bool | None = True,
    fetch: Fetcher = fetch_url,
) -> LoadedPolicy:
    """The policy for commands run in ``cwd``: every layer, then admin requirements.

    A rules file that cannot be read or evaluated raises ``PolicyError``: start-up stops rather
    than run with rules silently missing.
    """
    config = config or load_config()
    store = default_cache() if cache is True else (cache or None)
    folders: list[RulesSource] = []
    files: list[tuple[RulesSource, FileRules]] = []
    seen: set[Path] = set()
    watch: list[Path] = []
    for source in rules_folders(cwd, config):
        real = _canonical(source.path)
        if real in seen:  # e.g. the home directory as a project: its rules are the user layer
            continue
        seen.add(real)
        folders.append(source)
        watch.append(source.path)
        for path in rules_files_in(source.path):
            files.append((RulesSource(source.layer, path), compile_rules_file(path, cache=store)))
            watch.append(path)
    if config.default_policy:
        default = default_rules_path()
        # Cached even where the package is not the user's to write (an installation by root):
        # the user decides whether the built-in rules apply at all (`default_policy`), so an
        # entry in the user's cache can do nothing the user's own config could not.
        compiled = compile_rules_text(default_rules_text(), str(default), cache=store)
        files.insert(0, (RulesSource("default", default), compiled))
    watch += [config.path or paths.config_file(), trust_file()]
    return _under_requirements(files, watch, folders, fetch)


def load_chosen_policy(
    files: Sequence[Path], *, cache: RulesCache | bool | None = True, fetch: Fetcher = fetch_url
) -> LoadedPolicy:
    """Exactly these rules files, in this order (``--rules``), then admin requirements: a
    user's choice of rules replaces the layers, never the admin's requirements.

    Each file is named in locations and errors as it was given (like Codex's CLI).
    """
    store = default_cache() if cache is True else (cache or None)
    compiled = [
        (RulesSource("file", Path(path)), compile_rules_file(Path(path), str(path), cache=store))
        for path in files
    ]
    return _under_requirements(compiled, [Path(path) for path in files], [], fetch, layered=False)


def _under_requirements(
    files: list[tuple[RulesSource, FileRules]],
    watch: list[Path],
    folders: list[RulesSource],
    fetch: Fetcher,
    *,
    layered: bool = True,
) -> LoadedPolicy:
    """``files`` in order, with the admin requirements laid over them last."""
    builder = PolicyBuilder()
    for _, file_rules in files:
        builder.add_file(file_rules)
    requirements = load_requirements(fetch=fetch)
    builder.add_rules(requirements.rules)
    sources = [source for source, _ in files]
    sources += [RulesSource("requirements", Path(s)) for s in requirements.sources]
    return LoadedPolicy(
        policy=builder.build(),
        sources=sources,
        watch_paths=[*watch, *requirements.watch_paths],
        fail_closed_reason=requirements.fail_closed_reason,
        warnings=requirements.warnings,
        folders=folders,
        layered=layered,
    )
