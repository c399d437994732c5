"""The policy a front end gates with, and what the interposer needs from it.

Built once per policy load and shared by every session of the front end (an MCP server opens a
session per tool call): the policy, its snapshot for the interposer's fast path, and the alias
table. A reload swaps all three at once and tells every open session to publish the new
snapshot.
"""

from __future__ import annotations

from collections.abc import Callable

from execgate.gate.snapshot import build_snapshot
from execgate.policy import Policy

Listener = Callable[[bytes], None]


class LivePolicy:
    def __init__(
        self,
        policy: Policy,
        *,
        search_path: str,
        fail_closed_reason: str | None = None,
        ask_always: bool = False,
    ) -> None:
        self.search_path = search_path
        self.ask_always = ask_always
        self._listeners: list[Listener] = []
        self._set(policy, fail_closed_reason)

    def _set(self, policy: Policy, fail_closed_reason: str | None) -> None:
        snapshot = build_snapshot(
            policy.first_tokens(), dict(policy.host_executables), search_path=self.search_path
        )
        self.policy = policy
        self.fail_closed_reason = fail_closed_reason
        self.aliases = snapshot.aliases
        # Fail-closed requirements deny everything: every exec must reach the server.
        self.snapshot = snapshot.encode(ask_always=self.ask_always or bool(fail_closed_reason))

    def replace(self, policy: Policy, fail_closed_reason: str | None = None) -> None:
        self._set(policy, fail_closed_reason)
        for listener in list(self._listeners):
            listener(self.snapshot)

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)
