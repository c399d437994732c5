"""The decision log: every decision a front end makes, for the user and the team.

* :mod:`.chain` — the hash-chained, size-rotated file every session of the user appends to;
* :mod:`.recorder` — :class:`DecisionLog`, what a front end hands its decisions to (the chained
  log, the ``--audit`` copy, the OTLP export), written off the exec's critical path;
* :mod:`.otel` — the optional OTLP export (SDK imported lazily);
* :mod:`.query`, :mod:`.replay`, :mod:`.suggest`, :mod:`.grants` — reading it back
  (``execgate log``, ``execgate rules suggest``, ``execgate approvals grants``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from execgate.lazy import lazy_exports

if TYPE_CHECKING:
    from execgate.decisionlog.front import open_front_log
    from execgate.decisionlog.recorder import DecisionLog, open_decision_log

__all__ = ["DecisionLog", "open_decision_log", "open_front_log"]

# Loaded on first use: the chained file alone (reading or appending to it) must not import the
# recorder's asyncio and the configuration.
__getattr__ = lazy_exports(
    __name__,
    globals(),
    {"DecisionLog": "recorder", "open_decision_log": "recorder", "open_front_log": "front"},
)
