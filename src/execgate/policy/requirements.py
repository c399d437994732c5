"""Admin requirements: prefix rules that are applied last and can only tighten.

Sources, all optional:

* ``/etc/execgate/requirements.toml`` (only root may move the folder, see ``paths``):
  ``[rules] prefix_rules`` plus the settings ``requirements_url``, ``requirements_timeout``,
  ``requirements_refresh_interval``, ``requirements_public_key`` and ``on_requirements_error``;
* the document at ``requirements_url`` (same ``[rules]`` table), cached in
  ``$EXECGATE_HOME/cache/requirements/`` and fetched again only when the copy is older than the
  refresh interval or the server's ``Cache-Control: max-age`` (revalidated with its ``ETag``).
  With a public key, the document must carry a detached Ed25519 signature served at
  ``URL + ".sig"``; the cached copy is in the user's home, so it is verified on every load;
* Codex's ``/etc/codex/requirements.toml``: only its ``[rules]`` table is read, so an
  organisation's Codex constraints apply unchanged.

Rules use Codex's TOML form (``token`` / ``any_of`` tables) and its validation messages; an
``allow`` decision is refused, because requirements exist to tighten.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import time
import urllib.error
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from execgate import __version__, paths
from execgate.files import make_private_dir, write_atomically
from execgate.policy.model import Decision, PatternToken, PolicyError, PrefixRule, SourceLocation

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

# cryptography and urllib.request (http.client, ssl, email) are imported where a signed or
# URL requirement needs them: every session imports this module, few use either.

ON_ERROR_MODES = ("fail-closed", "fail-open")
DEFAULT_TIMEOUT = 5.0
# The longest a fetched document is used before the URL is asked again (Cache-Control's
# max-age can only shorten it).
DEFAULT_REFRESH_INTERVAL = 300.0
MAX_DOCUMENT_BYTES = 4 * 1024 * 1024
SIGNATURE_SUFFIX = ".sig"
_SETTINGS_KEYS = {
    "requirements_url",
    "requirements_timeout",
    "requirements_refresh_interval",
    "requirements_public_key",
    "on_requirements_error",
    "rules",
}
_RULE_KEYS = {"pattern", "decision", "justification", "canonical_matching"}
_DECISIONS = {
    "prompt": Decision.PROMPT,
    # Codex's "ask a human even under automatic review"; execgate has one prompt route.
    "prompt-user": Decision.PROMPT,
    "forbidden": Decision.FORBIDDEN,
}


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
    public_key: Ed25519PublicKey | None = None
    refresh_interval: float = DEFAULT_REFRESH_INTERVAL


def _load_toml(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not valid UTF-8"
        raise PolicyError(f"cannot read requirements: {reason}", path=str(path)) from None
    import tomllib  # here: most start-ups have no requirements file to parse

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"invalid TOML: {exc}", path=str(path)) from None


def parse_public_key(value: str) -> Ed25519PublicKey:
    """An Ed25519 public key: PEM (``-----BEGIN PUBLIC KEY-----``) or the base64 of the
    32 raw bytes. Raises ``ValueError``."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        if value.lstrip().startswith("-----BEGIN"):
            key = serialization.load_pem_public_key(value.strip().encode("ascii"))
            if not isinstance(key, Ed25519PublicKey):
                raise ValueError("not an Ed25519 key")
            return key
        raw = base64.b64decode(value.strip(), validate=True)
        if len(raw) != 32:
            raise ValueError("an Ed25519 key is 32 bytes")
        return Ed25519PublicKey.from_public_bytes(raw)
    except UnsupportedAlgorithm as exc:
        raise ValueError(str(exc)) from None


def _positive(data: dict[str, Any], key: str, default: float, where: str) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise PolicyError(f"`{key}` must be a positive number of seconds", path=where)
    return float(value)


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
    timeout = _positive(data, "requirements_timeout", DEFAULT_TIMEOUT, where)
    refresh = _positive(data, "requirements_refresh_interval", DEFAULT_REFRESH_INTERVAL, where)
    on_error = data.get("on_requirements_error", "fail-closed")
    if on_error not in ON_ERROR_MODES:
        raise PolicyError(
            '`on_requirements_error` must be "fail-closed" or "fail-open"', path=where
        )
    public_key = None
    if "requirements_public_key" in data:
        raw_key = data["requirements_public_key"]
        try:
            if not isinstance(raw_key, str):
                raise ValueError("not a string")
            public_key = parse_public_key(raw_key)
        except ValueError as exc:
            raise PolicyError(
                "`requirements_public_key` must be an Ed25519 public key (PEM, or base64 of "
                f"its 32 bytes): {exc}",
                path=where,
            ) from None
        if on_error == "fail-open":
            # A key says the URL's rules must hold; fail-open would let an unreachable URL
            # (which a user can arrange) drop them.
            raise PolicyError(
                '`on_requirements_error = "fail-open"` cannot be used with '
                "`requirements_public_key`: signed requirements always fail closed",
                path=where,
            )
    try:
        rules = parse_requirement_rules(data, where)
    except _Invalid as exc:
        raise PolicyError(str(exc), path=where) from None
    return RequirementsSettings(path, url, timeout, on_error, tuple(rules), public_key, refresh)


# -- fetching ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fetched:
    """One HTTP answer: the body (``None`` for 304 Not Modified) and its caching headers."""

    body: bytes | None
    etag: str | None = None
    max_age: float | None = None  # from Cache-Control; 0 for no-cache / no-store


# (url, timeout seconds, ETag to revalidate or None) -> the answer; replaceable in tests.
Fetcher = Callable[[str, float, str | None], Fetched]


def _max_age(cache_control: str | None) -> float | None:
    if not cache_control:
        return None
    for directive in cache_control.split(","):
        name, _, value = directive.strip().partition("=")
        name = name.strip().lower()
        if name in ("no-cache", "no-store"):
            return 0.0
        if name == "max-age":
            try:
                return max(0.0, float(int(value.strip().strip('"'))))
            except ValueError:
                return 0.0
    return None


def fetch_url(url: str, timeout: float, etag: str | None = None) -> Fetched:
    """GET ``url`` (conditionally, with ``If-None-Match`` when ``etag`` is given); the
    timeout bounds connecting and the whole download."""
    import urllib.request

    deadline = time.monotonic() + timeout
    headers = {"User-Agent": f"execgate/{__version__}"}
    if etag:
        headers["If-None-Match"] = etag
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 304 and etag:
            exc.close()
            return Fetched(
                None, exc.headers.get("ETag") or etag, _max_age(exc.headers.get("Cache-Control"))
            )
        raise
    with response:
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
        return Fetched(
            b"".join(chunks),
            response.headers.get("ETag"),
            _max_age(response.headers.get("Cache-Control")),
        )


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


def _parse_document(data: bytes, origin: str) -> list[PrefixRule]:
    import tomllib

    document = tomllib.loads(data.decode("utf-8"))
    unknown = set(document) - {"rules"}
    if unknown:
        raise _Invalid(f"unknown key `{sorted(unknown)[0]}`")
    return parse_requirement_rules(document, origin)


class _Unverified(Exception):
    """The content does not carry a valid signature by the configured key."""


def signature_url(url: str) -> str:
    """Where the detached signature of the document at ``url`` is served."""
    return url + SIGNATURE_SUFFIX


def _decode_signature(data: bytes) -> bytes:
    if len(data) == 64:
        return data
    try:
        raw = base64.b64decode(data.strip(), validate=True)
    except ValueError:
        raw = b""
    if len(raw) != 64:
        raise _Unverified("the signature is not 64 bytes (raw or base64)")
    return raw


def verify(key: Ed25519PublicKey, document: bytes, signature: bytes | None) -> None:
    """Raise ``_Unverified`` unless ``signature`` is ``key``'s over exactly ``document``."""
    if signature is None:
        raise _Unverified("it is not signed")
    from cryptography.exceptions import InvalidSignature

    try:
        key.verify(_decode_signature(signature), document)
    except InvalidSignature:
        raise _Unverified("its signature does not verify") from None


def _fetch_signature(url: str, timeout: float, fetch: Fetcher) -> bytes | None:
    where = signature_url(url)
    try:
        return fetch(where, timeout, None).body
    except (OSError, ValueError, urllib.error.URLError) as exc:
        raise _Unverified(
            f"its signature {where} could not be fetched ({_describe(exc)})"
        ) from None


# -- the cache -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Copy:
    """A copy of the URL's document: its bytes, signature and when it was fetched."""

    document: bytes
    signature: bytes | None
    etag: str | None
    fetched: float
    max_age: float | None


class _CachedCopy:
    """``$EXECGATE_HOME/cache/requirements/<hash of the URL>.{toml,sig,json}``.

    The folder is the user's: anything in it may have been edited. With a public key every
    read is verified; without one the copy is only as trustworthy as the user's home.
    """

    def __init__(self, url: str) -> None:
        stem = hashlib.sha256(url.encode()).hexdigest()[:32]
        folder = requirements_cache_dir()
        self.document = folder / f"{stem}.toml"
        self.signature = folder / f"{stem}.sig"
        self.meta = folder / f"{stem}.json"

    def read(self) -> _Copy | None:
        try:
            document = self.document.read_bytes()
        except OSError:
            return None
        try:
            signature: bytes | None = self.signature.read_bytes()
        except OSError:
            signature = None
        etag, fetched, max_age = None, 0.0, None  # no metadata: revalidate now, no ETag
        try:
            meta = json.loads(self.meta.read_text(encoding="utf-8"))
            etag = meta["etag"] if isinstance(meta.get("etag"), str) else None
            fetched = float(meta["fetched"])
            max_age = None if meta.get("max_age") is None else float(meta["max_age"])
        except (OSError, ValueError, TypeError, KeyError):
            pass
        return _Copy(document, signature, etag, fetched, max_age)

    def write(self, copy: _Copy) -> None:
        meta = {"etag": copy.etag, "fetched": copy.fetched, "max_age": copy.max_age}
        try:
            make_private_dir(self.document.parent)
            if copy.signature is not None:
                write_atomically(self.signature, copy.signature)
            else:
                with contextlib.suppress(FileNotFoundError):
                    self.signature.unlink()
            write_atomically(self.document, copy.document)
            write_atomically(self.meta, json.dumps(meta).encode())
        except OSError:
            pass  # a missing cache only costs a fetch, or reports itself on a later failure


# -- loading -------------------------------------------------------------------------------


@dataclass
class RequirementsResult:
    """The requirement rules to lay over the policy, and what happened getting them."""

    rules: list[PrefixRule] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # files (URL documents: their cached copy)
    warnings: list[str] = field(default_factory=list)
    fail_closed_reason: str | None = None
    watch_paths: list[Path] = field(default_factory=list)


def _usable(settings: RequirementsSettings, copy: _Copy, origin: str) -> list[PrefixRule]:
    """The copy's rules, if it verifies and parses (raises ``_Unverified`` / ``_Invalid`` /
    ``ValueError``)."""
    if settings.public_key is not None:
        verify(settings.public_key, copy.document, copy.signature)
    return _parse_document(copy.document, origin)


def _fresh(settings: RequirementsSettings, copy: _Copy, now: float) -> bool:
    lifetime = settings.refresh_interval
    if copy.max_age is not None:
        lifetime = min(lifetime, copy.max_age)
    return 0 <= now - copy.fetched < lifetime


def _when(stamp: float) -> str:
    try:  # the time comes from the user's cache folder: anything is possible
        return f"{datetime.fromtimestamp(stamp, UTC):%Y-%m-%d %H:%M:%S} UTC"
    except (OverflowError, ValueError, OSError):
        return "at an unknown time"


def _from_url(settings: RequirementsSettings, result: RequirementsResult, fetch: Fetcher) -> None:
    url = settings.url
    assert url is not None
    cache = _CachedCopy(url)
    now = time.time()
    cached = cache.read()
    cached_rules: list[PrefixRule] | None = None
    cache_problem = "there is no cached copy"
    if cached is not None:
        try:
            cached_rules = _usable(settings, cached, url)
        except _Unverified as exc:
            cache_problem = f"the cached copy {cache.document} was refused ({exc})"
            cached = None
        except (ValueError, _Invalid):  # tomllib.TOMLDecodeError is a ValueError
            cache_problem = f"the cached copy {cache.document} is not valid"
            cached = None

    def use(rules: list[PrefixRule]) -> None:
        result.rules.extend(rules)
        result.sources.append(str(cache.document))  # the on-disk copy of what the URL served

    if cached is not None and cached_rules is not None and _fresh(settings, cached, now):
        use(cached_rules)
        return
    try:
        answer = fetch(url, settings.timeout, cached.etag if cached else None)
        if answer.body is None:  # 304: the cached copy is still current
            if cached is None or cached_rules is None:
                raise OSError("HTTP status 304 without a cached copy")
            cache.write(_Copy(cached.document, cached.signature, answer.etag, now, answer.max_age))
            use(cached_rules)
            return
        signature = None
        if settings.public_key is not None:
            signature = _fetch_signature(url, settings.timeout, fetch)
        fresh = _Copy(answer.body, signature, answer.etag, now, answer.max_age)
        rules = _usable(settings, fresh, url)
    except _Unverified as exc:
        problem = f"the document was refused: {exc}"
    except (OSError, ValueError, urllib.error.URLError, _Invalid) as exc:  # TOML errors too
        problem = _describe(exc)
    else:
        cache.write(fresh)
        use(rules)
        return
    if cached is not None and cached_rules is not None:
        use(cached_rules)
        result.warnings.append(
            f"could not fetch requirements from {url} ({problem}); using the copy cached "
            f"{_when(cached.fetched)}"
        )
        return
    if settings.public_key is None and settings.on_error == "fail-open":
        result.warnings.append(
            f"could not fetch requirements from {url} ({problem}) and {cache_problem}; "
            'continuing without them (on_requirements_error = "fail-open")'
        )
        return
    mode = (
        "requirements_public_key is set"
        if settings.public_key is not None
        else 'on_requirements_error = "fail-closed"'
    )
    result.fail_closed_reason = (
        f"admin requirements from {url} could not be fetched ({problem}) and {cache_problem}, "
        f"so every command is denied ({mode})"
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
