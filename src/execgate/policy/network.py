"""Which ``network_rule`` decides a connection: by host and protocol.

A connection is judged on the host it names (normalised like a rule's host) and the way it
came through the proxy (``http`` absolute-form, ``https`` CONNECT, ``socks5_tcp``). Every rule
for exactly that host and protocol matches; as for commands, the strictest decision wins
(``forbidden`` > ``prompt`` > ``allow``), so no layer can relax a stricter one. No match: the
session's default for unknown hosts decides (``network.default``).
"""

from __future__ import annotations

from dataclasses import dataclass

from execgate.policy.evaluate import Policy
from execgate.policy.language import normalize_network_host
from execgate.policy.model import NETWORK_PROTOCOLS, Decision, NetworkRule

#: How each way through the proxy is named in rules.
CONNECT_PROTOCOL = "https"
FORWARD_PROTOCOL = "http"
SOCKS_PROTOCOL = "socks5_tcp"


@dataclass(frozen=True, slots=True)
class NetworkJudgement:
    host: str  # normalised
    protocol: str
    matches: tuple[NetworkRule, ...]  # every rule for host and protocol, in load order

    @property
    def decision(self) -> Decision | None:
        return max((r.decision for r in self.matches), default=None)

    def deciding(self) -> tuple[NetworkRule, ...]:
        decision = self.decision
        return tuple(r for r in self.matches if r.decision == decision)

    def justification(self) -> str | None:
        return next((r.justification for r in self.deciding() if r.justification), None)

    def rule_locations(self) -> str:
        return ", ".join(dict.fromkeys(rule_location(r) for r in self.deciding()))


def rule_location(rule: NetworkRule) -> str:
    return f"{rule.source.path}:{rule.source.line}" if rule.source else "built-in"


def rule_text(rule: NetworkRule) -> str:
    """The rule as written (for messages): ``network_rule("h", "https", "allow")``."""
    return f'network_rule("{rule.host}", "{rule.protocol}", "{rule.decision.value}")'


def judge_network(policy: Policy, host: str, protocol: str) -> NetworkJudgement:
    """The rules for ``host`` (any spelling a rule accepts) over ``protocol``. Raises
    ``ValueError`` for a host no rule could name, or an unknown protocol."""
    if protocol not in NETWORK_PROTOCOLS:
        raise ValueError(f"unknown network protocol {protocol!r}")
    name = normalize_network_host(host)
    matches = tuple(r for r in policy.network_rules if r.host == name and r.protocol == protocol)
    return NetworkJudgement(name, protocol, matches)
