"""``execgate approvals grants|revoke``: what "for this session/run" and "always" answers
granted, read from the decision log.

A lasting ("always") grant is the allow rule the answer appended to the user's rules file; it
is in force while that line is there. A session grant lasts as long as the session that got
it; a running ``execgate mcp`` server can withdraw one (its control socket), an ``execgate
run`` session has none to ask. Revocations are recorded in the log (``kind: revoke``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from execgate.decisionlog.query import HUMANS, record_time


@dataclass(frozen=True)
class Grant:
    id: str
    scope: str  # "session" or "always"
    session: str
    front: str
    call: int | None
    prefix: tuple[str, ...]
    time: float
    answered_by: str
    rule_line: str | None = None  # always: the line appended
    rule_file: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def grant_id(scope: str, session: str, prefix: Iterable[str], rule_file: str | None) -> str:
    key = json.dumps([scope, "" if scope == "always" else session, list(prefix), rule_file])
    return hashlib.sha256(key.encode()).hexdigest()[:10]


def grants(records: Iterable[dict[str, Any]]) -> list[Grant]:
    """Every grant a human gave, first answer first, without the revoked ones; an "always"
    grant once per rule line and file."""
    found: dict[str, Grant] = {}
    for record in records:
        if record.get("kind") == "revoke":
            found.pop(str(record.get("grant")), None)
            continue
        scope = record.get("answer")
        if scope not in ("session", "always") or record.get("answered_by") not in HUMANS:
            continue
        prefix = tuple(str(w) for w in record.get("prefix", []))
        session = str(record.get("session", ""))
        rule_file = record.get("rule_file") if scope == "always" else None
        gid = grant_id(str(scope), session, prefix, rule_file)
        found.setdefault(
            gid,
            Grant(
                id=gid,
                scope=str(scope),
                session=session,
                front=str(record.get("front", "")),
                call=record.get("call"),
                prefix=prefix,
                time=record_time(record),
                answered_by=str(record.get("answered_by")),
                rule_line=record.get("rule_line"),
                rule_file=rule_file,
            ),
        )
    return list(found.values())


def rule_line_number(grant: Grant) -> int | None:
    """Where a lasting grant's rule line is in its file now (None: no longer there)."""
    if grant.rule_file is None or grant.rule_line is None:
        return None
    try:
        text = Path(grant.rule_file).read_bytes().decode("utf-8", "surrogateescape")
    except OSError:
        return None
    for number, line in enumerate(text.split("\n"), 1):
        if line.removesuffix("\r") == grant.rule_line:
            return number
    return None
