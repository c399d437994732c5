"""SessionReserve: a session opened ahead of need, handed out only to a matching caller."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from execgate.gate import session as session_module
from execgate.gate.askers import DenyingAsker
from execgate.gate.escalation import PolicyEscalation
from execgate.gate.livepolicy import LivePolicy
from execgate.gate.session import (
    EscalationSession,
    SessionCaller,
    SessionConfig,
    SessionReserve,
)
from execgate.policy import load_rules_files
from execgate.sandbox import build_spec


def test_spare_is_reused_only_for_the_same_arguments(tmp_path: Path) -> None:
    rules = tmp_path / "r.rules"
    rules.write_text('prefix_rule(["git", "push"], "prompt")\n')
    policy = load_rules_files([rules])
    live = LivePolicy(policy, search_path="/usr/bin:/bin")
    escalation = PolicyEscalation(lambda: policy)
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()

    def alive(pid: int) -> bool:
        return (
            Path(f"/proc/{pid}").exists()
            and b"Z" not in Path(f"/proc/{pid}/stat").read_bytes().split()[2:3]
        )

    async def main() -> None:
        def config(where: Path) -> SessionConfig:
            return SessionConfig(
                live=live,
                escalation=escalation,
                sandbox=build_spec("workspace-write", cwd=where),
                base_env={"PATH": "/usr/bin:/bin"},
            )

        caller = SessionCaller(DenyingAsker("test"))
        async with SessionReserve().running() as reserve:
            await run(reserve, config, caller)

    async def spare_of(reserve: SessionReserve) -> EscalationSession:
        await asyncio.sleep(0)  # take() queues the refill for the next turn of the loop
        assert reserve._spares
        session = await reserve._spares[0].result()  # opened in the background
        assert session is not None
        return session

    async def run(
        reserve: SessionReserve, config: Callable[[Path], SessionConfig], caller: SessionCaller
    ) -> None:
        first = await reserve.take(config(one), caller)
        spare = await spare_of(reserve)
        second = await reserve.take(config(one), caller)
        assert second is spare
        # other arguments: the spare is not handed out, and it is closed
        spare = await spare_of(reserve)
        third = await reserve.take(config(two), caller)
        assert third is not spare
        while spare.dir.exists() or alive(spare.launcher.pid):  # closed in the background
            await asyncio.sleep(0.02)
        # a taken session works like an opened one
        devnull = os.open(os.devnull, os.O_RDWR)
        process = await third.start(
            ["/bin/sh", "-c", "exit 3"],
            cwd=str(two),
            env={},
            stdio={0: devnull, 1: devnull, 2: devnull},
        )
        assert os.waitstatus_to_exitcode(await process.wait()) == 3
        os.close(devnull)
        last_spare = await spare_of(reserve)
        for session in (first, second, third):
            await session.aclose()
        await reserve.aclose()
        assert not last_spare.dir.exists() and not alive(last_spare.launcher.pid)

    asyncio.run(main())


def test_spare_is_opened_once_the_session_handed_out_has_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening the next spares must not compete with the call that took the last one: they
    wait for that session's close (here: however long it runs), then open one after the other;
    a taker that cannot wait gets the oldest opened at once."""
    monkeypatch.setattr(session_module, "REFILL_AFTER", 3600.0)
    rules = tmp_path / "r.rules"
    rules.write_text('prefix_rule(["git", "push"], "prompt")\n')
    policy = load_rules_files([rules])
    config = SessionConfig(
        live=LivePolicy(policy, search_path="/usr/bin:/bin"),
        escalation=PolicyEscalation(lambda: policy),
        sandbox=build_spec("workspace-write", cwd=tmp_path),
        base_env={"PATH": "/usr/bin:/bin"},
    )
    caller = SessionCaller(DenyingAsker("test"))

    async def main() -> None:
        async with SessionReserve().running() as reserve:
            first = await reserve.take(config, caller)
            await asyncio.sleep(0)  # the refill is queued for the next turn of the loop
            assert len(reserve._spares) == SessionReserve.DEPTH == 2
            waiting, after_it = reserve._spares
            await asyncio.sleep(0.3)  # no spare is opened while `first` is open
            assert not waiting.ready and not after_it.ready
            await first.aclose()
            with anyio.fail_after(60):  # opened after the close, nobody asked for them
                await waiting.opened.wait()
                await after_it.opened.wait()
            second = await reserve.take(config, caller)
            assert second is waiting._session and second is not first
            assert after_it._session is not None and after_it._session is not second
            await asyncio.sleep(0)
            hurried = reserve._spares[-1]  # opens once `second` has closed
            assert not hurried.ready
            third = await reserve.take(config, caller)
            assert third is after_it._session  # the one ready
            with anyio.fail_after(60):  # wanted now: opened although `second` is open
                fourth = await reserve.take(config, caller)
            assert fourth is await hurried.result()
            for session in (second, third, fourth):
                await session.aclose()

    asyncio.run(main())


def test_overlapping_takers_with_other_sandboxes_each_get_their_own(tmp_path: Path) -> None:
    """Two front-end calls with different sandboxes that overlap (one waits for its spare while
    the other takes): whatever the interleaving, each taker gets a session opened with its own
    settings, never the other's (a spare refilled by one taker is not the other's)."""
    rules = tmp_path / "r.rules"
    rules.write_text('prefix_rule(["git", "push"], "prompt")\n')
    policy = load_rules_files([rules])
    live = LivePolicy(policy, search_path="/usr/bin:/bin")
    escalation = PolicyEscalation(lambda: policy)
    folders = [tmp_path / "one", tmp_path / "two"]
    for folder in folders:
        folder.mkdir()
    configs = [
        SessionConfig(
            live=live,
            escalation=escalation,
            sandbox=build_spec("workspace-write", cwd=folder),
            base_env={"PATH": "/usr/bin:/bin"},
        )
        for folder in folders
    ]
    caller = SessionCaller(DenyingAsker("test"))
    got: list[tuple[int, EscalationSession]] = []

    async def taker(reserve: SessionReserve, which: int, rounds: int) -> None:
        for _ in range(rounds):
            session = await reserve.take(configs[which], caller)
            got.append((which, session))
            await asyncio.sleep(0)  # let the other taker in between take and close
            await session.aclose()

    async def main() -> None:
        async with SessionReserve().running() as reserve, anyio.create_task_group() as tasks:
            tasks.start_soon(taker, reserve, 0, 6)
            tasks.start_soon(taker, reserve, 1, 6)

    asyncio.run(main())
    assert len(got) == 12
    for which, session in got:
        assert session.config.key == configs[which].key
        assert session.sandbox is not None
        assert folders[which] in session.sandbox.writable_roots
        assert folders[1 - which] not in session.sandbox.writable_roots
