"""Fast unit tests of the MCP front end's pure parts: the stopwatch, output capture, argument
parsing and the approval registry."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from execgate.gate.escalation import Answer, ApprovalRequest, PolicyEscalation, Verdict
from execgate.gate.session import describe_exec
from execgate.gate.skills import interpreter_name, script_argument
from execgate.mcp_front.elicitation import ApprovalError, ApprovalRegistry, CallInfo, NoElicitation
from execgate.mcp_front.stopwatch import Stopwatch
from execgate.mcp_front.tool import OutputCapture, ToolArgumentError, parse_arguments
from execgate.mcp_front.unified import ProcessStore
from execgate.policy import load_rules_files


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- Stopwatch -------------------------------------------------------------------------------


def test_stopwatch_counts_running_time_only() -> None:
    clock = FakeClock()
    watch = Stopwatch(10.0, clock=clock)
    clock.now += 3
    assert watch.elapsed() == 3 and watch.remaining() == 7
    watch.pause()
    clock.now += 100
    assert watch.elapsed() == 3 and watch.remaining() == math.inf
    watch.resume()
    clock.now += 2
    assert watch.elapsed() == 5 and watch.remaining() == 5
    watch.resume()  # one resume too many: nothing happens
    assert not watch.paused and watch.elapsed() == 5


def test_overlapping_pauses_resume_only_when_the_last_is_answered() -> None:
    clock = FakeClock()
    watch = Stopwatch(10.0, clock=clock)
    clock.now += 1
    watch.pause()  # question A
    clock.now += 1
    watch.pause()  # question B, while A is open
    clock.now += 5
    watch.resume()  # A answered: B still open, the watch must stand still
    assert watch.paused
    clock.now += 50
    assert watch.elapsed() == 1 and watch.remaining() == math.inf
    watch.resume()  # B answered at a different time
    assert not watch.paused
    clock.now += 4
    assert watch.elapsed() == 5 and watch.remaining() == 5


def test_stopwatch_moves_the_deadline_of_its_scope() -> None:
    async def main() -> None:
        watch = Stopwatch(0.3)
        with anyio.CancelScope() as scope:
            watch.attach(scope)
            assert scope.deadline < math.inf
            watch.pause()
            watch.pause()
            assert scope.deadline == math.inf
            await anyio.sleep(0.5)  # paused: past the limit, not cancelled
            watch.resume()
            assert scope.deadline == math.inf  # still one question open
            await anyio.sleep(0.1)
            watch.resume()
            assert scope.deadline <= anyio.current_time() + 0.3
            await anyio.sleep(5)
        assert scope.cancelled_caught
        assert 0.3 <= watch.elapsed() < 2.0

    asyncio.run(main())


def test_stopwatch_restart_counts_from_now() -> None:
    clock = FakeClock()
    watch = Stopwatch(1.0, clock=clock)
    clock.now += 5
    watch.restart(2.0)
    clock.now += 1.5
    assert watch.remaining() == 0.5


# -- OutputCapture ---------------------------------------------------------------------------


def test_output_capture_keeps_head_and_tail_with_a_marker() -> None:
    capture = OutputCapture(cap=100)
    capture.feed(b"H" * 60)
    for _ in range(10):
        capture.feed(b"m" * 30)
    capture.feed(b"T" * 50)
    text = capture.text()
    assert text.startswith("H" * 50)
    assert text.endswith("T" * 50)
    assert capture.truncated_bytes == 60 + 300 + 50 - 100
    assert f"{capture.truncated_bytes} bytes of output cut here" in text


def test_output_capture_never_splits_a_character() -> None:
    capture = OutputCapture(cap=10)
    capture.feed("aaaa€".encode() + b"x" * 20 + "€bb".encode())
    text = capture.text()
    assert "\ufffd" not in text
    assert text.startswith("aaaa") and text.endswith("bb")


def test_output_capture_below_the_cap_is_exact() -> None:
    capture = OutputCapture(cap=100)
    capture.feed(b"hello\n")
    assert capture.text() == "hello\n" and capture.truncated_bytes == 0


# -- parse_arguments -------------------------------------------------------------------------


def test_shell_arguments(tmp_path: Path) -> None:
    args = parse_arguments({"command": "ls", "workdir": str(tmp_path)}, default_login=False)
    assert (args.command, args.workdir, args.timeout_ms, args.login) == (
        "ls",
        str(tmp_path),
        10_000,
        False,
    )
    args = parse_arguments(
        {"command": "ls", "workdir": str(tmp_path), "timeout_ms": 5.0, "login": True},
        default_login=False,
    )
    assert args.timeout_ms == 5 and args.login


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({}, "`command` is required"),
        ({"command": 1, "workdir": "/"}, "`command` must be a string"),
        ({"command": "ls"}, "`workdir` is required"),
        ({"command": "ls", "workdir": "rel"}, "absolute path"),
        ({"command": "ls", "workdir": "/nonexistent-dir-xyz"}, "does not exist"),
        ({"command": "ls", "workdir": "/", "timeout_ms": 0}, "at least 1"),
        ({"command": "ls", "workdir": "/", "timeout_ms": 1.5}, "whole number"),
        ({"command": "ls", "workdir": "/", "timeout_ms": True}, "whole number"),
        ({"command": "ls", "workdir": "/", "login": "yes"}, "`login` must be"),
    ],
)
def test_shell_argument_errors(arguments: dict[str, object], says: str) -> None:
    with pytest.raises(ToolArgumentError, match=says):
        parse_arguments(arguments, default_login=True)


# -- ApprovalRegistry ------------------------------------------------------------------------


def _question(tmp_path: Path) -> ApprovalRequest:
    rules = tmp_path / "t.rules"
    rules.write_text('prefix_rule(["true"], "prompt", justification="ask")\n')
    policy = load_rules_files([rules])
    action = PolicyEscalation(lambda: policy).decide(
        describe_exec("/bin/true", ["true"], cwd=str(tmp_path), via="session"), confined=True
    )
    assert action.verdict == Verdict.ASK and action.approval is not None
    return action.approval


def test_registry_answers_by_id_and_times_out(tmp_path: Path) -> None:
    request = _question(tmp_path)
    call = CallInfo(1, "true", str(tmp_path))

    async def main() -> None:
        registry = ApprovalRegistry(0.3, prefix="t")
        async with anyio.create_task_group() as tasks:
            answers: list[Answer] = []

            async def ask() -> None:
                answers.append((await registry.ask(request, call, NoElicitation())).answer)

            tasks.start_soon(ask)
            while not registry.pending():
                await anyio.sleep(0.01)
            (question,) = registry.pending()
            assert question.id == "t.1"
            with pytest.raises(ApprovalError):
                registry.answer("t.99", Answer.ALLOW_ONCE, None, by="test")
            registry.answer(question.id, Answer.ALLOW_SESSION, None, by="test")
            with pytest.raises(ApprovalError):  # answered already
                registry.answer(question.id, Answer.DENY, None, by="test")
        assert answers == [Answer.ALLOW_SESSION] and not registry.pending()
        # nobody answers: a denial after the timeout, and the question is gone
        approval = await registry.ask(request, call, NoElicitation())
        assert approval.answer == Answer.DENY and not registry.pending()

    asyncio.run(main())


# -- skill scripts: which argument an interpreter runs ------------------------------------------


def test_script_argument_of_interpreters() -> None:
    assert script_argument(["bash", "-x", "s.sh", "a"]) == "s.sh"
    assert script_argument(["bash", "-o", "pipefail", "s.sh"]) == "s.sh"
    assert script_argument(["bash", "--", "-s.sh"]) == "-s.sh"
    assert script_argument(["bash", "-c", "s.sh"]) is None
    assert script_argument(["bash", "-lc", "s.sh"]) is None
    assert script_argument(["python3", "-m", "mod"]) is None
    assert script_argument(["python3", "-u", "tool.py"]) == "tool.py"
    assert interpreter_name("/usr/bin/python3.11") == "python"


# -- the unified process store's choice of whom to end -------------------------------------------


@dataclass
class FakeProcess:
    id: int
    last_used: float
    exited: bool = False
    busy: int = 0


def test_store_evicts_lru_exited_then_lru_live_never_protected_or_busy() -> None:
    store = ProcessStore(limit=6, protected=2)
    procs = [FakeProcess(i, last_used=float(i)) for i in range(6)]
    for p in procs:
        store._processes[p.id] = p  # type: ignore[assignment]
    assert store.victim() is procs[0]  # least recently used
    procs[3].exited = True
    assert store.victim() is procs[3]  # an exited one first
    procs[5].exited = True  # but not one of the 2 most recently used
    procs[3].exited = False
    assert store.victim() is procs[0]
    procs[0].busy = 1  # a write_stdin in progress: never
    assert store.victim() is procs[1]
    for p in procs[:4]:
        p.busy = 1
    assert store.victim() is None  # only protected or busy ones left
