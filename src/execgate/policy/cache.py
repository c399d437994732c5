"""On-disk cache of evaluated rules files, so a large policy loads without running Starlark.

An entry is keyed by a hash of the execgate version, the cache format, the name the file is
loaded under (it appears in every location) and the file's exact text: a stale entry can never
be found for edited content. Entries are JSON (never pickle: the cache directory must not be a
way to run code), are checked field by field when read, and anything unexpected -- a truncated
write, a hand edit, a different layout -- makes the entry count as absent.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
from collections.abc import Iterable, Iterator
from functools import partial
from itertools import chain, repeat
from pathlib import Path
from typing import Any

from execgate import __version__, paths
from execgate.files import make_private_dir, write_atomically
from execgate.policy.language import ExampleCheck, FileRules
from execgate.policy.model import Decision, NetworkRule, PrefixRule, SourceLocation

CACHE_FORMAT = 2
# Every size is cached: evaluating even a one-rule file loads the Starlark engine, about 10 ms
# of CPU and 8 MB in a server that would otherwise not need it (entries stay few).
MAX_ENTRIES = 64


def default_cache_dir() -> Path:
    return paths.cache_dir() / "policy"


def cache_key(identifier: str, text: str) -> str:
    digest = hashlib.sha256()
    for part in (__version__, str(CACHE_FORMAT), identifier, text):
        data = part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def _encode(key: str, rules: FileRules) -> dict[str, Any]:
    """Columns rather than rows: decoding then runs mostly in C (see ``_decode``)."""

    def where(source: SourceLocation | None) -> tuple[int, int]:
        return (source.line, source.column) if source else (0, 0)

    prefix = rules.rules
    return {
        "format": CACHE_FORMAT,
        "key": key,
        "identifier": rules.identifier,
        "programs": [r.program for r in prefix],
        "rests": [[list(tok) for tok in r.rest] for r in prefix],
        "decisions": [r.decision.value for r in prefix],
        "justifications": [r.justification for r in prefix],
        "canonical": [r.canonical_matching for r in prefix],
        "lines": [where(r.source)[0] for r in prefix],
        "columns": [where(r.source)[1] for r in prefix],
        "network": [
            [n.host, n.protocol, n.decision.value, n.justification, *where(n.source)]
            for n in rules.network_rules
        ],
        "hosts": [[name, list(ps)] for name, ps in rules.host_executables],
        "examples": [
            [
                list(c.rule_indexes),
                [list(e) for e in c.matches],
                [list(e) for e in c.not_matches],
                c.location.line,
                c.location.column,
            ]
            for c in rules.examples
        ],
    }


def _strs(value: Any) -> tuple[str, ...]:
    # str.join type-checks every item in C: much cheaper than a Python-level loop.
    if type(value) is not list:
        raise ValueError("expected a list of strings")
    "".join(value)
    return tuple(value)


def _int(value: Any) -> int:
    if type(value) is not int:
        raise ValueError("expected an integer")
    return value


def _opt_str(value: Any) -> str | None:
    if value is not None and type(value) is not str:
        raise ValueError("expected a string or null")
    return value


def _only(types: set[type], values: Iterable[Any]) -> None:
    if not set(map(type, values)) <= types:
        raise ValueError("unexpected value type")


# tuple.__new__ on a NamedTuple class builds an instance without the Python-level __new__.
_new_rule = partial(tuple.__new__, PrefixRule)
_new_location = partial(tuple.__new__, SourceLocation)


def _decode_rules(data: dict[str, Any], identifier: str) -> list[PrefixRule]:
    programs, rests = data["programs"], data["rests"]
    justifications, canonical = data["justifications"], data["canonical"]
    lines, columns = data["lines"], data["columns"]
    decisions = [_DECISIONS[d] for d in data["decisions"]]
    columns_ = (programs, rests, decisions, justifications, canonical, lines, columns)
    if any(type(c) is not list for c in columns_) or len({len(c) for c in columns_}) != 1:
        raise ValueError("ragged rule columns")
    _only({str}, programs)
    _only({str, type(None)}, justifications)
    _only({bool}, canonical)
    _only({int}, lines)
    _only({int}, columns)
    _only({list}, rests)
    _only({list}, chain.from_iterable(rests))
    "".join(chain.from_iterable(chain.from_iterable(rests)))  # every token a string
    if not all(map(all, rests)):
        raise ValueError("empty alternatives")
    patterns = [tuple(map(tuple, rest)) for rest in rests]
    sources = list(
        map(_new_location, zip(repeat(identifier, len(lines)), lines, columns, strict=True))
    )
    return list(
        map(
            _new_rule,
            zip(programs, patterns, decisions, justifications, canonical, sources, strict=True),
        )
    )


_DECISIONS = {d.value: d for d in Decision}


def _decode(data: Any, key: str, identifier: str) -> FileRules:
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or data.get("key") != key:
        raise ValueError("not an entry for this file")
    if data.get("identifier") != identifier:
        raise ValueError("entry for another name")

    def where(line: Any, column: Any) -> SourceLocation:
        return SourceLocation(identifier, _int(line), _int(column))

    result = FileRules(identifier, _decode_rules(data, identifier))
    for host, protocol, decision, justification, line, column in data["network"]:
        if type(host) is not str or type(protocol) is not str:
            raise ValueError("bad network rule")
        result.network_rules.append(
            NetworkRule(
                host, protocol, _DECISIONS[decision], _opt_str(justification), where(line, column)
            )
        )
    for name, host_paths in data["hosts"]:
        if type(name) is not str:
            raise ValueError("bad host executable")
        result.host_executables.append((name, _strs(host_paths)))
    for indexes, matches, not_matches, line, column in data["examples"]:
        rule_indexes = tuple(_int(i) for i in indexes)
        if any(not 0 <= i < len(result.rules) for i in rule_indexes):
            raise ValueError("example refers to a missing rule")
        result.examples.append(
            ExampleCheck(
                rule_indexes,
                tuple(_strs(e) for e in matches),
                tuple(_strs(e) for e in not_matches),
                where(line, column),
            )
        )
    return result


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Decoding allocates ~100k containers and no cycles; the cyclic GC would only run
    repeatedly over them (it halves the decoding time to keep it off)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class RulesCache:
    """Evaluated rules files by content hash, in ``directory`` (default: the user cache)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or default_cache_dir()

    def _entry(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, identifier: str, text: str) -> FileRules | None:
        key = cache_key(identifier, text)
        try:
            raw = self._entry(key).read_bytes()
            with _collector_paused():
                return _decode(json.loads(raw), key, identifier)
        except (OSError, ValueError, TypeError, KeyError, IndexError):
            return None

    def put(self, identifier: str, text: str, rules: FileRules) -> None:
        """Store an entry; failures (read-only home, full disk) only cost the next load time."""
        key = cache_key(identifier, text)
        data = json.dumps(_encode(key, rules), ensure_ascii=False, separators=(",", ":"))
        try:
            make_private_dir(self.directory)
            write_atomically(self._entry(key), data.encode("utf-8"))
            self._prune()
        except OSError:
            pass

    def _prune(self) -> None:
        entries = sorted(self.directory.glob("*.json"), key=_mtime, reverse=True)
        for stale in entries[MAX_ENTRIES:]:
            with contextlib.suppress(OSError):
                stale.unlink()


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
