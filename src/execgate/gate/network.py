"""The session's gatekeeper for proxied connections: policy, defaults, approvals, prompts.

:class:`NetworkGate` implements :class:`execgate.netproxy.server.Gatekeeper`. It runs on the
proxy's thread; questions go to the session's asker and records to the session's log on the
session's own loop (``ask`` and ``record`` are the session's thread-safe doors).

How one connection is decided (docs/policy.md, "Network rules"):

1. the ``network_rule``s for the host and protocol, strictest first; none: ``network.default``;
2. ``forbidden`` (or a default of ``deny``) refuses, naming the rule;
3. ``prompt`` is already answered by a "for this session" answer, or by an ``allow`` rule in
   the user's own layer ("always"); else a human is asked (the question shows the addresses);
4. the name is resolved once; an internal address (loopback, private, link-local, …) is
   dialled only when an ``allow`` rule names the host or a human saw the address and allowed
   it; the proxy then dials exactly these addresses.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.to_thread

from execgate import paths
from execgate.decisionlog.argv import bounded_argv
from execgate.gate.approvals import UserApprovals
from execgate.gate.escalation import (
    Answer,
    Approval,
    ApprovalRequest,
    Judgement,
    NetworkTarget,
)
from execgate.gate.program import GatedExec
from execgate.netproxy.resolve import IPAddress, ResolveError, Resolver, is_internal
from execgate.netproxy.server import Admission, Connection
from execgate.policy import Decision, Policy
from execgate.policy.amend import network_allow_line
from execgate.policy.network import NetworkJudgement, judge_network, rule_location, rule_text

NetworkDefault = Literal["prompt", "deny", "allow"]
NETWORK_DEFAULTS: tuple[NetworkDefault, ...] = ("prompt", "deny", "allow")


@dataclass(frozen=True)
class NetworkSettings:
    """How a front end wants its proxied connections decided.

    ``default``: for hosts no rule names. ``hosts_file``: consulted before DNS.
    ``approvals``: the user's lasting approvals, read at each decision (they change on reload).
    """

    default: NetworkDefault = "deny"
    hosts_file: Path | None = None
    approvals: Callable[[], UserApprovals] | None = None


def default_for(configured: str | None, *, can_ask: bool) -> NetworkDefault:
    """``network.default``, else ``prompt`` where a human can be asked and ``deny`` where not."""
    if configured in NETWORK_DEFAULTS:
        return configured
    return "prompt" if can_ask else "deny"


_ids = itertools.count(1)
# Who answered, as the decision log's ``source`` and ``answered_by`` say it.
_ANSWERED_BY = {"execgate": "unanswered", "execgate approvals": "approvals"}
log = logging.getLogger("execgate.network")


class NetworkGate:
    def __init__(
        self,
        *,
        settings: NetworkSettings,
        policy: Callable[[], Policy],
        fail_closed_reason: Callable[[], str | None],
        ask: Callable[[ApprovalRequest], concurrent.futures.Future[Approval]],
        record: Callable[[dict[str, Any]], object],
        proxy_port: int,
    ) -> None:
        self.settings = settings
        self._policy = policy
        self._fail_closed_reason = fail_closed_reason
        self._ask = ask
        self._record = record
        self._proxy_port = proxy_port
        self.resolver = Resolver(settings.hosts_file)
        # (host, protocol) a human allowed for the rest of this session -> the internal
        # addresses that human was shown for it (a grant covers no other internal address)
        self.session_allowed: dict[tuple[str, str], frozenset[IPAddress]] = {}

    def _approvals(self) -> UserApprovals:
        get = self.settings.approvals
        return get() if get is not None else UserApprovals.none()

    async def admit(self, connection: Connection) -> Admission:
        target = connection.target
        where = f"{target.host} port {target.port} ({target.protocol})"
        detail: dict[str, Any] = {
            "host": target.host,
            "port": target.port,
            "protocol": target.protocol,
            "spawn": connection.origin.spawn_id,
        }
        asked: dict[str, Any] = {}  # the human's answer, when one was asked

        async def refuse(reason: str, rule: str, source: str) -> Admission:
            pid = await _find_process(connection, self._proxy_port)
            self._record(
                {"decision": "deny", "source": source, "reason": reason, **asked,
                 "detail": {**detail, "rule": rule or None, **_process_fields(pid)}}
            )  # fmt: skip
            return Admission(reason=reason)

        broken = self._fail_closed_reason()
        if broken:
            return await refuse(
                f"execgate: network access to {where} denied: {broken}", "", "fail-closed"
            )
        judgement = judge_network(self._policy(), target.host, target.protocol)
        decision = judgement.decision
        rule, source = judgement.rule_locations(), "rule"
        if decision is None:
            decision = {
                "prompt": Decision.PROMPT,
                "deny": Decision.FORBIDDEN,
                "allow": Decision.ALLOW,
            }[self.settings.default]
            rule, source = f"network.default = {self.settings.default}", "none"
        if decision == Decision.FORBIDDEN:
            return await refuse(_forbidden_text(where, judgement, rule), rule, source)
        key = (target.host, target.protocol)
        try:
            addresses = await self.resolver.resolve(target.host, target.port)
        except ResolveError as exc:
            return await refuse(
                f"execgate: network access to {where}: cannot resolve: {exc}", rule, source
            )
        internal = [a for a in addresses if is_internal(a)]
        # A prompt already answered: "always" (a user-layer allow rule), or "for this session"
        # while the name points at no internal address that human was not shown (a name can
        # move: DNS rebinding).
        granted = key in self.session_allowed and set(internal) <= self.session_allowed[key]
        answered = decision == Decision.PROMPT and (
            granted or bool(judgement.matches and self._approvals().covers_network(judgement))
        )
        if answered and granted:
            source = "grant"
        # An allow rule that names this very host vouches for where it points (and so does a
        # human who saw the addresses).
        named = answered or (decision == Decision.ALLOW and bool(judgement.matches))
        if decision == Decision.PROMPT and not answered:
            pid = await _find_process(connection, self._proxy_port)
            approval = await self._question(connection, judgement, addresses, pid)
            by = _ANSWERED_BY.get(approval.by, approval.by)
            source = by
            asked = {"answer": approval.answer.value, "answered_by": by}
            if approval.answer == Answer.DENY:
                why = approval.reason or "declined by the user"
                return await refuse(f"execgate: network access to {where} denied: {why}",
                                    rule, source)  # fmt: skip
            if approval.answer in (Answer.ALLOW_SESSION, Answer.ALLOW_ALWAYS):
                seen = self.session_allowed.get(key, frozenset())
                self.session_allowed[key] = seen | frozenset(internal)
            if approval.answer == Answer.ALLOW_ALWAYS:
                asked["rule_line"] = network_allow_line(target.host, target.protocol)
                asked["rule_file"] = str(paths.user_default_rules_file())
            named = True
        if internal and not named:
            shown = ", ".join(map(str, internal))
            return await refuse(
                f"execgate: network access to {where} denied: it resolves to the internal "
                f"address {shown}; only a network_rule naming {target.host} with "
                '"allow" lets a connection reach it',
                rule,
                source,
            )
        self._record(
            {"decision": "allow", "source": source, **asked,
             "detail": {**detail, "rule": rule or None, "addresses": [str(a) for a in addresses]}}
        )  # fmt: skip
        return Admission(addresses=tuple(addresses))

    def connected(self, connection: Connection, address: IPAddress | None, error: str) -> None:
        if error:
            log.info("proxy: %s port %d: %s", connection.target.host, connection.target.port, error)

    async def _question(
        self,
        connection: Connection,
        judgement: NetworkJudgement,
        addresses: list[IPAddress],
        pid: int | None,
    ) -> Approval:
        target = connection.target
        exec_ = process_exec(pid)
        request = ApprovalRequest(
            id=f"n{next(_ids)}",
            exec=exec_,
            judgement=Judgement(Decision.PROMPT, list(exec_.argv), None),
            prefix=(),
            offer_always=self._approvals().can_record_network(judgement),
            network=NetworkTarget(
                host=target.host,
                port=target.port,
                protocol=target.protocol,
                addresses=tuple(str(a) for a in addresses),
                rules=tuple(rule_text(r) + f" at {rule_location(r)}" for r in judgement.deciding()),
                justification=judgement.justification(),
            ),
        )
        future = self._ask(request)
        try:
            return await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)
        finally:
            future.cancel()


def _forbidden_text(where: str, judgement: NetworkJudgement, rule: str) -> str:
    if not judgement.matches:
        return (
            f"execgate: network access to {where} denied: no network_rule names "
            f"{judgement.host} and {rule}; to allow it, add "
            f'network_rule(host="{judgement.host}", protocol="{judgement.protocol}", '
            'decision="allow") to your rules'
        )
    rules = "; ".join(f"{rule_text(r)} at {rule_location(r)}" for r in judgement.deciding())
    why = judgement.justification()
    return f"execgate: network access to {where} is forbidden by {rules}" + (
        f": {why}" if why else ""
    )


# -- which process made a connection -----------------------------------------------------


def _process_fields(pid: int | None) -> dict[str, Any]:
    if pid is None:
        return {}
    exec_ = process_exec(pid)
    argv, cut = bounded_argv(list(exec_.argv))
    return {
        "pid": pid,
        "program": exec_.realpath,
        "argv": argv,
        **({"argv_cut": cut} if cut else {}),
    }


async def _find_process(connection: Connection, proxy_port: int) -> int | None:
    return await anyio.to_thread.run_sync(
        find_process, connection.origin.pid, connection.peer_port, proxy_port
    )


def find_process(namespace_pid: int, peer_port: int, proxy_port: int) -> int | None:
    """The process holding the client end (local port ``peer_port``, remote ``proxy_port``) of
    a connection in the network namespace of ``namespace_pid``, searched among that process
    and its descendants. None when it cannot be found (it exited, or /proc says nothing)."""
    inode = _socket_inode(namespace_pid, peer_port, proxy_port)
    if inode is None:
        return None
    wanted = f"socket:[{inode}]"
    for pid in _descendants(namespace_pid):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == wanted:
                    return pid
            except OSError:
                continue
    return None


def _socket_inode(pid: int, local_port: int, remote_port: int) -> str | None:
    local, remote = f":{local_port:04X}", f":{remote_port:04X}"
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}", encoding="ascii") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[1].endswith(local) and fields[2].endswith(remote):
                return fields[9]
    return None


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    queue = [root]
    while queue and len(found) < 4096:
        pid = queue.pop()
        found.append(pid)
        queue.extend(children.get(pid, ()))
    return found


def process_exec(pid: int | None) -> GatedExec:
    """A process as the askers show it (the program it runs, its argv and cwd, from /proc)."""
    if pid is None:
        return GatedExec(
            path="(unknown process)",
            realpath="",
            dev=0,
            ino=0,
            argv=("(unknown process)",),
            cwd="/",
            interpreters=(),
            pid=0,
            ppid=0,
            via="network",
        )
    try:
        real = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        real = ""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = tuple(os.fsdecode(a) for a in f.read().split(b"\0")[:-1])
    except OSError:
        argv = ()
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = "/"
    return GatedExec(
        path=real or "(unknown program)",
        realpath=real,
        dev=0,
        ino=0,
        argv=argv or (real or "(unknown program)",),
        cwd=cwd,
        interpreters=(),
        pid=pid,
        ppid=0,
        via="network",
    )


def listener_pair() -> tuple[socket.socket, socket.socket]:
    """The report socket pair: the server's end and the launcher's (SOCK_SEQPACKET: one
    listener per message, whole or not at all)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    return ours, theirs
