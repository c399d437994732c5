"""The exec gate: one session's server side of every exec a gated process asks about.

Data flows one way: a request arrives on the session's socket (:mod:`.server`, wire format in
:mod:`.protocol`, docs/protocol.md), the server reads the program's identity from the
descriptors it came with (:mod:`.identity`, :mod:`.content`, :mod:`.program`), the front end's
policy decides (:mod:`.livepolicy`, :mod:`.escalation`), a human may be asked (:mod:`.askers`,
:mod:`.approvals`), and the session answers: run, deny, or escalate through its launcher
(:mod:`.session`, :mod:`.launcher`; stand-ins for the sandbox: :mod:`.standins`).

Front ends (``execgate run``, ``execgate mcp``) need only what is exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from execgate.lazy import lazy_exports

if TYPE_CHECKING:
    from execgate.gate.livepolicy import GatePolicy, PolicySource
    from execgate.gate.session import (
        EscalationSession,
        SessionCaller,
        SessionConfig,
        SessionDenied,
        SessionReserve,
    )

# Loaded on first use: low modules (config) import pure gate modules (cleanenv), which must not
# drag the session in with them.
_EXPORTS = {
    "GatePolicy": "livepolicy",
    "PolicySource": "livepolicy",
    "EscalationSession": "session",
    "SessionCaller": "session",
    "SessionConfig": "session",
    "SessionDenied": "session",
    "SessionReserve": "session",
}

__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = [
    "EscalationSession",
    "GatePolicy",
    "PolicySource",
    "SessionCaller",
    "SessionConfig",
    "SessionDenied",
    "SessionReserve",
]
