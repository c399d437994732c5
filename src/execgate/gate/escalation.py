"""From policy decision to action: run here, escalate, deny, or ask a human first.

:class:`PolicyEscalation` is what the session calls for every exec that reaches the server: it
maps the policy's decision to an action (``allow`` → escalate, ``prompt`` → ask, ``forbidden`` →
deny, no match → run). An :class:`Asker` answers ``ask`` actions: the
terminal for ``execgate run``, MCP elicitation for ``execgate mcp``.
"""

from __future__ import annotations

import itertools
import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from execgate.gate.content import NO_CONTENTS, ContentError, ContentIndex
from execgate.gate.identity import FileId, files_named_by
from execgate.gate.program import GatedExec, commands_to_judge, loader_loads_an_auditor
from execgate.policy import Decision, Evaluation, Policy, PolicyError, RuleMatch
from execgate.policy.amend import allow_rule_line
from execgate.visible import visible


class Verdict(Enum):
    RUN = "run"  # exec in place (inside the sandbox, if any)
    ESCALATE = "escalate"  # the session spawns it outside the sandbox
    DENY = "deny"
    ASK = "ask"  # a human decides; then RUN/ESCALATE or DENY


@dataclass(frozen=True, slots=True)
class Judgement:
    """Policy's verdict on one exec: the strictest decision over every command it amounts to."""

    decision: Decision | None
    command: list[str]  # the command that decided (for messages)
    evaluation: Evaluation | None
    # The identity of the file the deciding command's program stands for (None: unknown, e.g.
    # the dynamic loader's target): an escalation needs the rule to name this very file.
    file: FileId | None = None

    @property
    def matches(self) -> list[RuleMatch]:
        return self.evaluation.matches if self.evaluation else []

    def deciding_matches(self) -> list[RuleMatch]:
        """The matches whose decision is the overall one."""
        return [m for m in self.matches if m.decision == self.decision]

    def justification(self) -> str | None:
        """Justification of the longest deciding match (as Codex picks it)."""
        best: RuleMatch | None = None
        for match in self.deciding_matches():
            if match.justification and (
                best is None or len(match.matched_prefix) > len(best.matched_prefix)
            ):
                best = match
        return best.justification if best else None

    def rule_locations(self) -> str:
        return ", ".join(dict.fromkeys(rule_location(m) for m in self.deciding_matches()))


def rule_location(match: RuleMatch) -> str:
    """``file:line`` of the rule behind a match (``built-in`` for rules without a file)."""
    source = match.source
    return f"{source.path}:{source.line}" if source else "built-in"


def judge(
    policy: Policy,
    exec_: GatedExec,
    aliases: dict[tuple[int, int], tuple[str, ...]],
    contents: ContentIndex = NO_CONTENTS,
) -> Judgement:
    """``ContentError`` when the loader's target cannot be compared with rule-named files."""
    best = Judgement(decision=None, command=[exec_.path, *exec_.argv[1:]], evaluation=None)
    for command, file in commands_to_judge(exec_, aliases=aliases, contents=contents):
        evaluation = policy.evaluate(command, cwd=exec_.cwd, resolve_host_executables=True)
        if evaluation.decision is not None and (
            best.decision is None or evaluation.decision > best.decision
        ):
            best = Judgement(evaluation.decision, command, evaluation, file)
    return best


def names_file_that_runs(
    policy: Policy, exec_: GatedExec, judgement: Judgement, cache: dict[str, set[FileId]]
) -> str:
    """Why this judgement may not let the program out of the sandbox ("" if it may).

    Names are the caller's claims (``cp /tmp/evil ./ls`` is named ``ls``): an escalation is
    earned only by a deciding rule whose program token names the very file that runs."""
    judged = judgement.file  # the script or one of its interpreters, or the program
    if judged is None:
        return "not escalated: the command that matched does not name the file that runs"
    tokens = dict.fromkeys(m.rule.program for m in judgement.deciding_matches())
    hosts = policy.host_executables
    for token in tokens:
        if "/" in token:  # relative tokens depend on the cwd: not cached
            named = files_named_by(token, cwd=exec_.cwd, host_executables=hosts)
        else:
            if token not in cache:
                cache[token] = files_named_by(token, cwd="/", host_executables=hosts)
            named = cache[token]
        if judged in named:
            return ""
    shown = exec_.realpath or exec_.path
    return f"not escalated: {shown} is not the file the rule names ({', '.join(tokens)})"


class JudgementCache:
    """Judgements of recent execs, for as long as the policy object stays the same.

    Loops exec the same command over and over; judging it again costs more than the rest of
    the server's work. Only judgements that depend on nothing but the request, the policy and
    the alias table are kept: a script's interpreters and the loader's target are read from
    the file system, which may change between two execs.
    """

    LIMIT = 2048

    def __init__(self) -> None:
        self._policy: Policy | None = None
        self._aliases: dict[tuple[int, int], tuple[str, ...]] | None = None
        self._entries: dict[tuple[object, ...], Judgement] = {}
        # What PolicyEscalation made of a kept judgement, when that depends on nothing else
        # (see PolicyEscalation.decide): (key, confined, leaves_gate) -> action.
        self.actions: dict[tuple[object, ...], Action] = {}

    def key(
        self,
        policy: Policy,
        exec_: GatedExec,
        aliases: dict[tuple[int, int], tuple[str, ...]],
    ) -> tuple[object, ...] | None:
        """What this exec's judgement is kept under (None: it is not kept), once what was
        kept for another policy or alias table is dropped."""
        if exec_.interpreters or exec_.runs_loader:
            return None
        if (
            policy is not self._policy
            or aliases is not self._aliases
            or len(self._entries) >= self.LIMIT
            or len(self.actions) >= self.LIMIT
        ):
            self._entries.clear()
            self.actions.clear()
            self._policy, self._aliases = policy, aliases
        return (
            exec_.path,
            exec_.realpath,
            exec_.dev,
            exec_.ino,
            exec_.content_names,
            exec_.cwd,
            exec_.argv,
        )

    def judge(
        self,
        policy: Policy,
        exec_: GatedExec,
        aliases: dict[tuple[int, int], tuple[str, ...]],
        contents: ContentIndex,
        key: tuple[object, ...] | None = None,
    ) -> Judgement:
        """``key``: :meth:`key`'s answer for these arguments, when the caller has it."""
        key = key or self.key(policy, exec_, aliases)
        if key is None:
            return judge(policy, exec_, aliases, contents)
        found = self._entries.get(key)
        if found is None:
            found = self._entries[key] = judge(policy, exec_, aliases)
        return found


@dataclass(frozen=True, slots=True)
class NetworkTarget:
    """A connection through the session's proxy that asks for approval (gate/network.py)."""

    host: str
    port: int
    protocol: str
    addresses: tuple[str, ...]  # what the name resolved to: what would be dialled
    rules: tuple[str, ...]  # the rules that ask (empty: no rule names the host)
    justification: str | None = None

    def display(self) -> str:
        return f"{visible(self.host, 300)} port {self.port} ({self.protocol})"


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """What a human is asked to approve: an exec, or (``network``) a connection that ``exec``
    (the process that made it, as far as it is known) opened through the session's proxy."""

    id: str
    exec: GatedExec
    judgement: Judgement
    # The prefix an "allow for this session" / "always" answer would approve.
    prefix: tuple[str, ...]
    offer_always: bool
    # Set for a connection through the session's proxy: what it is to (not an exec's).
    network: NetworkTarget | None = None
    # Set for a request that is not an exec's (an MCP permission request): what is asked.
    purpose: str = ""
    # A skill script's canonical path: it always asks; "for this session" approves that path.
    skill_script: str = ""

    def summary(self) -> str:
        if self.network is not None:
            why = self.network.justification or "no rule allows this host"
            return f"network access to {self.network.display()}: {visible(why, 1000)}"
        why = self.judgement.justification() or "requires approval by policy"
        return f"{self.exec.display()}: {visible(why, 1000)}"


class Answer(Enum):
    ALLOW_ONCE = "once"
    ALLOW_SESSION = "session"
    ALLOW_ALWAYS = "always"
    DENY = "deny"


@dataclass(frozen=True, slots=True)
class Approval:
    answer: Answer
    reason: str | None = None  # the human's optional words (audit log, denial message)
    by: str = "user"


class Asker(Protocol):
    """Puts an approval request to a human. Must not raise for an unanswerable question:
    return a denial whose reason says why (no terminal, client cannot elicit, timeout)."""

    async def ask(self, request: ApprovalRequest) -> Approval: ...


@dataclass(frozen=True, slots=True)
class Action:
    verdict: Verdict
    # deny: the text after "execgate: denied: <cmd>: "; run: why it was not escalated
    reason: str = ""
    approval: ApprovalRequest | None = None  # ask: the question
    # For the decision log: policy's judgement (None: not judged), and whether an earlier
    # "for this session" answer settled a prompt.
    judgement: Judgement | None = None
    granted: bool = False


@dataclass
class SessionApprovals:
    """Prefixes a human allowed for the rest of this session."""

    prefixes: set[tuple[str, ...]] = field(default_factory=set)

    def covers(self, judgement: Judgement) -> bool:
        deciding = judgement.deciding_matches()
        return bool(deciding) and all(tuple(m.matched_prefix) in self.prefixes for m in deciding)


_ids = itertools.count(1)


class PolicyEscalation:
    """What a session calls for every exec that reaches the server (:meth:`decide`) and for
    every human answer (:meth:`resolve`).

    ``policy`` is read on every decision, so a reload takes effect at once. ``user_approves``
    says whether an ``allow`` rule the user recorded ("always") covers a prompt (see
    docs/policy.md, "Approvals"); prompts from admin layers are never pre-approved.
    """

    def __init__(
        self,
        policy: Callable[[], Policy],
        *,
        aliases: Callable[[], dict[tuple[int, int], tuple[str, ...]]] = dict,
        contents: Callable[[], ContentIndex] = lambda: NO_CONTENTS,
        user_approves: Callable[[Judgement], bool] = lambda _: False,
        can_record_always: Callable[[Judgement], bool] = lambda _: True,
        on_prompt_deny: bool = False,
        skill_script: Callable[[GatedExec], str | None] = lambda _: None,
    ) -> None:
        self._policy = policy
        self._skill_script = skill_script
        self.approved_skill_scripts: set[str] = set()
        self._aliases = aliases
        self._contents = contents
        self._user_approves = user_approves
        self._can_record_always = can_record_always
        self._on_prompt_deny = on_prompt_deny
        self.approvals = SessionApprovals()
        self._judgements = JudgementCache()
        self._named: dict[str, set[FileId]] = {}  # bare rule name -> files (this policy's)
        self._named_policy: Policy | None = None

    def _allowed(
        self,
        exec_: GatedExec,
        judgement: Judgement,
        confined: bool,
        *,
        by: str = "",
        granted: bool = False,
    ) -> Action:
        # Allowed, it runs in place outside the sandbox or is escalated out of it: either way
        # without no-new-privs, so the record says when it leaves the gate.
        leaving = _leaving_note(exec_.leaves_gate, judgement, by=by)
        # Outside the sandbox already (or no sandbox): running in place is escalation enough.
        if not confined:
            return Action(Verdict.RUN, leaving, judgement=judgement, granted=granted)
        why_not = self.why_not_outside(exec_, judgement)
        verdict = Verdict.RUN if why_not else Verdict.ESCALATE
        return Action(verdict, why_not or leaving, judgement=judgement, granted=granted)

    def why_not_outside(self, exec_: GatedExec, judgement: Judgement) -> str:
        """Why this judgement may not let a file the sandbox could have made run outside it
        ("" if it may: a deciding rule names the very file, :func:`names_file_that_runs`)."""
        if judgement.decision not in (Decision.ALLOW, Decision.PROMPT):
            return "not escalated: no rule names the file that runs"
        policy = self._policy()
        if policy is not self._named_policy:
            self._named, self._named_policy = {}, policy
        return names_file_that_runs(policy, exec_, judgement, self._named)

    def decide(self, exec_: GatedExec, *, confined: bool) -> Action:
        """The action for ``exec_``. The alias table and content index are read as they are
        (the caller drains the folder watch right before: LivePolicy.current_contents)."""
        policy, aliases = self._policy(), self._aliases()
        key = self._judgements.key(policy, exec_, aliases)
        if key is None:
            return self._decide(exec_, confined, policy, aliases, None, look_for_skill=True)
        # A loop execs the same command over and over: the action made of a kept judgement is
        # kept too when nothing but the judgement, the file's identity (in the key) and
        # whether it leaves the gate went into it. A skill script is looked for every time
        # (a skill may be added at any moment), and a prompt's answer is never kept here.
        script = self._skill_script(exec_)
        if script is not None:
            return self._skill(exec_, script)
        action_key = (key, confined, exec_.leaves_gate)
        action = self._judgements.actions.get(action_key)
        if action is None:
            action = self._decide(exec_, confined, policy, aliases, key, look_for_skill=False)
            if _keepable(action):
                self._judgements.actions[action_key] = action
        return action

    def is_kept(self, exec_: GatedExec, action: Action, *, confined: bool) -> bool:
        """Whether ``action`` is :meth:`decide`'s kept answer for ``exec_``: one that follows
        from the exec's key alone (no human, no approval, no skill script, nothing read from
        the file system but the file's identity), as long as the policy, aliases and
        contents stay the same."""
        key = self._judgements.key(self._policy(), exec_, self._aliases())
        if key is None:
            return False
        return self._judgements.actions.get((key, confined, exec_.leaves_gate)) is action

    def _decide(
        self,
        exec_: GatedExec,
        confined: bool,
        policy: Policy,
        aliases: dict[tuple[int, int], tuple[str, ...]],
        key: tuple[object, ...] | None,
        *,
        look_for_skill: bool,
    ) -> Action:
        try:
            judgement = self._judgements.judge(policy, exec_, aliases, self._contents(), key)
        except ContentError as exc:
            return Action(
                Verdict.DENY, f"the loaded program cannot be told from a program rules name: {exc}"
            )
        if loader_loads_an_auditor(exec_):
            return Action(Verdict.DENY, "the loader's --audit library could remove the exec gate")
        script = self._skill_script(exec_) if look_for_skill else None
        if script is not None:
            return self._skill(exec_, script)
        if judgement.decision is None:
            # Runs in place: inside the sandbox no-new-privs makes the kernel ignore set-id
            # bits and capabilities; outside (sandbox off, escalated callers) it would not.
            leaving = None if confined else exec_.leaves_gate
            if leaving is None:
                return Action(Verdict.RUN, judgement=judgement)
            name = posixpath.basename(exec_.realpath or exec_.path)
            return Action(
                Verdict.DENY,
                f"{leaving}: nothing it starts would be gated, and no rule names it (to run "
                f'it, name it in a rule: prefix_rule(pattern=["{name}"], decision="prompt"))',
                judgement=judgement,
            )
        if judgement.decision == Decision.FORBIDDEN:
            why = judgement.justification() or "forbidden by policy"
            return Action(
                Verdict.DENY, f"{why} (rule {judgement.rule_locations()})", judgement=judgement
            )
        if judgement.decision == Decision.ALLOW:
            return self._allowed(exec_, judgement, confined)
        # PROMPT
        if self.approvals.covers(judgement):
            return self._allowed(exec_, judgement, confined, granted=True)
        if self._user_approves(judgement):
            return self._allowed(exec_, judgement, confined)
        prefix = _approval_prefix(judgement)
        request = ApprovalRequest(
            id=f"{next(_ids)}",
            exec=exec_,
            judgement=judgement,
            prefix=prefix,
            offer_always=self._can_record_always(judgement),
        )
        if self._on_prompt_deny:
            denial = no_one_to_ask(request, "prompts are set to deny (--on-prompt deny)")
            return Action(Verdict.DENY, denial.reason or "", judgement=judgement)
        return Action(Verdict.ASK, approval=request, judgement=judgement)

    def _skill(self, exec_: GatedExec, script: str) -> Action:
        """A skill script: whatever the rules say, a human decides (it runs in place)."""
        if script in self.approved_skill_scripts:
            return Action(Verdict.RUN, f"skill script {script}, approved for this session")
        request = ApprovalRequest(
            id=f"{next(_ids)}",
            exec=exec_,
            judgement=Judgement(Decision.PROMPT, [script, *exec_.argv[1:]], None),
            prefix=(script,),
            offer_always=False,
            purpose=f"skill script `{visible(script, 500)}` wants to run (skill scripts "
            "always ask)",
            skill_script=script,
        )
        if self._on_prompt_deny:
            return Action(
                Verdict.DENY,
                f"skill script {script} needs a human's approval; prompts are set to deny "
                "(--on-prompt deny)",
            )
        return Action(Verdict.ASK, approval=request, judgement=request.judgement)

    def resolve(self, request: ApprovalRequest, approval: Approval, *, confined: bool) -> Action:
        if approval.answer == Answer.DENY:
            reason = approval.reason or "declined by the user"
            return Action(Verdict.DENY, reason, judgement=request.judgement)
        if request.skill_script:
            if approval.answer != Answer.ALLOW_ONCE:
                self.approved_skill_scripts.add(request.skill_script)
            return Action(
                Verdict.RUN, f"skill script approved by {approval.by}", judgement=request.judgement
            )
        if approval.answer in (Answer.ALLOW_SESSION, Answer.ALLOW_ALWAYS):
            self.approvals.prefixes.update(
                tuple(m.matched_prefix) for m in request.judgement.deciding_matches()
            )
        return self._allowed(request.exec, request.judgement, confined, by=approval.by)


def _keepable(action: Action) -> bool:
    """Whether ``action`` follows from its judgement and the exec's key alone: no human, no
    earlier answer, no skill script, and for an escalation no rule token that names a file by
    a path (resolved against the file system each time, see :func:`names_file_that_runs`)."""
    judgement = action.judgement
    if judgement is None or action.approval is not None or action.granted:
        return False
    if judgement.decision is None or judgement.decision == Decision.FORBIDDEN:
        return True
    if judgement.decision != Decision.ALLOW:
        return False
    return all("/" not in m.rule.program for m in judgement.deciding_matches())


def _leaving_note(leaving: str | None, judgement: Judgement, *, by: str = "") -> str:
    """What an allowed exec that leaves the gate is recorded with (audit log)."""
    if leaving is None:
        return ""
    approved = f", approved by {by}" if by else ""
    return f"{leaving}, allowed by rule {judgement.rule_locations()}{approved}; runs ungated"


def _approval_prefix(judgement: Judgement) -> tuple[str, ...]:
    """The prefix to approve: the longest prefix among the rules that asked."""
    deciding = judgement.deciding_matches()
    longest: Sequence[str] = max((m.matched_prefix for m in deciding), key=len, default=())
    return tuple(longest) or tuple(judgement.command[:1])


def _needs_approval(request: ApprovalRequest, why_not_asked: str) -> str:
    justification = request.judgement.justification() or "requires approval by policy"
    return f"{justification}; {why_not_asked}"


def no_one_to_ask(request: ApprovalRequest, why: str) -> Approval:
    """A denial for a prompt nobody can answer, saying how to allow the command."""
    if request.network is not None:
        net = request.network
        return Approval(
            Answer.DENY,
            reason=(
                f"{net.justification or 'requires approval'}; {why}; to allow it, add "
                f'network_rule(host="{net.host}", protocol="{net.protocol}", '
                'decision="allow") to your rules'
            ),
            by="execgate",
        )
    try:  # the very line an "always" answer would write
        rule = allow_rule_line(request.prefix)
    except PolicyError:  # a prefix no allow rule can name (an empty token)
        rule = "an allow rule for its prefix"
    return Approval(
        Answer.DENY,
        reason=(
            f"{_needs_approval(request, why)}; to allow it, add {rule} to your rules "
            "(execgate rules explain shows the rule that asks)"
        ),
        by="execgate",
    )
