"""SessionReserve: a session opened ahead of need, handed out only to a matching caller."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from execgate.gate.askers import DenyingAsker
from execgate.gate.escalation import PolicyEscalation
from execgate.gate.livepolicy import LivePolicy
from execgate.gate.session import SessionReserve
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
        reserve = SessionReserve()
        common = {"live": live, "escalation": escalation, "base_env": {"PATH": "/usr/bin:/bin"}}
        first = await reserve.take(sandbox=build_spec("workspace-write", cwd=one), **common)
        spare = await reserve._spare  # type: ignore[misc]  # opened in the background
        second = await reserve.take(sandbox=build_spec("workspace-write", cwd=one), **common)
        assert second is spare
        # other arguments: the spare is not handed out, and it is closed
        spare = await reserve._spare  # type: ignore[misc]
        third = await reserve.take(sandbox=build_spec("workspace-write", cwd=two), **common)
        assert third is not spare
        await asyncio.gather(*reserve._discarding)
        assert not spare.dir.exists() and not alive(spare.launcher.pid)
        # a taken session works like an opened one
        third.asker = DenyingAsker("test")
        devnull = os.open(os.devnull, os.O_RDWR)
        process = await third.start(
            ["/bin/sh", "-c", "exit 3"],
            cwd=str(two),
            env={},
            stdio={0: devnull, 1: devnull, 2: devnull},
        )
        assert os.waitstatus_to_exitcode(await process.wait()) == 3
        os.close(devnull)
        last_spare = await reserve._spare  # type: ignore[misc]
        for session in (first, second, third):
            await session.aclose()
        await reserve.aclose()
        assert not last_spare.dir.exists() and not alive(last_spare.launcher.pid)

    asyncio.run(main())
