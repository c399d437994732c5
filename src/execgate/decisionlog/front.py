"""The decision log of a front end (``execgate run``, ``execgate mcp``) as ``config.toml`` sets
it up."""

from __future__ import annotations

import os
from pathlib import Path

from execgate import paths
from execgate.config import Config
from execgate.decisionlog.recorder import DecisionLog, open_decision_log


def open_front_log(
    front: str, config: Config, *, audit: Path | None, session: str | None = None
) -> DecisionLog:
    """The decision log of a front end (``run``/``mcp``) as ``config.toml`` sets it up; a bad
    path (log folder, ``--audit`` file) or a configured OTLP export without its SDK is refused
    now, in one sentence. ``session``: the id its records carry (default: a fresh one)."""
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
        session=session,
    )
