"""Human answers that outlast one exec: "allow for this run" and "always".

Policy is Codex's: the strictest decision wins, so an ``allow`` rule can never relax a
``prompt`` in ``execgate check``. An approval is the gate's reading of the user's intent: a
``prompt`` counts as already answered when an ``allow`` rule in the user's own layer covers
every rule that asked (a prefix at least as long). Prompts from admin layers (system rules,
requirements) are never pre-approved and never offer "always".
"""

from __future__ import annotations

from pathlib import Path

from execgate import paths
from execgate.gate.escalation import Answer, Approval, ApprovalRequest, Asker, Judgement
from execgate.policy import Decision, LoadedPolicy, NetworkRule, RuleMatch, append_allow_rule
from execgate.policy.amend import append_network_allow_rule
from execgate.policy.network import NetworkJudgement

ADMIN_LAYERS = frozenset({"system", "requirements"})


class UserApprovals:
    def __init__(self, loaded: LoadedPolicy | None) -> None:
        self._layers = {str(s.path): s.layer for s in loaded.sources} if loaded else {}
        self._enabled = loaded is not None

    @classmethod
    def none(cls) -> UserApprovals:
        """No lasting approvals (explicit ``--rules`` files: the user layer is not in play)."""
        return cls(None)

    def _layer(self, match: RuleMatch) -> str | None:
        return self._layers.get(match.source.path) if match.source else None

    def _prompts(self, judgement: Judgement) -> list[RuleMatch]:
        return [m for m in judgement.matches if m.decision == Decision.PROMPT]

    def covers(self, judgement: Judgement) -> bool:
        if not self._enabled or judgement.decision != Decision.PROMPT:
            return False
        prompts = self._prompts(judgement)
        if any(self._layer(m) in ADMIN_LAYERS for m in prompts):
            return False
        allows = [
            m
            for m in judgement.matches
            if m.decision == Decision.ALLOW and self._layer(m) == "user"
        ]
        return all(
            any(len(a.matched_prefix) >= len(p.matched_prefix) for a in allows) for p in prompts
        )

    def can_record(self, judgement: Judgement) -> bool:
        return self._enabled and not any(
            self._layer(m) in ADMIN_LAYERS for m in self._prompts(judgement)
        )

    def covers_network(self, judgement: NetworkJudgement) -> bool:
        """A ``prompt`` for a host is answered by an ``allow`` rule for it in the user's own
        layer (an "always" answer), unless an admin layer asks."""
        if not self._enabled or judgement.decision != Decision.PROMPT:
            return False
        layers = [self._rule_layer(r) for r in judgement.matches]
        prompts = [
            lay
            for r, lay in zip(judgement.matches, layers, strict=True)
            if r.decision == Decision.PROMPT
        ]
        return not any(lay in ADMIN_LAYERS for lay in prompts) and any(
            r.decision == Decision.ALLOW and lay == "user"
            for r, lay in zip(judgement.matches, layers, strict=True)
        )

    def can_record_network(self, judgement: NetworkJudgement) -> bool:
        return self._enabled and not any(
            self._rule_layer(r) in ADMIN_LAYERS
            for r in judgement.matches
            if r.decision != Decision.ALLOW
        )

    def _rule_layer(self, rule: NetworkRule) -> str | None:
        return self._layers.get(rule.source.path) if rule.source else None

    def record(self, request: ApprovalRequest, path: Path | None = None) -> None:
        """Append the approved prefix (a connection's host: a network rule) as an allow rule to
        the user's rules file (the built-in default policy stays in force beside it)."""
        path = path or paths.user_default_rules_file()
        if request.network is not None:
            append_network_allow_rule(path, request.network.host, request.network.protocol)
        else:
            append_allow_rule(path, list(request.prefix))

    def recording(self, asker: Asker) -> Asker:
        """``asker``, with "always" answers recorded in the user's rules file."""
        return _RecordingAsker(asker, self)


class _RecordingAsker:
    def __init__(self, asker: Asker, approvals: UserApprovals) -> None:
        self._asker = asker
        self._approvals = approvals

    async def ask(self, request: ApprovalRequest) -> Approval:
        approval = await self._asker.ask(request)
        if approval.answer == Answer.ALLOW_ALWAYS:
            if request.offer_always:
                self._approvals.record(request)
            else:  # an asker offered what it should not have: treat as this run only
                approval = Approval(Answer.ALLOW_SESSION, approval.reason, approval.by)
        return approval
