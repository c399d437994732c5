"""Reading the decision log back: which records, and how one reads on a terminal."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from execgate.decisionlog.chain import parse_line, read_lines, rotated_path
from execgate.errors import ExecgateError
from execgate.visible import command_line, visible

#: Who answered a prompt, when it was a person.
HUMANS = frozenset({"terminal", "elicitation", "approvals"})

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """``1h``, ``30m``, ``2d``, ``90s``, ``1w`` ago, or an ISO date/time: a UNIX time."""
    now = time.time() if now is None else now
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if match:
        return now - float(match.group(1)) * _UNITS[match.group(2)]
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise ExecgateError(
            f"--since {text}: give a duration (30m, 1h, 2d) or a date (2026-11-30T21:00)",
            exit_status=2,
        ) from None


@dataclass(frozen=True)
class Filter:
    since: float | None = None
    denied: bool = False
    prompts: bool = False
    session: str | None = None
    grep: re.Pattern[str] | None = None

    def __call__(self, record: dict[str, Any]) -> bool:
        if self.since is not None and record_time(record) < self.since:
            return False
        if self.denied and record.get("decision") != "deny":
            return False
        if self.prompts and "answer" not in record:
            return False
        if self.session and not str(record.get("session", "")).startswith(self.session):
            return False
        return not (self.grep and not self.grep.search(render(record, colour=False)))


def records(
    path: Path, keep: Callable[[dict[str, Any]], bool] = lambda _: True
) -> Iterator[dict[str, Any]]:
    """The log's records (oldest first) that ``keep`` keeps; unreadable lines are skipped
    (``execgate log verify`` names them)."""
    for line in read_lines(path):
        if line.record is not None and keep(line.record):
            yield line.record


def exec_command(record: dict[str, Any]) -> list[str]:
    """The command policy judged for a record (the program, then the arguments)."""
    command = record.get("command")
    if isinstance(command, list) and command:
        return [str(word) for word in command]
    words = record.get("argv")
    argv = [str(word) for word in words] if isinstance(words, list) else []
    return [str(record.get("program", "")), *argv[1:]]


# -- one line a decision ----------------------------------------------------------------------

_COLOURS = {"deny": "31", "escalate": "33", "run": "32"}


def record_time(record: dict[str, Any]) -> float:
    """A record's time; 0 when it is not a usable number (a line written by hand)."""
    value = record.get("time", 0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value) if 0 <= value < 1e11 else 0.0


def render(record: dict[str, Any], *, colour: bool) -> str:
    """``TIME  DECISION  FRONT:SESSION  COMMAND  [answer by who]  — reason (rule)``.

    Every field is shown visible: with the sandbox off a gated process can write the log
    itself, so no field of a record may reach the terminal raw."""
    when = datetime.fromtimestamp(record_time(record)).strftime("%Y-%m-%d %H:%M:%S")
    decision = visible(str(record.get("decision", "?")), 20)
    argv = record.get("argv", [])
    argv = ([str(w) for w in argv] if isinstance(argv, list) else []) or exec_command(record)
    call = f".{visible(str(record['call']), 20)}" if record.get("call") is not None else ""
    front = visible(str(record.get("front", "?")), 20)
    who = f"{front}:{visible(str(record.get('session', ''))[:8])}{call}"
    if record.get("kind") == "permission":
        detail = json.dumps(record.get("detail", {}), ensure_ascii=True, separators=(",", ":"))
        what = f"permission {visible(str(record.get('permission', '?')))} {visible(detail, 300)}"
    else:
        what = command_line(argv, 300)
    parts = [when, f"{decision:8}", who, what]
    if "answer" in record:
        answer = visible(str(record["answer"]), 20)
        parts.append(f"[{answer} by {visible(str(record.get('answered_by', '?')), 40)}]")
    elif record.get("source") in ("fail-closed", "grant"):
        parts.append(f"[{record['source']}]")
    why = record.get("reason") or (
        f"rule {record['rule']}" if record.get("rule") and decision != "run" else ""
    )
    line = "  ".join(parts) + (f"  — {visible(str(why), 300)}" if why else "")
    if colour:
        code = _COLOURS.get(decision, "0")
        if "answer" in record:
            code += ";1"
        line = f"\x1b[{code}m{line}\x1b[0m"
    return line


def follow(
    path: Path, keep: Callable[[dict[str, Any]], bool], interval: float = 0.5
) -> Iterator[dict[str, Any]]:
    """Records written from now on, across rotation, until interrupted."""
    ino, pos = _where(path)
    while True:
        time.sleep(interval)
        now_ino, _ = _where(path)
        if now_ino != ino:  # rotated: what was left of our file is now the newest rotated one
            older = rotated_path(path, 1)
            if _where(older)[0] == ino:
                yield from _complete_lines(older, pos, keep)[0]
            ino, pos = now_ino, 0
        fresh, pos = _complete_lines(path, pos, keep)
        yield from fresh


def _where(path: Path) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return -1, 0
    return st.st_ino, st.st_size


def _complete_lines(
    path: Path, pos: int, keep: Callable[[dict[str, Any]], bool]
) -> tuple[list[dict[str, Any]], int]:
    try:
        with open(path, "rb") as f:
            f.seek(pos)
            data = f.read()
    except OSError:
        return [], pos
    end = data.rfind(b"\n") + 1  # a line still being written waits for the next round
    found = []
    for raw in data[:end].splitlines():
        record = parse_line(raw)
        if record is not None and keep(record):
            found.append(record)
    return found, pos + end
