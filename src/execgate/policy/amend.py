"""Answers of "always allow": append an allow rule to a rules file the way Codex does
(``prefix_rule`` for a command, ``network_rule`` for a host)."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Sequence
from pathlib import Path

from execgate.files import make_private_dir, open_private
from execgate.policy.language import normalize_network_host
from execgate.policy.model import NETWORK_PROTOCOLS, PolicyError

APPEND_LIMIT = 64 * 1024 * 1024


def allow_rule_line(tokens: Sequence[str]) -> str:
    """The line Codex writes: JSON-escaped tokens joined by ``", "``."""
    if not tokens:
        raise PolicyError("prefix rule requires at least one token")
    if any(not token.strip() for token in tokens):
        raise PolicyError("prefix rule tokens cannot be empty or whitespace-only")
    pattern = ", ".join(json.dumps(token, ensure_ascii=False) for token in tokens)
    return f'prefix_rule(pattern=[{pattern}], decision="allow")'


def network_allow_line(host: str, protocol: str) -> str:
    """``network_rule(host="HOST", protocol="P", decision="allow")`` (host normalised)."""
    if protocol not in NETWORK_PROTOCOLS:
        raise PolicyError(f"network rule protocol {protocol!r} is not one of {NETWORK_PROTOCOLS}")
    try:
        host = normalize_network_host(host)
    except ValueError as exc:
        raise PolicyError(str(exc)) from None
    return (
        f'network_rule(host={json.dumps(host)}, protocol={json.dumps(protocol)}, decision="allow")'
    )


def _rust_lines(text: str) -> list[str]:
    """``str::lines``: split at ``\n``, dropping one ``\r`` before it."""
    parts = text.split("\n")
    terminated = parts[:-1]
    lines = [part[:-1] if part.endswith("\r") else part for part in terminated]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def append_allow_rule(path: Path, tokens: Sequence[str]) -> bool:
    """Append ``prefix_rule(pattern=[...], decision="allow")`` to ``path``.

    Codex's procedure: create the folder and file if needed, take an exclusive lock, refuse
    files over 64 MiB, skip the append when the identical line is already there, add a missing
    final newline first. Returns ``False`` when the line was already present.
    """
    return append_rule_line(path, allow_rule_line(tokens))


def append_network_allow_rule(path: Path, host: str, protocol: str) -> bool:
    """Append ``network_rule(host=..., protocol=..., decision="allow")`` to ``path``, the same
    way as :func:`append_allow_rule`. Returns ``False`` when the line was already present."""
    return append_rule_line(path, network_allow_line(host, protocol))


def append_rule_line(path: Path, line: str) -> bool:
    """Append one rule line under the procedure of :func:`append_allow_rule`."""
    try:
        make_private_dir(path.parent)
        fd = open_private(path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
    except OSError as exc:
        raise PolicyError(f"failed to open policy file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "r+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        except OSError as exc:
            raise PolicyError(f"failed to lock policy file {path}: {exc.strerror}") from None
        try:
            if os.fstat(handle.fileno()).st_size > APPEND_LIMIT:
                raise PolicyError(f"{path}: policy file exceeds the 64 MiB append limit")
            handle.seek(0)
            contents = handle.read().decode("utf-8", "surrogateescape")
            if line in _rust_lines(contents):
                return False
            prefix = "\n" if contents and not contents.endswith("\n") else ""
            handle.write(f"{prefix}{line}\n".encode())
            handle.flush()
        except OSError as exc:
            raise PolicyError(f"failed to write to policy file {path}: {exc.strerror}") from None
    return True


def remove_allow_rule(path: Path, tokens: Sequence[str]) -> bool:
    """Remove the line :func:`append_allow_rule` writes for ``tokens`` from ``path``, keeping
    every other byte as it was (line endings, comments, a missing final newline). Rewritten in
    place under the same lock appenders take, so no append is lost. Returns ``False`` when the
    line is not there."""
    line = allow_rule_line(tokens).encode()
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise PolicyError(f"failed to open policy file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "r+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            lines = _lines_with_ends(handle.read())
            kept = [raw for raw in lines if raw.rstrip(b"\n").removesuffix(b"\r") != line]
            if len(kept) == len(lines):
                return False
            handle.seek(0)
            handle.write(b"".join(kept))
            handle.truncate()
            handle.flush()
        except OSError as exc:
            raise PolicyError(f"failed to write to policy file {path}: {exc.strerror}") from None
    return True


def _lines_with_ends(data: bytes) -> list[bytes]:
    """``data`` split after each ``\n`` (the lines as Codex reads them), ends kept."""
    parts = data.split(b"\n")
    return [part + b"\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
