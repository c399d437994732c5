"""The policy a front end gates with, and what the interposer needs from it.

Built once per policy load and shared by every session of the front end (an MCP server opens a
session per tool call): the policy, its snapshot for the interposer's fast path, the alias
table and the content index. A reload swaps them all at once and tells every open session to
publish the new snapshot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from execgate.config import Config
from execgate.gate.approvals import UserApprovals
from execgate.gate.content import NO_CONTENTS, ContentIndex
from execgate.gate.escalation import PolicyEscalation
from execgate.gate.folderwatch import FolderWatch
from execgate.gate.skills import SkillScripts
from execgate.gate.snapshot import build_snapshot, folders_to_watch
from execgate.gate.standins import rule_named_paths
from execgate.policy import LoadedPolicy, Policy, load_chosen_policy, load_layered_policy

Listener = Callable[[bytes], None]


class LivePolicy:
    """The policy and what follows from it. File identities follow the files at their paths:
    the folders of rule-named files are watched, and a change there rebuilds the snapshot and
    alias table (:meth:`current_aliases` before every judgement; the event loop's reader, once
    :meth:`watch_in` was called, for the snapshot in between)."""

    def __init__(
        self,
        policy: Policy,
        *,
        search_path: str,
        fail_closed_reason: str | None = None,
        ask_always: bool = False,
        skills: SkillScripts | None = None,
    ) -> None:
        self.search_path = search_path
        self.ask_always = ask_always
        self.skills = skills
        self._listeners: list[Listener] = []
        # Told before anything changes (policy, aliases, contents, skill folders): standing
        # authorizations go before anything is decided under the new state.
        self._revokers: list[Callable[[], None]] = []
        self._watch = FolderWatch()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.aliases: dict[tuple[int, int], tuple[str, ...]] = {}
        self.contents = NO_CONTENTS
        self._set(policy, fail_closed_reason)

    def _set(self, policy: Policy, fail_closed_reason: str | None) -> None:
        self.revoke_standing()
        self.policy = policy
        self.fail_closed_reason = fail_closed_reason
        host_executables = dict(policy.host_executables)
        # Watched before a build reads them, so a change during the build is queued: the
        # folders known beforehand, then those a build found (through a link), which may have
        # changed before they were watched: unless what was found there is still there, build
        # again (hence a few rounds).
        first = set(self.skills.watch_folders()) if self.skills else set()
        first |= folders_to_watch(
            policy.first_tokens(), host_executables, search_path=self.search_path
        )
        self._watch.watch(first)
        for _ in range(4):
            # Skill scripts and the interpreters that may be given one must reach the server.
            skills = self.skills.snapshot_tokens() if self.skills else []
            snapshot = build_snapshot(
                [*policy.first_tokens(), *skills], host_executables, search_path=self.search_path
            )
            if self.skills:
                snapshot.folders |= self.skills.watch_folders()
            added = self._watch.watch(snapshot.folders)
            if not added or snapshot.still_holds(added):
                break
        if snapshot.aliases != self.aliases:  # else keep the judgements made with them cached
            self.aliases = snapshot.aliases
        self._rule_named: list[str] | None = None  # found when a sandboxed session asks
        self.contents = snapshot.contents
        # What the snapshot was built from (a start-up plan's inputs, gate/runplan.py): the
        # folders looked in, found or not, and the rule-named files found there.
        self._looked_in = sorted(first | snapshot.folders)
        found = snapshot.contents.by_size.values()
        self._found = sorted({rule_file.path for files in found for rule_file in files})
        # Fail-closed requirements deny everything: every exec must reach the server.
        self.snapshot = snapshot.encode(ask_always=self.ask_always or bool(fail_closed_reason))

    def planned_inputs(self) -> list[Path]:
        """The folders and files the snapshot was built from (missing folders included): a
        start-up plan's inputs (gate/runplan.py)."""
        skills = list(self.skills.dirs) if self.skills else []  # looked for, found or not
        return [*skills, *(Path(p) for p in (*self._looked_in, *self._found))]

    @property
    def rule_named(self) -> list[str]:
        """What sandboxes cover with stand-ins (the kernel exec backstop, gate/standins.py):
        the files of the alias table, found again when it was rebuilt."""
        if self._rule_named is None:
            self._rule_named = rule_named_paths(
                self.aliases, self.policy.host_executables, search_path=self.search_path
            )
        return self._rule_named

    def replace(self, policy: Policy, fail_closed_reason: str | None = None) -> None:
        self._set(policy, fail_closed_reason)
        self._publish()

    def _publish(self) -> None:
        for listener in list(self._listeners):
            listener(self.snapshot)

    def current_aliases(self) -> dict[tuple[int, int], tuple[str, ...]]:
        """The alias table as the files are now: the kernel queued every change made before
        the exec being judged, so draining the queue first leaves no window."""
        # Revoked before the change is read: a launcher that sees no change queued in the
        # watch any more finds the revocation on its control channel (docs/protocol.md §4).
        if self._watch.pending():
            self.revoke_standing()
        if self._watch.drain():
            published = self.snapshot
            self._set(self.policy, self.fail_closed_reason)
            # Clients stop caching a snapshot replaced too often (protocol §6): only a change.
            if self.snapshot != published:
                self._publish()
        return self.aliases

    def current_contents(self) -> ContentIndex:
        """The content index of the rule-named files as they are now (see
        :meth:`current_aliases`)."""
        self.current_aliases()
        return self.contents

    def watch_in(self, loop: asyncio.AbstractEventLoop) -> None:
        """Republish the snapshot as soon as a watched folder changes (idempotent)."""
        fd = self._watch.fileno()
        if self._loop is not loop and fd is not None:  # a closed loop took its reader along
            self._loop = loop
            loop.add_reader(fd, self.current_aliases)

    def watch_fd(self) -> int | None:
        """The folder watch's descriptor (inotify): a launcher takes a standing claim only
        while no change is queued there (docs/protocol.md §4)."""
        return self._watch.fileno()

    def close(self) -> None:
        """Stop watching the folders (a policy built only to be read, e.g. a plan's check)."""
        self._watch.close()

    def revoke_standing(self) -> None:
        for revoke in list(self._revokers):
            revoke()

    def on_change(self, revoke: Callable[[], None]) -> Callable[[], None]:
        """Call ``revoke`` before the policy or what follows from it changes."""
        self._revokers.append(revoke)
        return lambda: self._revokers.remove(revoke)

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)


@dataclass(frozen=True)
class PolicySource:
    """Where a front end's policy comes from: exactly these rules files, or every layer that
    applies to ``cwd``."""

    rules: tuple[Path, ...]
    cwd: Path
    config: Config

    def load(self) -> LoadedPolicy:
        """Load it (``PolicyError`` names file:line:col when a file does not load)."""
        if self.rules:  # the admin's requirements still apply on top
            return load_chosen_policy(self.rules)
        return load_layered_policy(self.cwd, config=self.config)


class GatePolicy:
    """What a front end (``execgate run``, ``execgate mcp``) gates with: the live policy, the
    user's lasting approvals read against it, and the :class:`PolicyEscalation` built on both.
    :meth:`apply` swaps in a reload; sessions already open see it at once."""

    def __init__(
        self,
        load: LoadedPolicy,
        *,
        search_path: str,
        ask_always: bool = False,
        on_prompt_deny: bool = False,
        skills: SkillScripts | None = None,
    ) -> None:
        self.live = LivePolicy(
            load.policy,
            search_path=search_path,
            fail_closed_reason=load.fail_closed_reason,
            ask_always=ask_always,
            skills=skills,
        )
        self.approvals = _approvals(load)
        self.escalation = PolicyEscalation(
            lambda: self.live.policy,
            # As of the request's current_contents() (each caller drains the folder watch
            # right before judging: once per exec is enough).
            aliases=lambda: self.live.aliases,
            contents=lambda: self.live.contents,
            user_approves=lambda judgement: self.approvals.covers(judgement),
            can_record_always=lambda judgement: self.approvals.can_record(judgement),
            on_prompt_deny=on_prompt_deny,
            skill_script=skills.script_of if skills else lambda _: None,
        )

    def apply(self, load: LoadedPolicy) -> None:
        self.live.replace(load.policy, load.fail_closed_reason)
        self.approvals = _approvals(load)


def _approvals(load: LoadedPolicy) -> UserApprovals:
    return UserApprovals(load) if load.layered else UserApprovals.none()
