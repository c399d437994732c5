"""``execgate mcp``: the MCP server and its ``shell`` tool (stdio transport).

Speaks MCP's JSON-RPC itself (:mod:`.wire`, :mod:`.protocol`, :mod:`.rpc`; no SDK in the
server process: importing it takes longer than a whole start-up may), publishes Codex's exact
tool schema plus an output schema, answers Codex's ``codex/sandbox-state/update`` request and
advertises its experimental capability. Per connection (one per process with stdio):

* one :class:`~execgate.gate.escalation.PolicyEscalation`, so "allow for this session" answers
  last for the connection;
* one :class:`~execgate.mcp_front.elicitation.ApprovalRegistry` and its control socket;
* one live policy, reloaded when its files change.

Each tool call is a :class:`~execgate.mcp_front.calls.ShellCall` with its own
:class:`~execgate.gate.session.EscalationSession`; calls run concurrently.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from execgate import __version__
from execgate.config import Config
from execgate.decisionlog import DecisionLog
from execgate.decisionlog.recorder import permission_entry
from execgate.errors import ExecgateError
from execgate.gate.escalation import (
    Answer,
    Approval,
    ApprovalRequest,
    Asker,
    Judgement,
    Verdict,
)
from execgate.gate.livepolicy import GatePolicy, PolicySource
from execgate.gate.network import NetworkSettings, default_for
from execgate.gate.reload import Loaded, PolicyReloader, Signature, signature, stat_signature
from execgate.gate.session import (
    SessionConfig,
    SessionReserve,
    describe_exec,
    log_escalations,
)
from execgate.gate.skills import skill_scripts
from execgate.mcp_front import permissions, unified_tool
from execgate.mcp_front.calls import CallSetup, ProgressPump, ShellCall
from execgate.mcp_front.control import ControlServer
from execgate.mcp_front.elicitation import (
    ELICIT_METHOD,
    ApprovalRegistry,
    CallAsker,
    CallInfo,
    ElicitResult,
    InputRequests,
    MidCallElicitation,
    NoElicitation,
    QuestionRoute,
    elicit_request,
    elicit_result,
    form_params,
)
from execgate.mcp_front.listening import BoundControl
from execgate.mcp_front.opening import Opening, Stdio
from execgate.mcp_front.protocol import (
    LATEST_HANDSHAKE,
    SANDBOX_STATE_METHOD,
    Client,
    discover_result,
    envelope,
    handshake,
    has_envelope,
    modern_result,
    unsupported_version,
)
from execgate.mcp_front.rpc import Connection, Work
from execgate.mcp_front.tool import (
    TOOL_NAME,
    ShellOutcome,
    ToolArgumentError,
    error_result,
    parse_arguments,
    tool_definition,
    tool_result,
)
from execgate.mcp_front.unified import ProcessStore, UnifiedError, UnifiedProcess
from execgate.mcp_front.wire import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    UNSUPPORTED_PROTOCOL_VERSION,
    Notification,
    Request,
    RequestId,
    RpcError,
)
from execgate.policy import Decision, LoadedPolicy
from execgate.sandbox import SandboxSpec
from execgate.sandbox.codex import CodexPolicyError
from execgate.sandbox.codex_profile import spec_from_sandbox_state
from execgate.visible import visible

log = logging.getLogger("execgate.mcp")

#: Where a call's ``_meta`` carries Codex's sandbox state (0.169 sends both, the same object).
SANDBOX_STATE_KEYS = ("codex/sandbox-state", "codex/sandbox-state-meta")
CONFIGURED = "the server's configuration"
CODEX_TURN_META = "x-codex-turn-metadata"


@dataclass(frozen=True)
class Context:
    """One request from the client, as its handler sees it."""

    request_id: RequestId
    params: dict[str, Any]
    meta: dict[str, Any]  # params._meta
    client: Client
    peer: Connection

    @property
    def modern(self) -> bool:
        return self.client.modern

    async def elicit(self, message: str, schema: dict[str, Any]) -> ElicitResult:
        """Put a form to the client's human (``elicitation/create``)."""
        return elicit_result(await self.peer.request(ELICIT_METHOD, form_params(message, schema)))


@dataclass
class McpOptions:
    """How ``execgate mcp`` was configured (flags over ``config.toml``)."""

    shell: str
    sandbox: SandboxSpec  # the configured profile, on the workspace fixed at start
    #: Where a client's sandbox state may make writable (the workspace, --writable-root & co.).
    writable_bounds: tuple[Path, ...]
    config: Config
    approval_timeout: float
    rules: list[Path] | None = None  # explicit rules files instead of the layered policy
    default_login: bool = True
    audit: Path | None = None
    decisions: DecisionLog | None = None  # where every call's decisions go (closed with us)
    on_prompt_deny: bool = False
    # auto: elicit when the client declares the capability (or is Codex, which answers
    # elicitation requests either way); always: also without it (protocols before 2026-07-28;
    # a refused request falls back to `execgate approvals`); never: `execgate approvals` only.
    elicitation: str = "auto"
    reload_interval: float = 1.0
    cwd: Path = field(default_factory=Path.cwd)
    tools: tuple[str, ...] = ("shell",)  # which of config.MCP_TOOLS to offer


# -- the policy and what follows from it ---------------------------------------------------------


class PolicyState:
    """The gate policy of this server and its reloader."""

    def __init__(
        self,
        options: McpOptions,
        source: PolicySource,
        first: LoadedPolicy,
        seen: Mapping[str, os.stat_result | None] | None = None,
    ) -> None:
        """``first``: the policy ``source`` loaded at start (a PolicyError, one line naming
        file:line:col, stopped the start before); ``seen``: rules files (absolute paths) as
        they were when the client was first answered, before ``first`` was loaded: a change
        since then is a reload, as any later one."""
        self.source = source
        self._report(first)
        self.gate = GatePolicy(
            first,
            search_path=os.environ.get("PATH", os.defpath),
            ask_always=options.audit is not None,
            on_prompt_deny=options.on_prompt_deny,
            skills=skill_scripts(options.config),
        )
        self.reloader = PolicyReloader(
            self._load,
            self._apply,
            first.watch_paths,
            interval=options.reload_interval,
            since=_as_seen(first.watch_paths, seen or {}),
        )

    @staticmethod
    def _report(load: LoadedPolicy) -> None:
        for warning in load.warnings:
            log.warning("%s", warning)
        if load.fail_closed_reason:
            log.warning("%s", load.fail_closed_reason)

    def _load(self) -> Loaded[LoadedPolicy]:
        load = self.source.load()
        self._report(load)
        return Loaded(load, load.watch_paths)

    def _apply(self, loaded: Loaded[LoadedPolicy]) -> None:
        self.gate.apply(loaded.value)


def _as_seen(paths: Sequence[Path], seen: Mapping[str, os.stat_result | None]) -> Signature:
    now = signature(paths)
    return tuple(
        (stat_signature(st) if (st := seen[key]) is not None else None) if key in seen else sig
        for key, sig in zip((os.path.abspath(p) for p in paths), now, strict=True)
    )


# -- the server ----------------------------------------------------------------------------------


@dataclass
class _Parked:
    call: ShellCall
    expiry: anyio.CancelScope  # cancelled when the client comes back


def _answer_source(by: str) -> str:
    """Who answered a question, as the decision log names it."""
    if by == "execgate":
        return "unanswered"
    return "approvals" if by.startswith("execgate approvals") else "elicitation"


class _Described:
    """A call's sandbox in a log line, described only if the line is written (-q: never)."""

    __slots__ = ("spec",)

    def __init__(self, spec: SandboxSpec | None) -> None:
        self.spec = spec

    def __str__(self) -> str:
        return self.spec.describe() if self.spec is not None else "off"


def _is_codex(ctx: Context) -> bool:
    return ctx.client.name.lower().startswith("codex")


def _unattended(meta: object) -> str | None:
    """Why Codex will answer this call's approval requests itself, from the turn metadata it
    sends with each call (``x-codex-turn-metadata``), or None."""
    turn = meta.get(CODEX_TURN_META) if isinstance(meta, dict) else None
    if not isinstance(turn, dict):
        return None
    if turn.get("auto_review_enabled") is True:
        return "Codex's automatic review answers approval requests"
    if turn.get("turn_trigger") == "exec":
        return (
            "codex exec answers approval requests itself; for a human to answer, run "
            "`execgate mcp --elicitation never` and use `execgate approvals`"
        )
    return None


Handle = Callable[[Context], Awaitable[dict[str, Any]]]
#: Requests answered from the server's own description, in the read loop.
_SIMPLE = frozenset({"ping", "tools/list", "server/discover"})


def _check_params(method: str, params: dict[str, Any]) -> None:
    """The shape of the spec methods' params (the tools' arguments are the tools' business)."""
    ok = True
    if method == "tools/call":
        ok = (
            isinstance(params.get("name"), str)
            and isinstance(params.get("arguments"), dict | None)
            and isinstance(params.get("inputResponses"), dict | None)
            and isinstance(params.get("requestState"), str | None)
        )
    elif method == "tools/list":
        ok = isinstance(params.get("cursor"), str | None)
    if not ok:
        raise RpcError(INVALID_PARAMS, "Invalid request parameters", "")


class McpFrontEnd:
    """The MCP side of the server: what each request means (:meth:`accept`), the tool calls."""

    def __init__(
        self,
        options: McpOptions,
        state: PolicyState,
        peer: Connection,
        opening: Opening,
        bound: BoundControl,
    ) -> None:
        self.options = options
        self._bound = bound
        self.peer = peer
        #: The protocol era and (handshake) the client ``initialize`` described.
        self.era: str | None = opening.era
        self.client: Client | None = opening.client
        self.state = state
        self.registry = ApprovalRegistry(options.approval_timeout)
        self.control = ControlServer(self.registry, self._info, self._revoke)
        self.calls: set[ShellCall] = set()
        self.processes = ProcessStore()  # unified exec
        self._permission_ids = itertools.count(1)
        #: Permission requests approved "for this session" (PermissionRequest.session_key).
        self._granted: set[tuple[object, ...]] = set()
        self.parked: dict[str, _Parked] = {}
        #: The last ``codex/sandbox-state/update`` (its params), for calls without a state.
        self.codex_sandbox: dict[str, Any] | None = None
        # The last update's sandbox, once a call has made it (it is the same for every call).
        self._codex_spec: tuple[object, tuple[SandboxSpec, str]] | None = None
        # A parked call (2026-07-28 flow) whose client never comes back is stopped after this.
        self.abandon_after = 2 * options.approval_timeout
        self._started = time.time()
        self._tasks: anyio.abc.TaskGroup | None = None  # calls and timers; serve_stdio's
        self._handlers: dict[str, Handle] = {
            "tools/call": self._call_tool,
            SANDBOX_STATE_METHOD: self._sandbox_state,
        }
        # Each call opens a session; one is kept open ahead of the next call.
        self.sessions = SessionReserve()
        # One object for every call (the reserve hands out sessions opened with equal ones).
        self.network = NetworkSettings(
            default=default_for(options.config.network.default, can_ask=not options.on_prompt_deny),
            hosts_file=options.config.network.hosts_file,
            approvals=lambda: self.state.gate.approvals,
        )
        self._last_config: SessionConfig | None = None

    def _info(self) -> dict[str, Any]:
        return {
            "cwd": str(self.options.cwd),
            "started": self._started,
            "version": __version__,
            "approval_timeout": self.options.approval_timeout,
            **({"session": self.options.decisions.session} if self.options.decisions else {}),
        }

    def _revoke(self, prefix: tuple[str, ...]) -> bool:
        """Withdraw a "for this session" answer: the prefix asks again from now on."""
        granted = self.state.gate.escalation.approvals.prefixes
        if prefix not in granted:
            return False
        granted.discard(prefix)
        return True

    # -- serving ----------------------------------------------------------------------------

    @property
    def tasks(self) -> anyio.abc.TaskGroup:
        assert self._tasks is not None, "not serving"
        return self._tasks

    async def serve_stdio(self) -> None:
        await self.control.start(self._bound)
        async with self.sessions.running(), anyio.create_task_group() as tasks:
            self._tasks = tasks
            # The first call's session opens while the client is still starting up.
            self.sessions.prime(self._session_config(self.options.sandbox))
            tasks.start_soon(self.state.reloader.run)
            try:
                await self.peer.run(self)
            finally:
                with anyio.CancelScope(shield=True):
                    await self.aclose()
                tasks.cancel_scope.cancel()
        log.info("the MCP client is gone")

    # -- requests ---------------------------------------------------------------------------

    def accept(self, request: Request) -> dict[str, Any] | Work:
        """Settle what ``request`` is (in the order the client sent it): its answer now, or the
        work that answers it. The first request decides the protocol era (see
        :mod:`.protocol`); a request of the other era is refused."""
        method, params = request.method, request.params or {}
        if self.era is None:
            modern = method != "initialize" and has_envelope(params)
            self.era = "modern" if modern else "handshake"
        if self.era == "modern":
            if method == "initialize":
                raise RpcError(
                    UNSUPPORTED_PROTOCOL_VERSION,
                    "connection is serving the 2026-07-28 protocol; the initialize handshake "
                    "is not accepted",
                    unsupported_version(params.get("protocolVersion")).data,
                )
            client = envelope(params)
        elif method == "initialize":
            self.client, result = handshake(params)
            return result
        elif has_envelope(params):
            raise RpcError(
                INVALID_REQUEST,
                "this connection serves the handshake protocol era; requests carrying the "
                "2026-07-28 envelope are not accepted on it",
            )
        elif method not in self._handlers and method not in _SIMPLE:
            raise RpcError(METHOD_NOT_FOUND, "Method not found", method)
        elif self.client is not None:
            client = self.client
        elif method == "ping":
            client = Client(LATEST_HANDSHAKE, "", {})
        else:  # before `initialize`
            raise RpcError(INVALID_PARAMS, "Invalid request parameters", "")
        _check_params(method, params)
        if method in _SIMPLE:
            result = self._simple(method, client)
            return modern_result(method, result) if client.modern else result
        handle = self._handlers.get(method)
        if handle is None:
            raise RpcError(METHOD_NOT_FOUND, "Method not found", method)
        meta = params.get("_meta")
        ctx = Context(request.id, params, meta if isinstance(meta, dict) else {}, client, self.peer)
        if client.modern:
            return lambda: self._modern(method, handle, ctx)
        return lambda: handle(ctx)

    @staticmethod
    async def _modern(method: str, handle: Handle, ctx: Context) -> dict[str, Any]:
        return modern_result(method, await handle(ctx))

    def notified(self, notification: Notification) -> None:
        pass  # notifications/cancelled is the connection's; initialized needs nothing

    def _simple(self, method: str, client: Client) -> dict[str, Any]:
        """The answers that need nothing but the server's own description."""
        if method == "tools/list":
            extra = permissions.SCHEMA_PROPERTIES
            offered = [tool_definition(extra), *unified_tool.tool_definitions(extra)]
            return {"tools": [t for t in offered if t["name"] in self.options.tools]}
        if method == "server/discover" and client.modern:
            return discover_result()
        if method == "ping":
            return {}
        raise RpcError(METHOD_NOT_FOUND, "Method not found", method)

    async def aclose(self) -> None:
        """Stop every call (killing what they started) and close the control socket."""
        for parked in self.parked.values():
            parked.expiry.cancel()
        self.parked.clear()
        calls = list(self.calls)
        if calls:
            log.info("stopping %d running tool call(s)", len(calls))
        async with anyio.create_task_group() as stopping:
            stopping.start_soon(self.processes.aclose)
            for call in calls:
                stopping.start_soon(call.abort)
        self.calls.clear()
        await self.sessions.aclose()
        await self.control.aclose()
        if self.options.decisions is not None:
            self.options.decisions.close()

    # -- handlers ---------------------------------------------------------------------------

    async def _sandbox_state(self, ctx: Context) -> dict[str, Any]:
        raw = {k: v for k, v in ctx.params.items() if k != "_meta"}
        if not raw:
            raise RpcError(INVALID_PARAMS, "missing params for sandbox state request")
        policy, cwd = raw.get("sandboxPolicy"), raw.get("sandboxCwd")
        if "permissionProfile" not in raw and (
            not isinstance(policy, dict) or not isinstance(cwd, str)
        ):
            raise RpcError(INVALID_PARAMS, "failed to deserialize sandbox state", raw)
        try:
            spec, field_name = self._client_spec(raw)
        except CodexPolicyError as exc:
            log.warning("rejected sandbox state from the client: %s", exc)
            raise RpcError(INVALID_PARAMS, "failed to deserialize sandbox state", raw) from None
        except ExecgateError as exc:  # e.g. sandboxCwd missing: kept, calls will say so
            log.warning("sandbox state from the client cannot be used yet: %s", exc)
        else:
            log.info("sandbox from %s (%s): %s", SANDBOX_STATE_METHOD, field_name, spec.describe())
        self.codex_sandbox = raw
        return {}

    async def _call_tool(self, ctx: Context) -> dict[str, Any]:
        name: str = ctx.params["name"]
        arguments: dict[str, Any] | None = ctx.params.get("arguments")
        if name not in self.options.tools:
            raise RpcError(INVALID_PARAMS, f"Unknown tool: {name}")
        if name == unified_tool.EXEC_TOOL:
            return await self._exec_command(ctx, arguments)
        if name == unified_tool.WRITE_TOOL:
            return await self._write_stdin(ctx, arguments)
        assert name == TOOL_NAME
        request_state: str | None = ctx.params.get("requestState")
        if request_state is not None:
            call = self._resume(request_state)
            if call is None:
                return error_result(
                    "shell: this approval request is no longer pending (it was answered "
                    f"already, or nobody came back for it within {self.abandon_after:g} s and "
                    "the command was stopped); run the command again"
                )
            if call.inputs is not None:
                call.inputs.answer(ctx.params.get("inputResponses"))
            return await self._drive(ctx, call)
        await self.state.reloader.check()
        try:
            args = parse_arguments(arguments, default_login=self.options.default_login)
        except ToolArgumentError as exc:
            return error_result(f"shell: {exc}")
        try:
            sandbox, sandbox_source = self._sandbox_for(ctx)
        except CodexPolicyError as exc:
            log.warning("refused a tool call: the client's sandbox state cannot be used: %s", exc)
            return error_result(f"shell: cannot use the client's sandbox state: {exc}")
        except ExecgateError as exc:
            return error_result(f"shell: cannot set up the sandbox: {exc}")
        started = time.monotonic()
        argv = [self.options.shell, "-lc" if args.login else "-c", args.command]
        try:
            allowed, denial = await self._permitted(
                ctx, name, arguments, argv, args.workdir, sandbox
            )
        except ToolArgumentError as exc:
            return error_result(f"shell: {exc}")
        except ExecgateError as exc:
            return error_result(f"shell: cannot run the command: {exc}")
        if denial is not None:
            return tool_result(
                ShellOutcome(126, denial + "\n", time.monotonic() - started, timed_out=False)
            )
        setup = CallSetup(
            session=self._session_config(allowed),
            shell=self.options.shell,
            decisions=self.options.decisions,
            reserve=self.sessions,
        )
        call = ShellCall(setup, args)
        route = self._route(ctx, call)
        asker: Asker = CallAsker(
            self.registry,
            CallInfo(
                call.id,
                args.command,
                args.workdir,
                unattended=_unattended(ctx.meta),
                reason_field=not _is_codex(ctx),
            ),
            route,
        )
        asker = self.state.gate.approvals.recording(asker)
        log.info(
            "tool call %d: %s in %s (timeout %d ms, %s, sandbox from %s: %s)",
            call.id,
            args.command if len(args.command) < 200 else args.command[:200] + "…",
            args.workdir,
            args.timeout_ms,
            "login shell" if args.login else "non-login shell",
            sandbox_source,
            _Described(allowed),
        )
        self.calls.add(call)
        call.start(self.tasks, asker)
        return await self._drive(ctx, call)

    # -- unified exec ------------------------------------------------------------------------

    async def _exec_command(self, ctx: Context, arguments: dict[str, Any] | None) -> dict[str, Any]:
        name = unified_tool.EXEC_TOOL
        await self.state.reloader.check()
        try:
            args = unified_tool.parse_exec_arguments(
                arguments,
                default_workdir=str(self.options.cwd),
                default_shell=self.options.shell,
            )
            sandbox, sandbox_source = self._sandbox_for(ctx)
        except ToolArgumentError as exc:
            return error_result(f"{name}: {exc}")
        except CodexPolicyError as exc:
            log.warning("refused a tool call: the client's sandbox state cannot be used: %s", exc)
            return error_result(f"{name}: cannot use the client's sandbox state: {exc}")
        except ExecgateError as exc:
            return error_result(f"{name}: cannot set up the sandbox: {exc}")
        started = time.monotonic()
        try:
            allowed, denial = await self._permitted(
                ctx, name, arguments, args.argv, args.workdir, sandbox
            )
            await self.processes.make_room()
        except (ToolArgumentError, UnifiedError) as exc:
            return error_result(f"{name}: {exc}")
        except ExecgateError as exc:
            return error_result(f"{name}: cannot run the command: {exc}")
        if denial is not None:
            text = denial + "\n"
            return unified_tool.exec_result(
                unified_tool.ExecOutput(
                    output=text,
                    wall_time=time.monotonic() - started,
                    exit_code=126,
                    session_id=None,
                    original_tokens=len(text) // unified_tool.BYTES_PER_TOKEN,
                )
            )
        setup = CallSetup(
            session=self._session_config(allowed),
            shell=args.shell,
            decisions=self.options.decisions,
            reserve=self.sessions,
        )
        process = UnifiedProcess(setup, args)
        process.context = ctx
        asker: Asker = CallAsker(
            self.registry,
            CallInfo(process.id, args.cmd, args.workdir),
            self._unified_route(ctx, process),
        )
        asker = self.state.gate.approvals.recording(asker)
        log.info(
            "unified exec %d: %s in %s (%s, yield %d ms, sandbox from %s: %s)",
            process.id,
            args.cmd if len(args.cmd) < 200 else args.cmd[:200] + "…",
            args.workdir,
            "tty" if args.tty else "pipes",
            args.yield_ms,
            sandbox_source,
            _Described(allowed),
        )
        self.processes.add(process)
        process.start(self.tasks, asker)
        return await self._interact(name, process, "", args.yield_ms, args.max_output_tokens)

    async def _write_stdin(self, ctx: Context, arguments: dict[str, Any] | None) -> dict[str, Any]:
        name = unified_tool.WRITE_TOOL
        try:
            args = unified_tool.parse_write_arguments(arguments)
            process = self.processes.get(args.session_id)
        except (ToolArgumentError, UnifiedError) as exc:
            return error_result(f"{name}: {exc}")
        process.context = ctx
        return await self._interact(
            name, process, args.chars, args.yield_ms, args.max_output_tokens
        )

    async def _interact(
        self, name: str, process: UnifiedProcess, chars: str, yield_ms: int, max_tokens: int
    ) -> dict[str, Any]:
        result = await process.interact(chars, yield_ms, max_tokens)
        if result.exit_code is None:
            return unified_tool.exec_result(result)
        self.processes.forget(process)  # its exit is reported: the session id ends here
        if process.error is not None:
            return error_result(f"{name}: {process.error}")
        return unified_tool.exec_result(result)

    # -- permission requests -------------------------------------------------------------------

    async def _permitted(
        self,
        ctx: Context,
        tool: str,
        arguments: dict[str, Any] | None,
        argv: list[str],
        workdir: str,
        sandbox: SandboxSpec,
    ) -> tuple[SandboxSpec | None, str | None]:
        """The call's permission request, if any, put to the human: the sandbox the call runs
        in, or the denial line when it may not run. ``ToolArgumentError``: a malformed or
        refused request (a banned ``prefix_rule``)."""
        command = argv[-1]
        request = permissions.parse_permissions(arguments, command, workdir=workdir)
        denial = await self._sourced_skills(ctx, argv, workdir)
        if denial is not None or request is None:
            return sandbox, denial
        exec_ = describe_exec(argv[0], argv, cwd=workdir, via="permission request")
        judgement = Judgement(Decision.PROMPT, list(argv), None)
        question = ApprovalRequest(
            id=f"p{next(self._permission_ids)}",
            exec=exec_,
            judgement=judgement,
            prefix=request.prefix_rule,
            offer_always=bool(request.prefix_rule)
            and self.state.gate.approvals.can_record(judgement),
            purpose=request.purpose(),
        )
        log.info("%s: permission request: %s", tool, question.purpose)
        key = request.session_key(command)
        granted = False
        if self.options.on_prompt_deny:
            approval = Approval(
                Answer.DENY,
                "prompts are set to deny (--on-prompt deny), and a permission request "
                "needs a human's answer; run the command without sandbox_permissions",
                "execgate",
            )
        elif key in self._granted:
            granted = True
            approval = Approval(Answer.ALLOW_SESSION, "approved for this session", "execgate")
        else:
            asker = self.state.gate.approvals.recording(
                CallAsker(
                    self.registry,
                    CallInfo(0, command, workdir),
                    self._direct_route(ctx),
                )
            )
            approval = await asker.ask(question)
        if self.options.decisions is not None:
            self.options.decisions.record(
                permission_entry(
                    call=None,
                    permission=request.mode,
                    detail={
                        "command": visible(command, 2000),
                        "justification": request.justification or "",
                        "writable_roots": [str(r) for r in request.writable_roots],
                        "network": request.network,
                        "prefix_rule": list(request.prefix_rule),
                    },
                    decision="deny" if approval.answer == Answer.DENY else "allow",
                    source="grant" if granted else _answer_source(approval.by),
                    answer=None if granted else approval.answer.value,
                    answered_by=None if granted else _answer_source(approval.by),
                    reason=approval.reason,
                )
            )
        log.info("%s: permission request %s by %s", tool, approval.answer.value, approval.by)
        if approval.answer == Answer.DENY:
            reason = approval.reason or "declined by the user"
            return None, (
                f"execgate: denied: permission request ({request.mode}) for "
                f"`{visible(command, 200)}`: {visible(reason, 1000)}"
            )
        if approval.answer in (Answer.ALLOW_SESSION, Answer.ALLOW_ALWAYS):
            self._granted.add(key)
        return permissions.widened(sandbox, request), None

    async def _sourced_skills(self, ctx: Context, argv: list[str], workdir: str) -> str | None:
        """Skill scripts the command line sources (no exec the gate sees) ask like executed
        ones; the denial line if one is denied."""
        gate = self.state.gate
        skills = gate.live.skills
        if skills is None:
            return None
        for script in skills.sourced_by(argv[-1], workdir):
            if script in gate.escalation.approved_skill_scripts:
                continue
            exec_ = describe_exec(argv[0], argv, cwd=workdir, via="source")
            question = ApprovalRequest(
                id=f"s{next(self._permission_ids)}",
                exec=exec_,
                judgement=Judgement(Decision.PROMPT, ["source", script], None),
                prefix=(script,),
                offer_always=False,
                purpose=f"skill script `{visible(script, 500)}` is sourced by the command "
                "(skill scripts always ask)",
                skill_script=script,
            )
            if self.options.on_prompt_deny:
                approval = Approval(
                    Answer.DENY,
                    f"skill script {script} needs a human's approval; prompts are set to deny",
                    "execgate",
                )
            else:
                asker = CallAsker(
                    self.registry, CallInfo(0, argv[-1], workdir), self._direct_route(ctx)
                )
                approval = await asker.ask(question)
            action = gate.escalation.resolve(question, approval, confined=True)
            if action.verdict == Verdict.DENY:
                return f"execgate: denied: source {visible(script, 500)}: {action.reason}"
        return None

    def _direct_route(self, ctx: Context) -> QuestionRoute:
        """Questions asked outside a running call: the client (mid-call elicitation) when it
        can be asked that way, else `execgate approvals`."""
        if not self._elicits(ctx) or ctx.modern:
            return NoElicitation(None)
        return MidCallElicitation(ctx.elicit)

    def _unified_route(self, ctx: Context, process: UnifiedProcess) -> QuestionRoute:
        """Questions of a unified process go to the client of the request that last
        interacted with it (mid-call elicitation), else to `execgate approvals`."""
        if not self._elicits(ctx) or ctx.modern:
            return NoElicitation(None)

        async def elicit(message: str, schema: dict[str, Any]) -> ElicitResult:
            latest: Context = process.context
            return await latest.elicit(message, schema)

        return MidCallElicitation(elicit)

    # -- a call's life across requests ----------------------------------------------------------

    def _elicits(self, ctx: Context) -> bool:
        """Whether to put questions to this client (see :attr:`McpOptions.elicitation`)."""
        mode = self.options.elicitation
        if mode == "never":
            return False
        if ctx.client.can_elicit():
            return True
        if ctx.modern:
            return False  # an input request the client cannot fulfil fails the whole call
        if mode == "always":
            return True
        return _is_codex(ctx)

    def _route(self, ctx: Context, call: ShellCall) -> QuestionRoute:
        if not self._elicits(ctx):

            async def notify(text: str) -> None:
                message = {"level": "warning", "logger": "execgate", "data": text}
                await ctx.peer.notify("notifications/message", message)

            return NoElicitation(None if ctx.modern else notify)
        if ctx.modern:
            call.inputs = InputRequests(call.notify)
            return call.inputs
        return MidCallElicitation(ctx.elicit)

    async def _drive(self, ctx: Context, call: ShellCall) -> dict[str, Any]:
        """Follow ``call`` for this request: until it ends (its result), until it needs answers
        only the client's retry can bring (2026-07-28: park it), or until this request is
        cancelled (stop it)."""
        token = ctx.meta.get("progressToken")
        pump: ProgressPump | None = None
        if isinstance(token, int | str) and not isinstance(token, bool):

            async def send(progress: float, message: str | None) -> None:
                update: dict[str, Any] = {"progressToken": token, "progress": progress}
                if message is not None:
                    update["message"] = message
                await ctx.peer.notify("notifications/progress", update)

            pump = ProgressPump(send)
        async with contextlib.AsyncExitStack() as stack:
            if pump is not None:
                await stack.enter_async_context(pump.streaming())
                stack.callback(call.listen(pump.feed))
            return await self._follow(call, pump)
        raise AssertionError("unreachable")  # mypy: the exit stack does not swallow

    async def _follow(self, call: ShellCall, pump: ProgressPump | None) -> dict[str, Any]:
        parked = False
        try:
            while True:
                call.changed.clear()
                if call.finished:
                    if pump is not None:
                        await pump.finish()
                    self.calls.discard(call)
                    if call.error is not None or call.outcome is None:
                        return error_result(f"shell: {call.error or 'the command did not run'}")
                    return tool_result(call.outcome)
                questions = call.inputs.unanswered() if call.inputs is not None else []
                if questions:
                    state = self._park(call)
                    parked = True
                    return {
                        "inputRequests": {q.id: elicit_request(q) for q in questions},
                        "requestState": state,
                        "resultType": "input_required",
                    }
                await call.changed.wait()
        except BaseException:
            if not parked:  # cancelled (or a bug): nothing of the call may outlive the request
                with anyio.CancelScope(shield=True):
                    await call.abort()
                self.calls.discard(call)
            raise

    def _park(self, call: ShellCall) -> str:
        token = secrets.token_urlsafe(24)
        expiry = anyio.CancelScope()
        self.parked[token] = _Parked(call, expiry)
        self.tasks.start_soon(self._abandon_later, token, expiry)
        log.info("tool call %d waits for the client to answer its approval request(s)", call.id)
        return token

    def _resume(self, token: str) -> ShellCall | None:
        parked = self.parked.pop(token, None)
        if parked is None:
            return None
        parked.expiry.cancel()
        return parked.call

    async def _abandon_later(self, token: str, expiry: anyio.CancelScope) -> None:
        with expiry:
            await anyio.sleep(self.abandon_after)
        if expiry.cancelled_caught:
            return
        parked = self.parked.pop(token, None)
        if parked is None:
            return
        call = parked.call
        log.warning(
            "tool call %d: the client did not come back within %g s; stopping it",
            call.id,
            self.abandon_after,
        )
        await call.abort()
        self.calls.discard(call)

    def _session_config(self, sandbox: SandboxSpec | None) -> SessionConfig:
        """The configuration of a call's session: the last one again while nothing it was made
        from changed (the same sandbox, policy and escalation), so its key is computed once."""
        gate, last = self.state.gate, self._last_config
        if (
            last is not None
            and last.sandbox == sandbox
            and last.live is gate.live
            and last.escalation is gate.escalation
        ):
            return last
        self._last_config = self._new_session_config(sandbox)
        return self._last_config

    def _new_session_config(self, sandbox: SandboxSpec | None) -> SessionConfig:
        return SessionConfig(
            live=self.state.gate.live,
            escalation=self.state.gate.escalation,
            sandbox=sandbox,
            base_env=os.environ,
            gate_escalated=self.options.config.gate_escalated,
            clean_escalated_env=self.options.config.clean_escalated_env,
            # The registry times questions out; the session's own limit is only a backstop.
            approval_timeout=self.options.approval_timeout + 10,
            new_process_session=True,
            network=self.network,
            held_shell=self.options.shell,  # `shell` calls: started ahead (gate/held.py)
        )

    def _client_spec(self, state: object) -> tuple[SandboxSpec, str]:
        return spec_from_sandbox_state(
            state, server_cwd=self.options.cwd, config=self.options.config.sandbox
        )

    def _sandbox_for(self, ctx: Context) -> tuple[SandboxSpec, str]:
        """The call's sandbox and where it came from: the client's Codex sandbox state (per
        call in ``_meta``, else the last ``codex/sandbox-state/update``) with its writable roots
        cut to the workspace's bounds, else the configured profile. Never the call's
        ``workdir``. A state that cannot be enforced exactly raises
        :class:`CodexPolicyError`: the call is refused, never run in another sandbox."""
        meta = ctx.meta
        sent = [(key, meta[key]) for key in SANDBOX_STATE_KEYS if key in meta]
        if sent:
            if any(state != sent[0][1] for _, state in sent):
                raise CodexPolicyError(
                    "the client sent different sandbox states in "
                    + " and ".join(SANDBOX_STATE_KEYS)
                )
            wish, field_name = self._client_spec(sent[0][1])
            source = f"the client's {field_name} (_meta {' / '.join(k for k, _ in sent)})"
        elif self.codex_sandbox is not None:
            state = self.codex_sandbox
            if self._codex_spec is not None and self._codex_spec[0] is state:
                return self._codex_spec[1]  # this update's, as the first call made it
            wish, field_name = self._client_spec(state)
            made = self._within_bounds(wish), f"the client's {field_name} ({SANDBOX_STATE_METHOD})"
            self._codex_spec = state, made
            return made
        else:
            return self.options.sandbox, CONFIGURED
        return self._within_bounds(wish), source

    def _within_bounds(self, wish: SandboxSpec) -> SandboxSpec:
        """A client's sandbox as this server enforces it."""
        spec, cut = wish.within(self.options.writable_bounds)
        if cut:
            log.warning(
                "sandbox state: cut to the workspace and --writable-root (outside them): %s",
                ", ".join(map(str, cut)),
            )
        if self.options.sandbox.network_proxy and spec.confines and not spec.network:
            # The client's "no network" is the configured one: through the proxy, by the rules.
            spec = replace(spec, network_proxy=True)
        # what the server found when it started, not what earlier calls made since
        return replace(spec, known_carveouts=self.options.sandbox.known_carveouts)


async def serve(
    options: McpOptions, state: PolicyState, stdio: Stdio, opening: Opening, bound: BoundControl
) -> None:
    """Serve MCP on the client's stdio, continuing from ``opening``, and ``execgate approvals``
    on ``bound``, until the client goes away (or a SIGTERM, SIGHUP or SIGINT), stopping every
    call before returning."""
    log_escalations()
    peer = Connection(*stdio, opening.unread)
    front = McpFrontEnd(options, state, peer, opening, bound)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_stop_on_signals, front)
        await front.serve_stdio()
        tasks.cancel_scope.cancel()


async def _stop_on_signals(front: McpFrontEnd) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("%s: stopping", signal.Signals(signum).name)
            # Calls may be waiting for a human: clean up here, then leave at once.
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await front.aclose()
            os._exit(128 + signum)
