"""Reading rules files from disk (through the cache) into a policy."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from execgate.policy.cache import RulesCache
from execgate.policy.evaluate import Policy
from execgate.policy.language import FileRules, PolicyBuilder, evaluate_rules_text
from execgate.policy.model import PolicyError


def read_rules_text(path: Path, identifier: str | None = None) -> str:
    """A rules file's text; unreadable files are errors in Codex's words."""
    name = identifier if identifier is not None else str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise PolicyError(f"failed to read policy at {name}: {reason}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise PolicyError(
            f"failed to read policy at {name}: stream did not contain valid UTF-8"
        ) from None


def compile_rules_file(
    path: Path, identifier: str | None = None, *, cache: RulesCache | None = None
) -> FileRules:
    """Evaluate one file, or take its evaluation from the cache when the text is unchanged."""
    name = identifier if identifier is not None else str(path)
    return compile_rules_text(read_rules_text(path, name), name, cache=cacheable(path, cache))


def cacheable(path: Path, cache: RulesCache | None) -> RulesCache | None:
    """The cache, for files the current user can write; else none.

    The cache lives in the user's own folder: an entry for an admin's file (which the user
    cannot edit) could be replaced to change that file's rules, so such files are always
    evaluated. For the user's own files an entry can do nothing the file itself could not.
    """
    if cache is None or not os.access(path, os.W_OK):
        return None
    return cache


def compile_rules_text(text: str, name: str, *, cache: RulesCache | None = None) -> FileRules:
    """Evaluate rules text loaded under ``name``, through the cache when there is one."""
    if cache is not None:
        cached = cache.get(name, text)
        if cached is not None:
            return cached
        rules = evaluate_rules_text(text, name)
        cache.put(name, text, rules)
        return rules
    return evaluate_rules_text(text, name)


def default_cache() -> RulesCache | None:
    """The user's cache, unless ``EXECGATE_NO_CACHE`` is set to a non-empty value."""
    return None if os.environ.get("EXECGATE_NO_CACHE") else RulesCache()


def load_rules_files(paths: Sequence[Path], *, cache: RulesCache | bool | None = True) -> Policy:
    """Exactly these files, in this order, into one policy (``execgate check --rules``).

    Each file is named in locations and errors as it was given (like Codex's CLI).
    """
    store = default_cache() if cache is True else (cache or None)
    builder = PolicyBuilder()
    for path in paths:
        builder.add_file(compile_rules_file(Path(path), str(path), cache=store))
    return builder.build()
