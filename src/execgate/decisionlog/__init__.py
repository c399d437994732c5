"""The decision log: every decision a front end makes, for the user and the team.

* :mod:`.chain` — the hash-chained, size-rotated file every session of the user appends to;
* :mod:`.recorder` — :class:`DecisionLog`, what a front end hands its decisions to (the chained
  log, the ``--audit`` copy, the OTLP export), written off the exec's critical path;
* :mod:`.otel` — the optional OTLP export (SDK imported lazily);
* :mod:`.query`, :mod:`.replay`, :mod:`.suggest`, :mod:`.grants` — reading it back
  (``execgate log``, ``execgate rules suggest``, ``execgate approvals grants``).
"""

from __future__ import annotations

import os
from pathlib import Path

from execgate import paths
from execgate.config import Config
from execgate.decisionlog.recorder import DecisionLog, open_decision_log

__all__ = ["DecisionLog", "open_decision_log", "open_front_log"]


def open_front_log(front: str, config: Config, *, audit: Path | None) -> DecisionLog:
    """The decision log of a front end (``run``/``mcp``) as ``config.toml`` sets it up; a bad
    path (log folder, ``--audit`` file) or a configured OTLP export without its SDK is refused
    now, in one sentence."""
    export = None
    from execgate.decisionlog.otel import settings_from, start_export

    settings = settings_from(config.otel, os.environ)
    if settings is not None:
        export = start_export(settings)
    if audit is not None:
        paths.add_record_file(audit)
    return open_decision_log(
        front,
        path=paths.decision_log_file() if config.log.enabled else None,
        audit=audit,
        max_bytes=config.log.max_bytes,
        keep=config.log.keep,
        export=export,
    )
