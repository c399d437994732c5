"""Where a front end's decisions go: the user's chained log, the ``--audit`` copy, OTLP.

A session hands every decision to :meth:`DecisionLog.record` as it makes it; nothing is
written then. The records are built and written shortly after, in one batch, once the answer
to the exec is on its way (:data:`FLUSH_DELAY`): the log costs an exec a list append. Every
pending record is written when a session closes, at :meth:`DecisionLog.close` and at exit.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from execgate.decisionlog.chain import (
    DEFAULT_KEEP,
    DEFAULT_MAX_BYTES,
    ChainedFile,
    LogPathError,
)
from execgate.errors import ExecgateError
from execgate.files import open_private

log = logging.getLogger("execgate.decisions")

#: Seconds a decision waits to be written with the ones after it.
FLUSH_DELAY = 0.05

#: Who made a decision (``source``): a policy rule (or no rule: ``none``), a human at the
#: terminal, through MCP elicitation or the ``execgate approvals`` command, nobody in time
#: (``unanswered``), or the gate refusing without judging (``fail-closed``).
SOURCES = (
    "rule",
    "none",
    "grant",  # an earlier "for this session" answer
    "terminal",
    "elicitation",
    "approvals",
    "unanswered",
    "fail-closed",
)

Entry = Mapping[str, Any]


class FlushSoon:
    """Calls ``flush`` :data:`FLUSH_DELAY` after the first item of a batch was queued, on the
    running event loop (at once without one), so an exec pays a list append and the batch one
    write. ``flush`` calls :meth:`cancel` first."""

    def __init__(self, flush: Callable[[], None]) -> None:
        self._flush = flush
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def queued(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): now
            self._flush()
            return
        if self._timer is not None and self._loop is loop:
            return
        if self._timer is not None:  # scheduled on a loop that is gone
            self._flush()
        self._timer, self._loop = loop.call_later(FLUSH_DELAY, self._flush), loop

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._loop = None


class Export(Protocol):
    """A destination that must never hold up the caller (the OTLP export)."""

    def submit(self, records: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


class AuditCopy:
    """``--audit FILE``: the same records, unchained, in a file of the user's choosing."""

    def __init__(self, path: Path) -> None:
        try:
            fd = open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        except OSError as exc:
            raise ExecgateError(
                f"--audit {path}: cannot write there: {exc.strerror or exc}"
            ) from None
        self.path = path
        self._fd = fd

    def write(self, records: list[dict[str, Any]]) -> None:
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
        view = memoryview(data.encode("ascii"))
        while view:
            view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


class DecisionLog:
    """One front end's decisions (``front``: ``run`` or ``mcp``), under one ``session`` id."""

    def __init__(
        self,
        front: str,
        *,
        chain: ChainedFile | None,
        audit: AuditCopy | None = None,
        export: Export | None = None,
        session: str | None = None,
    ) -> None:
        self.front = front
        self.session = session or secrets.token_hex(8)
        self.chain = chain
        self.audit = audit
        self.export = export
        self._pending: list[tuple[float, Entry | Callable[[], Entry]]] = []
        self._soon = FlushSoon(self.flush)
        self._failed = False
        atexit.register(self.flush)

    def record(self, entry: Entry | Callable[[], Entry], when: float | None = None) -> None:
        """Queue one decision (or a function that builds it, called when it is written):
        an exec's (``gate.session.decision_entry``), a permission request's
        (:func:`permission_entry`). ``time`` (``when``, or now), ``session`` and ``front``
        are added here."""
        self._pending.append((time.time() if when is None else when, entry))
        self._soon.queued()

    def flush(self) -> None:
        """Write every pending record now."""
        self._soon.cancel()
        pending, self._pending = self._pending, []
        if not pending:
            return
        records = []
        for when, entry in pending:
            fields = entry() if callable(entry) else entry
            records.append(
                {"time": round(when, 6), "session": self.session, "front": self.front, **fields}
            )
        for name, write in (
            ("the decision log", self.chain.append if self.chain else None),
            ("the --audit file", self.audit.write if self.audit else None),
        ):
            if write is None:
                continue
            try:
                write(records)
            except OSError as exc:
                if not self._failed:  # once: a full disk must not flood the terminal
                    log.warning("cannot write %s: %s", name, exc.strerror or exc)
                self._failed = True
        if self.export is not None:
            self.export.submit(records)

    def close(self) -> None:
        self.flush()
        atexit.unregister(self.flush)
        if self.chain is not None:
            self.chain.close()
        if self.audit is not None:
            self.audit.close()
        if self.export is not None:
            self.export.close()


def permission_entry(
    *,
    call: int | None,
    permission: str,
    detail: Mapping[str, Any],
    decision: str,
    source: str,
    answer: str | None = None,
    answered_by: str | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """A permission request's record (``kind: permission``), for
    :meth:`DecisionLog.record`: ``permission`` names what was asked (``network``,
    ``writable_root``, …), ``detail`` what exactly (host, path), ``decision`` ``allow`` or
    ``deny``, ``source`` one of :data:`SOURCES`; ``answer``/``answered_by`` when a human was
    asked. Values must be JSON (strings, numbers, lists, objects)."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}")
    entry: dict[str, Any] = {
        "kind": "permission",
        "call": call,
        "permission": permission,
        "detail": dict(detail),
        "decision": decision,
        "source": source,
        "answer": answer,
        "answered_by": answered_by,
        "reason": reason,
    }
    return {k: v for k, v in entry.items() if v is not None}


def open_decision_log(
    front: str,
    *,
    path: Path | None,
    audit: Path | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    keep: int = DEFAULT_KEEP,
    export: Export | None = None,
    session: str | None = None,
) -> DecisionLog:
    """The front end's log; ``path`` None: the chained log is off (``[log] enabled = false``).
    A path that cannot be written is refused now, in one sentence."""
    chain = None
    if path is not None:
        try:
            chain = ChainedFile(path, max_bytes=max_bytes, keep=keep)
        except LogPathError as exc:
            raise ExecgateError(
                f"{exc} (move it with XDG_STATE_HOME or EXECGATE_HOME, or turn it off in "
                "config.toml: [log] enabled = false)"
            ) from None
    copy = AuditCopy(audit) if audit is not None else None
    return DecisionLog(front, chain=chain, audit=copy, export=export, session=session)
