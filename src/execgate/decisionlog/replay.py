"""``execgate log replay``: what another policy would have decided about past execs.

Each recorded exec's judged command is evaluated again under the other policy; the report
counts the changes by kind (was prompted → would be allowed, was run → would be denied, …)
with the most frequent commands of each, so a policy change can be judged before it is made.
Refusals the gate made without judging (``fail-closed``) are not policy's: they are skipped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from execgate.decisionlog.query import exec_command
from execgate.policy import Policy

#: A policy outcome in words: (was …, would be …).
_WORDS = {
    None: ("run (no rule)", "run (no rule)"),
    "allow": ("allowed", "allowed"),
    "prompt": ("prompted", "prompted"),
    "forbidden": ("denied", "denied"),
}


@dataclass
class Replay:
    replayed: int = 0
    skipped: int = 0
    unchanged: int = 0
    # (was, would be) -> command line -> count
    changes: dict[tuple[str | None, str | None], Counter[tuple[str, ...]]] = field(
        default_factory=dict
    )

    def lines(self, examples: int = 3) -> list[str]:
        from execgate.visible import command_line

        out = [f"replayed {self.replayed} decisions: {self.unchanged} unchanged"]
        if self.skipped:
            out[0] += f", {self.skipped} skipped (refused without a policy decision)"
        ordered = sorted(self.changes.items(), key=lambda item: -sum(item[1].values()))
        for (was, would), commands in ordered:
            out.append(
                f"  was {_WORDS[was][0]} → would be {_WORDS[would][1]}: {sum(commands.values())}"
            )
            for command, count in commands.most_common(examples):
                out.append(f"      {count:>5}x  {command_line(command, 200)}")
        if not self.changes:
            out.append("  nothing would change")
        return out


def replay(records: Iterable[dict[str, Any]], policy: Policy) -> Replay:
    result = Replay()
    for record in records:
        if record.get("kind", "exec") != "exec":
            continue
        if record.get("source") == "fail-closed":
            result.skipped += 1
            continue
        result.replayed += 1
        was = record.get("policy")
        command = exec_command(record)
        evaluation = policy.evaluate(
            command, cwd=str(record.get("cwd") or "/"), resolve_host_executables=True
        )
        would = evaluation.decision.value if evaluation.decision else None
        if would == was:
            result.unchanged += 1
            continue
        shown = tuple(str(w) for w in record.get("argv", [])) or tuple(command)
        result.changes.setdefault((was, would), Counter())[shown] += 1
    return result
