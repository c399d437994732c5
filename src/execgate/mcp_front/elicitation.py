"""Putting ``prompt`` decisions to a human from the MCP server.

Every question a tool call's session asks becomes a :class:`Question` in the server's
:class:`ApprovalRegistry`. It is answered by whichever comes first:

* the MCP client, through the call's :class:`QuestionRoute`:

  - :class:`MidCallElicitation` -- an ``elicitation/create`` request while the call runs
    (protocol 2025-06-18 and 2025-11-25);
  - :class:`InputRequests` -- the 2026-07-28 flow: the tool call returns an
    ``InputRequiredResult`` holding the question while the exec stays paused, and the client's
    retry carries the answer;
  - :class:`NoElicitation` -- the client cannot ask anyone: the server logs how to answer;

* ``execgate approvals allow|deny ID`` from another terminal (the control socket, always open);
* the approval timeout: a denial saying why and how to allow the command.

An ``elicitation/create`` still open when the question is settled another way is cancelled
(the client gets ``notifications/cancelled`` for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, Protocol

from execgate.gate.askers import describe
from execgate.gate.escalation import (
    Answer,
    Approval,
    ApprovalRequest,
    NetworkTarget,
    no_one_to_ask,
    rule_location,
)
from execgate.visible import command_line, quote_word, visible

log = logging.getLogger("execgate.mcp")

#: The form's choices: value, label. "always" only when the request offers it.
DECISIONS: Final = (
    ("once", "Allow once"),
    ("session", "Allow for the rest of this MCP session"),
    ("always", "Always allow (adds an allow rule to your rules file)"),
    ("deny", "Deny"),
)
_ANSWERS: Final = {
    "once": Answer.ALLOW_ONCE,
    "session": Answer.ALLOW_SESSION,
    "always": Answer.ALLOW_ALWAYS,
    "deny": Answer.DENY,
}
_ANSWER_WORDS: Final = {
    Answer.ALLOW_ONCE: "allowed once",
    Answer.ALLOW_SESSION: "allowed for this MCP session",
    Answer.ALLOW_ALWAYS: "allowed always (rule recorded)",
    Answer.DENY: "denied",
}


@dataclass(frozen=True, slots=True)
class CallInfo:
    """The tool call a question comes from (for listings and messages), and what its client
    does with forms."""

    call_id: int
    command: str
    workdir: str
    #: Why the client answers approval requests without showing them to anyone (``codex
    #: exec``), or None: its answers are then not a human's.
    unattended: str | None = None
    #: Whether the form has the optional ``reason`` field. Codex's TUI will not submit a form
    #: while an optional text field is empty, so Codex gets the decision alone (one key).
    reason_field: bool = True


@dataclass(eq=False)
class Question:
    id: str
    request: ApprovalRequest
    call: CallInfo
    route: QuestionRoute
    future: asyncio.Future[Approval]
    asked_at: float = field(default_factory=time.time)
    _started: float = field(default_factory=time.monotonic)

    @property
    def settled(self) -> bool:
        return self.future.done()

    def settle(self, approval: Approval) -> bool:
        """Answer the question unless it already has an answer; True if this one counted."""
        if self.future.done():
            return False
        self.future.set_result(approval)
        return True

    @property
    def waited(self) -> float:
        return time.monotonic() - self._started

    def summary(self) -> dict[str, Any]:
        """The question as ``execgate approvals list`` shows it."""
        exec_ = self.request.exec
        judgement = self.request.judgement
        return {
            "id": self.id,
            "command": exec_.display(),
            "program": exec_.realpath or exec_.path,
            "argv": list(exec_.argv),
            "cwd": exec_.cwd,
            "pid": exec_.pid,
            "justification": judgement.justification(),
            "rules": [
                {"location": rule_location(m), "prefix": list(m.matched_prefix)}
                for m in judgement.deciding_matches()
            ],
            "prefix": list(self.request.prefix),
            "offer_always": self.request.offer_always,
            "asked_at": self.asked_at,
            "waited": round(self.waited, 3),
            "asked_via": self.route.kind,
            "tool_call": {"command": self.call.command, "workdir": self.call.workdir},
            **({"network": _network_summary(self.request.network)} if self.request.network else {}),
        }


def _network_summary(net: NetworkTarget) -> dict[str, Any]:
    return {
        "host": net.host,
        "port": net.port,
        "protocol": net.protocol,
        "addresses": list(net.addresses),
        "rules": list(net.rules),
    }


class QuestionRoute(Protocol):
    """How one tool call's questions reach the MCP client (besides the control socket)."""

    kind: str

    def open(self, question: Question) -> None:
        """Start putting ``question`` to the client (must not block)."""
        ...

    def close(self, question: Question) -> None:
        """``question`` is settled: stop asking."""
        ...

    def unanswered_why(self, question: Question, timeout: float) -> str:
        """Why nobody answered, for the denial after the approval timeout."""
        ...


# -- forms ------------------------------------------------------------------------------------


def form_message(question: Question) -> str:
    """What the human reads: the exact program, argv, cwd, process, rule and justification."""
    exec_ = question.request.exec
    lines = describe(question.request)
    if question.request.network is None:
        lines.insert(1, f"  argv:    {command_line(exec_.argv, 2000)}")
    lines.append(f"  asked by the agent's shell command: {visible(question.call.command, 400)}")
    lines.append(
        f"Allow it? (approval {question.id}; also answerable with "
        f"`execgate approvals allow|deny {question.id}`)"
    )
    return "\n".join(lines)


def form_schema(offer_always: bool, reason_field: bool = True) -> dict[str, Any]:
    """The approval form: ``decision`` (required, "once" first so that the common answer is
    the first choice) and, unless ``reason_field`` is false, an optional ``reason``."""
    choices = [(v, label) for v, label in DECISIONS if offer_always or v != "always"]
    properties: dict[str, Any] = {
        "decision": {
            "type": "string",
            "title": "Decision",
            "description": "Run the program, or deny it (the agent sees the denial).",
            "enum": [v for v, _ in choices],
            "enumNames": [label for _, label in choices],
        },
    }
    if reason_field:
        properties["reason"] = {
            "type": "string",
            "title": "Reason",
            "description": "Optional. Recorded in the log; when denying, shown to the agent.",
        }
    return {"type": "object", "properties": properties, "required": ["decision"]}


def question_schema(question: Question) -> dict[str, Any]:
    return form_schema(question.request.offer_always, question.call.reason_field)


ELICIT_METHOD: Final = "elicitation/create"
_ACTIONS: Final = ("accept", "decline", "cancel")


class ElicitResult(NamedTuple):
    """The client's answer to a form: ``accept`` (with ``content``), ``decline`` or ``cancel``."""

    action: str
    content: dict[str, Any] | None = None


def elicit_result(raw: object) -> ElicitResult:
    """The answer in an ``elicitation/create`` result (ValueError: it is not one)."""
    if not isinstance(raw, dict) or raw.get("action") not in _ACTIONS:
        raise ValueError("not an elicitation result (action: accept, decline or cancel)")
    content = raw.get("content")
    if content is not None and not isinstance(content, dict):
        raise ValueError("an elicitation result's content must be an object")
    return ElicitResult(raw["action"], content)


def form_params(message: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The params of an ``elicitation/create`` form request."""
    return {"mode": "form", "message": message, "requestedSchema": schema}


def elicit_request(question: Question) -> dict[str, Any]:
    """The question as an input request of a 2026-07-28 ``input_required`` result."""
    return {
        "method": ELICIT_METHOD,
        "params": form_params(form_message(question), question_schema(question)),
    }


def _with_reason(base: str, reason: str | None) -> str:
    return f"{base}: {reason}" if reason else base


def approval_from_elicitation(
    result: ElicitResult, request: ApprovalRequest, call: CallInfo | None = None
) -> Approval:
    """The answer in an ``ElicitResult``: a human's, unless ``call`` says its client answers by
    itself. ``accept`` without a decision (a client that shows only accept/decline) means
    "allow once"."""
    content = result.content or {}
    raw_reason = content.get("reason")
    reason = raw_reason.strip() if isinstance(raw_reason, str) and raw_reason.strip() else None
    unattended = call.unattended if call is not None else None
    if unattended is not None:
        return _unattended_answer(result, content, request, unattended, reason)
    if result.action == "accept":
        decision = content.get("decision")
        if decision is None:
            decision = "once"
        answer = _ANSWERS.get(decision) if isinstance(decision, str) else None
        if answer is None:
            return Approval(
                Answer.DENY,
                reason=f"the approval form came back with an unknown decision {decision!r}",
                by="elicitation",
            )
        if answer == Answer.DENY:
            return Approval(Answer.DENY, _with_reason("denied by the user", reason), "elicitation")
        if answer == Answer.ALLOW_ALWAYS and not request.offer_always:
            answer = Answer.ALLOW_SESSION
        return Approval(answer, reason=reason, by="elicitation")
    if result.action == "decline":
        return Approval(Answer.DENY, _with_reason("declined by the user", reason), "elicitation")
    return Approval(
        Answer.DENY, _with_reason("the user dismissed the approval request", reason), "elicitation"
    )


def _unattended_answer(
    result: ElicitResult,
    content: dict[str, Any],
    request: ApprovalRequest,
    unattended: str,
    reason: str | None,
) -> Approval:
    """What a client that answers by itself said; nobody saw the question, so never "the
    user"."""
    if result.action == "accept":
        answer = _ANSWERS.get(str(content.get("decision", "once")))
        if answer is not None and answer != Answer.DENY:
            if answer == Answer.ALLOW_ALWAYS and not request.offer_always:
                answer = Answer.ALLOW_SESSION
            return Approval(answer, reason=_with_reason(unattended, reason), by="client")
    what = {"decline": "declined", "cancel": "cancelled"}.get(result.action, "denied")
    return Approval(
        Answer.DENY,
        _with_reason(f"the client {what} without showing the question ({unattended})", reason),
        "client",
    )


# -- routes -----------------------------------------------------------------------------------

#: Sends ``elicitation/create`` (message, requested schema) and returns the client's answer.
Elicit = Callable[[str, dict[str, Any]], Awaitable[ElicitResult]]


class MidCallElicitation:
    """``elicitation/create`` sent while the tool call runs (2025-06-18, 2025-11-25)."""

    kind = "elicitation"

    def __init__(self, elicit: Elicit) -> None:
        self._elicit = elicit
        self._tasks: dict[Question, asyncio.Task[None]] = {}

    def open(self, question: Question) -> None:
        self._tasks[question] = asyncio.ensure_future(self._ask(question))

    def close(self, question: Question) -> None:
        task = self._tasks.pop(question, None)
        if task is not None and not task.done():
            task.cancel()

    async def _ask(self, question: Question) -> None:
        try:
            result = await self._elicit(form_message(question), question_schema(question))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning(
                "the MCP client could not show approval %s (%s); answer it from a terminal: "
                "execgate approvals allow %s  (or: deny %s)",
                question.id,
                exc,
                question.id,
                question.id,
            )
            return
        question.settle(approval_from_elicitation(result, question.request, question.call))

    def unanswered_why(self, question: Question, timeout: float) -> str:
        return f"nobody answered the approval request within {timeout:g} s"


class InputRequests:
    """The 2026-07-28 flow: questions wait here until the tool call hands them to the client as
    an ``InputRequiredResult``; the client's retry answers them (:meth:`answer`)."""

    kind = "input-required"

    def __init__(self, on_question: Callable[[], None]) -> None:
        self._on_question = on_question
        self._questions: dict[str, Question] = {}

    def open(self, question: Question) -> None:
        self._questions[question.id] = question
        self._on_question()

    def close(self, question: Question) -> None:
        self._questions.pop(question.id, None)

    def unanswered(self) -> list[Question]:
        return [q for q in self._questions.values() if not q.settled]

    def answer(self, responses: dict[str, Any] | None) -> None:
        """Settle the questions the client answered (keys are question ids)."""
        for key, response in (responses or {}).items():
            question = self._questions.get(key)
            if question is None:
                log.info("ignoring an answer to unknown or settled approval %s", key)
            else:
                try:
                    answer = elicit_result(response)
                except ValueError as exc:
                    log.warning("approval %s: the client's answer is not usable: %s", key, exc)
                    continue
                question.settle(approval_from_elicitation(answer, question.request, question.call))

    def unanswered_why(self, question: Question, timeout: float) -> str:
        return f"the MCP client did not come back with an answer within {timeout:g} s"


class NoElicitation:
    """A client that cannot ask anyone: log how to answer from a terminal (and tell the client
    in a log message when it takes them)."""

    kind = "none"

    def __init__(self, notify: Callable[[str], Awaitable[None]] | None = None) -> None:
        self._notify = notify
        self._tasks: set[asyncio.Task[None]] = set()

    def open(self, question: Question) -> None:
        text = (
            f"approval {question.id} needed: `{question.request.exec.display()}` in "
            f"{quote_word(question.request.exec.cwd)} ({question.request.summary()}). "
            "The MCP client cannot ask (no elicitation); answer from a terminal: "
            f"execgate approvals allow {question.id}   "
            f"(or: execgate approvals deny {question.id}; execgate approvals list)"
        )
        log.warning("%s", text)
        if self._notify is not None:
            task = asyncio.ensure_future(self._send(text))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, text: str) -> None:
        assert self._notify is not None
        with contextlib.suppress(Exception):
            await self._notify(text)

    def close(self, question: Question) -> None:
        pass

    def unanswered_why(self, question: Question, timeout: float) -> str:
        return (
            f"the MCP client cannot ask a human (it has no elicitation support) and nobody "
            f"answered `execgate approvals allow {question.id}` within {timeout:g} s"
        )


# -- the registry -----------------------------------------------------------------------------


class ApprovalError(Exception):
    """An answer that cannot be applied (unknown id, "always" not offered)."""


class ApprovalRegistry:
    """The server's open questions, answerable by id; each waits at most ``timeout`` seconds."""

    def __init__(self, timeout: float, *, prefix: str | None = None) -> None:
        self.timeout = timeout
        self._prefix = prefix or str(os.getpid())
        self._ids = itertools.count(1)
        self._pending: dict[str, Question] = {}

    def pending(self) -> list[Question]:
        return [q for q in self._pending.values() if not q.settled]

    async def ask(self, request: ApprovalRequest, call: CallInfo, route: QuestionRoute) -> Approval:
        loop = asyncio.get_running_loop()
        question = Question(
            id=f"{self._prefix}.{next(self._ids)}",
            request=request,
            call=call,
            route=route,
            future=loop.create_future(),
        )
        self._pending[question.id] = question
        log.info(
            "approval %s asked (%s): %s in %s [tool call %d]",
            question.id,
            route.kind,
            request.exec.display(),
            request.exec.cwd,
            call.call_id,
        )
        try:
            route.open(question)
            try:
                return await asyncio.wait_for(asyncio.shield(question.future), self.timeout)
            except TimeoutError:
                question.settle(
                    no_one_to_ask(request, route.unanswered_why(question, self.timeout))
                )
                return question.future.result()
        finally:
            self._pending.pop(question.id, None)
            route.close(question)
            if not question.future.done():
                question.future.cancel()

    def answer(self, question_id: str, answer: Answer, reason: str | None, *, by: str) -> Question:
        question = self._pending.get(question_id)
        if question is None or question.settled:
            raise ApprovalError(f"no pending approval {question_id}")
        if answer == Answer.ALLOW_ALWAYS and not question.request.offer_always:
            raise ApprovalError(
                f"approval {question_id} cannot be answered with always (the rule that asks "
                "comes from an admin layer, or the server runs with explicit --rules files)"
            )
        if answer == Answer.DENY:
            approval = Approval(Answer.DENY, _with_reason(f"denied by {by}", reason), by)
        else:
            approval = Approval(answer, reason=reason, by=by)
        question.settle(approval)
        return question


class CallAsker:
    """The :class:`~execgate.gate.escalation.Asker` of one tool call's session."""

    def __init__(
        self,
        registry: ApprovalRegistry,
        call: CallInfo,
        route: QuestionRoute,
    ) -> None:
        self.registry = registry
        self.call = call
        self.route = route

    async def ask(self, request: ApprovalRequest) -> Approval:
        approval = await self.registry.ask(request, self.call, self.route)
        words = _ANSWER_WORDS[approval.answer]
        log.info(
            "approval for %s: %s by %s%s",
            request.exec.display(),
            words,
            approval.by,
            f" (reason: {approval.reason})" if approval.reason else "",
        )
        return approval
