"""``execgate mcp``: the MCP server and its ``shell`` tool (stdio transport).

Built on the SDK's low-level :class:`mcp.server.lowlevel.Server`, which lets us publish Codex's
exact tool schema plus an output schema, answer Codex's ``codex/sandbox-state/update`` request
and advertise its experimental capability. Per connection (one per process with stdio):

* one :class:`~execgate.gate.escalation.PolicyEscalation`, so "allow for this session" answers
  last for the connection;
* one :class:`~execgate.mcp_front.elicitation.ApprovalRegistry` and its control socket;
* one live policy, reloaded when its files change.

Each tool call is a :class:`~execgate.mcp_front.calls.ShellCall` with its own
:class:`~execgate.gate.session.EscalationSession`; calls run concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ConfigDict

from execgate import __version__
from execgate.config import Config
from execgate.decisionlog import DecisionLog
from execgate.errors import ExecgateError
from execgate.gate.escalation import Asker
from execgate.gate.livepolicy import GatePolicy, PolicyLoad, PolicySource
from execgate.gate.network import NetworkSettings, default_for
from execgate.gate.session import SessionReserve, log_escalations
from execgate.mcp_front.calls import CallSetup, ProgressPump, ShellCall
from execgate.mcp_front.control import ControlServer
from execgate.mcp_front.elicitation import (
    ApprovalRegistry,
    CallAsker,
    CallInfo,
    Channel,
    InputRequests,
    MidCallElicitation,
    NoElicitation,
    elicit_request,
)
from execgate.mcp_front.malformed import AnsweringMalformed
from execgate.mcp_front.reload import Loaded, PolicyReloader
from execgate.mcp_front.tool import (
    TOOL_NAME,
    ToolArgumentError,
    error_result,
    parse_arguments,
    tool_definition,
    tool_result,
)
from execgate.sandbox import SandboxSpec, spec_from_codex_policy
from execgate.sandbox.codex import CodexPolicyError

log = logging.getLogger("execgate.mcp")

SERVER_NAME = "execgate"
INSTRUCTIONS = (
    "This server provides a tool to execute shell commands and return their output. "
    "Every program a command starts is checked against the user's execgate policy first: "
    "a denied program fails with an `execgate: denied: ...` line in the output that says why, "
    "and some programs wait for a human's approval."
)
SANDBOX_STATE_METHOD = "codex/sandbox-state/update"
SANDBOX_STATE_CAPABILITY = {"codex/sandbox-state": {"version": "1.0.0"}}
SANDBOX_STATE_META = "codex/sandbox-state-meta"

Context = ServerRequestContext[Any, Any]


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


# -- the policy and what follows from it ---------------------------------------------------------


class PolicyState:
    """The gate policy of this server and its reloader."""

    def __init__(self, options: McpOptions) -> None:
        self.source = PolicySource(tuple(options.rules or ()), options.cwd, options.config)
        first = self._load()  # PolicyError (one line, file:line:col) stops start-up
        self.gate = GatePolicy(
            first.value,
            search_path=os.environ.get("PATH", os.defpath),
            ask_always=options.audit is not None,
            on_prompt_deny=options.on_prompt_deny,
        )
        self.reloader = PolicyReloader(
            self._load, self._apply, first.watch_paths, interval=options.reload_interval
        )

    def _load(self) -> Loaded[PolicyLoad]:
        load = self.source.load()
        for warning in load.warnings:
            log.warning("%s", warning)
        if load.fail_closed_reason:
            log.warning("%s", load.fail_closed_reason)
        return Loaded(load, load.watch_paths)

    def _apply(self, loaded: Loaded[PolicyLoad]) -> None:
        self.gate.apply(loaded.value)


# -- the server ----------------------------------------------------------------------------------


class _RawParams(types.RequestParams):
    """Params kept as sent (Codex's custom request is validated by hand, with Codex's errors)."""

    model_config = ConfigDict(extra="allow")


@dataclass
class _Parked:
    call: ShellCall
    expiry: asyncio.TimerHandle


@dataclass(frozen=True)
class _CodexSandbox:
    policy: dict[str, Any]
    cwd: Path


def _can_elicit(capabilities: types.ClientCapabilities | None) -> bool:
    elicitation = capabilities.elicitation if capabilities is not None else None
    if elicitation is None:
        return False
    # An empty `elicitation: {}` means form mode (2025-06-18 clients); URL-only cannot show forms.
    return elicitation.form is not None or elicitation.url is None


class McpFrontEnd:
    def __init__(self, options: McpOptions, state: PolicyState) -> None:
        self.options = options
        self.state = state
        self.registry = ApprovalRegistry(options.approval_timeout)
        self.control = ControlServer(self.registry, self._info, self._revoke)
        self.calls: set[ShellCall] = set()
        self.parked: dict[str, _Parked] = {}
        self.codex_sandbox: _CodexSandbox | None = None
        # A parked call (2026-07-28 flow) whose client never comes back is stopped after this.
        self.abandon_after = 2 * options.approval_timeout
        self._started = time.time()
        self._background: set[asyncio.Future[None]] = set()
        self.server: Server[Any] = Server(
            SERVER_NAME,
            version=__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self.server.add_request_handler(SANDBOX_STATE_METHOD, _RawParams, self._sandbox_state)
        # Each call opens a session; one is kept open ahead of the next call.
        self.sessions = SessionReserve()
        # One object for every call (the reserve hands out sessions opened with equal ones).
        self.network = NetworkSettings(
            default=default_for(options.config.network.default, can_ask=not options.on_prompt_deny),
            hosts_file=options.config.network.hosts_file,
            approvals=lambda: self.state.gate.approvals,
        )

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

    async def serve_stdio(self) -> None:
        await self.control.start()
        watcher = asyncio.ensure_future(self.state.reloader.run())
        try:
            async with stdio_server() as (read_stream, write_stream):
                await self.server.run(
                    AnsweringMalformed(read_stream, write_stream),
                    write_stream,
                    self.server.create_initialization_options(
                        experimental_capabilities=SANDBOX_STATE_CAPABILITY
                    ),
                )
        except* (BrokenPipeError, ConnectionResetError):
            # The client went away while we still had something to say (an elicitation, a
            # result): the end of the connection, not an error.
            log.info("the MCP client is gone")
        finally:
            watcher.cancel()
            with anyio.CancelScope(shield=True):
                await self.aclose()

    async def aclose(self) -> None:
        """Stop every call (killing what they started) and close the control socket."""
        for parked in self.parked.values():
            parked.expiry.cancel()
        self.parked.clear()
        calls = list(self.calls)
        if calls:
            log.info("stopping %d running tool call(s)", len(calls))
        await asyncio.gather(*(call.abort() for call in calls), return_exceptions=True)
        self.calls.clear()
        await self.sessions.aclose()
        await self.control.aclose()
        if self.options.decisions is not None:
            self.options.decisions.close()

    # -- handlers ---------------------------------------------------------------------------

    async def _list_tools(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool_definition()])

    async def _sandbox_state(self, ctx: Context, params: _RawParams) -> dict[str, Any]:
        raw = dict(params.model_extra or {})
        if not raw:
            raise MCPError(code=INVALID_PARAMS, message="missing params for sandbox state request")
        policy, cwd = raw.get("sandboxPolicy"), raw.get("sandboxCwd")
        if not isinstance(policy, dict) or not isinstance(cwd, str):
            raise MCPError(
                code=INVALID_PARAMS, message="failed to deserialize sandbox state", data=raw
            )
        state = _CodexSandbox(policy, self.options.cwd / cwd)
        try:
            spec = spec_from_codex_policy(policy, cwd=state.cwd, config=self.options.config.sandbox)
        except CodexPolicyError as exc:
            log.warning("rejected sandbox state from the client: %s", exc)
            raise MCPError(
                code=INVALID_PARAMS, message="failed to deserialize sandbox state", data=raw
            ) from None
        except ExecgateError as exc:  # e.g. sandboxCwd missing: kept, calls will say so
            log.warning("sandbox state from the client cannot be used yet: %s", exc)
        else:
            log.info("sandbox from the client (%s): %s", policy.get("type"), spec.describe())
        self.codex_sandbox = state
        return {}

    async def _call_tool(
        self, ctx: Context, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        if params.name != TOOL_NAME:
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {params.name}")
        if params.request_state is not None:
            call = self._resume(params.request_state)
            if call is None:
                return error_result(
                    "shell: this approval request is no longer pending (it was answered "
                    f"already, or nobody came back for it within {self.abandon_after:g} s and "
                    "the command was stopped); run the command again"
                )
            if call.inputs is not None:
                call.inputs.answer(dict(params.input_responses or {}))
            return await self._drive(ctx, call)
        await self.state.reloader.check()
        try:
            args = parse_arguments(params.arguments, default_login=self.options.default_login)
        except ToolArgumentError as exc:
            return error_result(f"shell: {exc}")
        try:
            sandbox = self._sandbox_for(ctx)
        except ExecgateError as exc:
            return error_result(f"shell: cannot set up the sandbox: {exc}")
        setup = CallSetup(
            live=self.state.gate.live,
            escalation=self.state.gate.escalation,
            sandbox=sandbox,
            shell=self.options.shell,
            base_env=dict(os.environ),
            gate_escalated=self.options.config.gate_escalated,
            clean_escalated_env=self.options.config.clean_escalated_env,
            # The registry times questions out; the session's own limit is only a backstop.
            approval_timeout=self.options.approval_timeout + 10,
            decisions=self.options.decisions,
            reserve=self.sessions,
            network=self.network,
        )
        call = ShellCall(setup, args)
        channel = self._channel(ctx, call)
        asker: Asker = CallAsker(
            self.registry, CallInfo(call.id, args.command, args.workdir), channel
        )
        asker = self.state.gate.approvals.recording(asker)
        log.info(
            "tool call %d: %s in %s (timeout %d ms, %s, sandbox %s)",
            call.id,
            args.command if len(args.command) < 200 else args.command[:200] + "…",
            args.workdir,
            args.timeout_ms,
            "login shell" if args.login else "non-login shell",
            sandbox.describe() if sandbox else "off",
        )
        self.calls.add(call)
        call.start(asker)
        return await self._drive(ctx, call)

    # -- a call's life across requests ----------------------------------------------------------

    def _elicits(self, ctx: Context) -> bool:
        """Whether to put questions to this client (see :attr:`McpOptions.elicitation`)."""
        mode = self.options.elicitation
        if mode == "never":
            return False
        if _can_elicit(ctx.session.client_capabilities):
            return True
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return False  # an input request the client cannot fulfil fails the whole call
        if mode == "always":
            return True
        params = ctx.session.client_params
        name = params.client_info.name if params is not None else ""
        return name.lower().startswith("codex")

    def _channel(self, ctx: Context, call: ShellCall) -> Channel:
        if not self._elicits(ctx):
            legacy = ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS

            async def notify(text: str) -> None:
                await ctx.session.send_notification(
                    types.LoggingMessageNotification(
                        params=types.LoggingMessageNotificationParams(
                            level="warning", logger="execgate", data=text
                        )
                    ),
                    related_request_id=ctx.request_id,
                )

            return NoElicitation(notify if legacy else None)
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            call.inputs = InputRequests(call.notify)
            return call.inputs

        async def elicit(message: str, schema: dict[str, Any]) -> types.ElicitResult:
            return await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)

        return MidCallElicitation(elicit)

    async def _drive(
        self, ctx: Context, call: ShellCall
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Follow ``call`` for this request: until it ends (its result), until it needs answers
        only the client's retry can bring (2026-07-28: park it), or until this request is
        cancelled (stop it)."""
        token = (ctx.meta or {}).get("progress_token")
        pump: ProgressPump | None = None
        unlisten: Callable[[], None] | None = None
        if token is not None:

            async def send(progress: float, message: str | None) -> None:
                await ctx.session.send_notification(
                    types.ProgressNotification(
                        params=types.ProgressNotificationParams(
                            progress_token=token, progress=progress, message=message
                        )
                    ),
                    related_request_id=ctx.request_id,
                )

            pump = ProgressPump(send)
            unlisten = call.listen(pump.feed)
            pump.start()
        parked = False
        try:
            while True:
                call.changed.clear()
                if call.finished:
                    if pump is not None:
                        await pump.stop(flush=True)
                        pump = None
                    self.calls.discard(call)
                    if call.error is not None or call.outcome is None:
                        return error_result(f"shell: {call.error or 'the command did not run'}")
                    return tool_result(call.outcome)
                questions = call.inputs.unanswered() if call.inputs is not None else []
                if questions:
                    state = self._park(call)
                    parked = True
                    return types.InputRequiredResult(
                        input_requests={q.id: elicit_request(q) for q in questions},
                        request_state=state,
                    )
                await call.changed.wait()
        except BaseException:
            if not parked:  # cancelled (or a bug): nothing of the call may outlive the request
                with anyio.CancelScope(shield=True):
                    await call.abort()
                self.calls.discard(call)
            raise
        finally:
            if unlisten is not None:
                unlisten()
            if pump is not None:
                with anyio.CancelScope(shield=True):
                    await pump.stop(flush=False)

    def _park(self, call: ShellCall) -> str:
        token = secrets.token_urlsafe(24)
        loop = asyncio.get_running_loop()
        expiry = loop.call_later(self.abandon_after, self._abandon, token)
        self.parked[token] = _Parked(call, expiry)
        log.info("tool call %d waits for the client to answer its approval request(s)", call.id)
        return token

    def _resume(self, token: str) -> ShellCall | None:
        parked = self.parked.pop(token, None)
        if parked is None:
            return None
        parked.expiry.cancel()
        return parked.call

    def _abandon(self, token: str) -> None:
        parked = self.parked.pop(token, None)
        if parked is None:
            return
        call = parked.call
        log.warning(
            "tool call %d: the client did not come back within %g s; stopping it",
            call.id,
            self.abandon_after,
        )

        async def stop() -> None:
            await call.abort()
            self.calls.discard(call)

        task = asyncio.ensure_future(stop())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _sandbox_for(self, ctx: Context) -> SandboxSpec:
        """The call's sandbox: the client's Codex sandbox state (per call in ``_meta``, or the
        last ``codex/sandbox-state/update``) with its writable roots kept within the
        workspace's bounds, else the configured profile. Never the call's ``workdir``."""
        state = self.codex_sandbox
        meta: dict[str, Any] = dict(ctx.meta or {})
        per_call = meta.get(SANDBOX_STATE_META)
        if isinstance(per_call, dict):
            policy, cwd = per_call.get("sandboxPolicy"), per_call.get("sandboxCwd")
            if isinstance(policy, dict) and isinstance(cwd, str):
                state = _CodexSandbox(policy, self.options.cwd / cwd)
        if state is None:
            return self.options.sandbox
        spec = spec_from_codex_policy(
            state.policy, cwd=state.cwd, config=self.options.config.sandbox
        )
        spec, dropped = spec.within(self.options.writable_bounds)
        if dropped:
            log.warning(
                "sandbox state: not writable, outside the workspace and --writable-root: %s",
                ", ".join(map(str, dropped)),
            )
        return spec


async def serve(options: McpOptions) -> None:
    """Load the policy, then serve MCP on stdin/stdout until the client goes away (or a
    SIGTERM, SIGHUP or SIGINT), stopping every call before returning."""
    state = PolicyState(options)
    log_escalations()
    front = McpFrontEnd(options, state)
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    stopping = False
    finishing: list[asyncio.Future[None]] = []

    def stop(signum: int) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        log.info("%s: stopping", signal.Signals(signum).name)

        async def finish() -> None:
            # The stdio reader thread may sit in a blocking read of stdin, which cannot be
            # interrupted: clean up here, then leave without waiting for it.
            with contextlib.suppress(Exception):
                await front.aclose()
            os._exit(128 + signum)

        finishing.append(asyncio.ensure_future(finish()))

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        loop.add_signal_handler(signum, stop, signum)
    await front.serve_stdio()
