"""Admin requirements: prefix rules that are applied last and can only tighten.

Sources, all optional:

* ``$EXECGATE_SYSTEM_DIR/requirements.toml`` (default ``/etc/execgate``): ``[rules]
  prefix_rules`` plus the settings ``requirements_url``, ``requirements_timeout`` and
  ``on_requirements_error``;
* the document at ``requirements_url`` (same ``[rules]`` table), fetched at start with a timeout
  and cached in ``$EXECGATE_HOME/cache/requirements/``;
* Codex's ``/etc/codex/requirements.toml`` (``$EXECGATE_CODEX_SYSTEM_DIR``): only its
  ``[rules]`` table is read, so an organisation's Codex constraints apply unchanged.

Rules use Codex's TOML form (``token`` / ``any_of`` tables) and its validation messages; an
``allow`` decision is refused, because requirements exist to tighten.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from execgate import __version__, paths
from execgate.policy.model import Decision, PatternToken, PolicyError, PrefixRule, SourceLocation

ON_ERROR_MODES = ("fail-closed", "fail-open")
DEFAULT_TIMEOUT = 5.0
MAX_DOCUMENT_BYTES = 4 * 1024 * 1024
_SETTINGS_KEYS = {"requirements_url", "requirements_timeout", "on_requirements_error", "rules"}
_RULE_KEYS = {"pattern", "decision", "justification", "canonical_matching"}
_DECISIONS = {
    "prompt": Decision.PROMPT,
    # Codex's "ask a human even under automatic review"; execgate has one prompt route.
    "prompt-user": Decision.PROMPT,
    "forbidden": Decision.FORBIDDEN,
}

# (url, timeout seconds) -> document text; replaceable in tests.
Fetcher = Callable[[str, float], str]


def requirements_file() -> Path:
    return paths.system_dir() / "requirements.toml"


def codex_requirements_file() -> Path:
    return paths.codex_system_dir() / "requirements.toml"


def requirements_cache_dir() -> Path:
    return paths.cache_dir() / "requirements"


class _Invalid(Exception):
    pass


def _token(raw: Any, index: int, position: int) -> PatternToken:
    def bad(reason: str) -> _Invalid:
        return _Invalid(
            f"rules prefix_rule at index {index} has an invalid pattern token at index "
            f"{position}: {reason}"
        )

    if not isinstance(raw, dict):
        raise bad("set either token or any_of")
    unknown = set(raw) - {"token", "any_of"}
    if unknown:
        raise bad(f"unknown field `{sorted(unknown)[0]}`")
    if "token" in raw and "any_of" in raw:
        raise bad("set either token or any_of, not both")
    if "token" in raw:
        token = raw["token"]
        if not isinstance(token, str):
            raise bad("token must be a string")
        if not token.strip():
            raise bad("token cannot be empty")
        return (token,)
    if "any_of" in raw:
        alternatives = raw["any_of"]
        if not isinstance(alternatives, list) or not all(isinstance(a, str) for a in alternatives):
            raise bad("any_of must be a list of strings")
        if not alternatives:
            raise bad("any_of cannot be empty")
        if any(not a.strip() for a in alternatives):
            raise bad("any_of cannot include empty tokens")
        return tuple(alternatives)
    raise bad("set either token or any_of")


def parse_requirement_rules(document: dict[str, Any], origin: str) -> list[PrefixRule]:
    """The ``[rules] prefix_rules`` of a requirements document (raises ``_Invalid``)."""
    table = document.get("rules")
    if table is None:
        return []
    if not isinstance(table, dict):
        raise _Invalid("`rules` must be a table")
    unknown = set(table) - {"prefix_rules"}
    if unknown:
        raise _Invalid(f"unknown key `rules.{sorted(unknown)[0]}`")
    entries = table.get("prefix_rules")
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise _Invalid("`rules.prefix_rules` must be an array")
    if not entries:
        raise _Invalid("rules prefix_rules cannot be empty")
    rules: list[PrefixRule] = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise _Invalid(f"rules prefix_rule at index {index} must be a table")
        unknown = set(entry) - _RULE_KEYS
        if unknown:
            raise _Invalid(
                f"rules prefix_rule at index {index} has unknown field `{sorted(unknown)[0]}`"
            )
        pattern = entry.get("pattern")
        if not isinstance(pattern, list):
            raise _Invalid(f"rules prefix_rule at index {index} must have a `pattern` array")
        if not pattern:
            raise _Invalid(f"rules prefix_rule at index {index} has an empty pattern")
        tokens = [_token(raw, index, position) for position, raw in enumerate(pattern)]
        raw_decision = entry.get("decision")
        if raw_decision is None:
            raise _Invalid(f"rules prefix_rule at index {index} is missing a decision")
        if raw_decision == "allow":
            raise _Invalid(
                f"rules prefix_rule at index {index} has decision 'allow', which is not permitted "
                "in requirements.toml: Codex merges these rules with other config and uses the "
                "most restrictive result (use 'prompt', 'prompt-user', or 'forbidden')"
            )
        decision = _DECISIONS.get(raw_decision) if isinstance(raw_decision, str) else None
        if decision is None:
            raise _Invalid(
                f"rules prefix_rule at index {index} has an invalid decision {raw_decision!r} "
                "(use 'prompt', 'prompt-user', or 'forbidden')"
            )
        justification = entry.get("justification")
        if justification is not None and (
            not isinstance(justification, str) or not justification.strip()
        ):
            raise _Invalid(f"rules prefix_rule at index {index} has an empty justification")
        canonical = entry.get("canonical_matching", False)
        if not isinstance(canonical, bool):
            raise _Invalid(
                f"rules prefix_rule at index {index} has a non-boolean canonical_matching"
            )
        source = SourceLocation(f"{origin}#rules.prefix_rules[{index}]", 0, 0)
        rest = tuple(tokens[1:])
        for program in tokens[0]:
            rules.append(PrefixRule(program, rest, decision, justification, canonical, source))
    return rules


@dataclass(frozen=True)
class RequirementsSettings:
    """What the admin's ``requirements.toml`` says."""

    path: Path | None = None
    url: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    on_error: str = "fail-closed"
    rules: tuple[PrefixRule, ...] = ()


def _load_toml(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not valid UTF-8"
        raise PolicyError(f"cannot read requirements: {reason}", path=str(path)) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"invalid TOML: {exc}", path=str(path)) from None


def read_settings(path: Path | None = None) -> RequirementsSettings:
    """Parse ``requirements.toml`` (absent: no requirements). Errors stop start-up."""
    path = path or requirements_file()
    data = _load_toml(path)
    if data is None:
        return RequirementsSettings()
    where = str(path)
    unknown = set(data) - _SETTINGS_KEYS
    if unknown:
        raise PolicyError(f"unknown key `{sorted(unknown)[0]}`", path=where)
    url = data.get("requirements_url")
    if url is not None and (
        not isinstance(url, str) or urllib.parse.urlsplit(url).scheme not in ("http", "https")
    ):
        raise PolicyError("`requirements_url` must be an http:// or https:// URL", path=where)
    timeout = data.get("requirements_timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise PolicyError("`requirements_timeout` must be a positive number of seconds", path=where)
    on_error = data.get("on_requirements_error", "fail-closed")
    if on_error not in ON_ERROR_MODES:
        raise PolicyError(
            '`on_requirements_error` must be "fail-closed" or "fail-open"', path=where
        )
    try:
        rules = parse_requirement_rules(data, where)
    except _Invalid as exc:
        raise PolicyError(str(exc), path=where) from None
    return RequirementsSettings(path, url, float(timeout), on_error, tuple(rules))


def fetch_url(url: str, timeout: float) -> str:
    """GET ``url``; the timeout bounds connecting and the whole download."""
    deadline = time.monotonic() + timeout
    request = urllib.request.Request(url, headers={"User-Agent": f"execgate/{__version__}"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        status = getattr(response, "status", 200)
        if status != 200:
            raise OSError(f"HTTP status {status}")
        chunks: list[bytes] = []
        size = 0
        while chunk := response.read(65536):
            size += len(chunk)
            if size > MAX_DOCUMENT_BYTES:
                raise OSError("document larger than 4 MiB")
            if time.monotonic() > deadline:
                raise TimeoutError("timed out")
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP status {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        return _describe(exc.reason) if isinstance(exc.reason, BaseException) else str(exc.reason)
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, UnicodeDecodeError):
        return "the document is not valid UTF-8"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _parse_document(text: str, origin: str) -> list[PrefixRule]:
    data = tomllib.loads(text)
    unknown = set(data) - {"rules"}
    if unknown:
        raise _Invalid(f"unknown key `{sorted(unknown)[0]}`")
    return parse_requirement_rules(data, origin)


def _cache_path(url: str) -> Path:
    return requirements_cache_dir() / (hashlib.sha256(url.encode()).hexdigest()[:32] + ".toml")


def _write_cache(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError:
        pass  # a missing cache only matters on a later failure, which reports itself


@dataclass
class RequirementsResult:
    """The requirement rules to lay over the policy, and what happened getting them."""

    rules: list[PrefixRule] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # files (URL documents: their cached copy)
    warnings: list[str] = field(default_factory=list)
    fail_closed_reason: str | None = None
    watch_paths: list[Path] = field(default_factory=list)


def _from_url(settings: RequirementsSettings, result: RequirementsResult, fetch: Fetcher) -> None:
    url = settings.url
    assert url is not None
    cache = _cache_path(url)
    try:
        text = fetch(url, settings.timeout)
        rules = _parse_document(text, url)
    except (OSError, ValueError, urllib.error.URLError, _Invalid, tomllib.TOMLDecodeError) as exc:
        problem = _describe(exc)
    else:
        _write_cache(cache, text)
        result.rules.extend(rules)
        result.sources.append(str(cache))  # the on-disk copy of what the URL served
        return
    try:
        cached_text = cache.read_text(encoding="utf-8")
        rules = _parse_document(cached_text, url)
        stamp = datetime.fromtimestamp(cache.stat().st_mtime, UTC)
    except (OSError, ValueError, _Invalid, tomllib.TOMLDecodeError):
        pass
    else:
        result.rules.extend(rules)
        result.sources.append(str(cache))
        result.warnings.append(
            f"could not fetch requirements from {url} ({problem}); using the copy cached "
            f"{stamp:%Y-%m-%d %H:%M:%S} UTC"
        )
        return
    if settings.on_error == "fail-open":
        result.warnings.append(
            f"could not fetch requirements from {url} ({problem}) and there is no cached copy; "
            'continuing without them (on_requirements_error = "fail-open")'
        )
    else:
        result.fail_closed_reason = (
            f"admin requirements from {url} could not be fetched ({problem}) and there is no "
            'cached copy, so every command is denied (on_requirements_error = "fail-closed")'
        )


def load_requirements(*, fetch: Fetcher = fetch_url) -> RequirementsResult:
    """Every requirement rule, local file first, then the URL's, then Codex's file."""
    result = RequirementsResult()
    settings = read_settings()
    result.watch_paths.append(requirements_file())
    if settings.rules:
        result.rules.extend(settings.rules)
        result.sources.append(str(settings.path))
    if settings.url:
        _from_url(settings, result, fetch)
    codex_file = codex_requirements_file()
    result.watch_paths.append(codex_file)
    data = _load_toml(codex_file)
    if data is not None:
        try:
            codex_rules = parse_requirement_rules(data, str(codex_file))
        except _Invalid as exc:
            raise PolicyError(str(exc), path=str(codex_file)) from None
        if codex_rules:
            result.rules.extend(codex_rules)
            result.sources.append(str(codex_file))
    return result
