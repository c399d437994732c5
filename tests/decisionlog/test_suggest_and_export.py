"""`rules suggest` on a recorded log, and the OTLP export's bounded queue."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from execgate.decisionlog import otel
from execgate.decisionlog.suggest import suggest


def _answered(
    argv: list[str], answer: str, prefix: list[str], by: str = "terminal"
) -> dict[str, Any]:
    return {
        "kind": "exec",
        "program": f"/usr/bin/{argv[0]}",
        "argv": argv,
        "command": [f"/usr/bin/{argv[0]}", *argv[1:]],
        "answer": answer,
        "answered_by": by,
        "prefix": prefix,
    }


def test_suggest_the_narrowest_rules_that_never_allow_a_declined_command() -> None:
    log = [
        _answered(["cargo", "publish", "--dry-run", "a"], "once", ["cargo"]),
        _answered(["cargo", "publish", "--dry-run", "b"], "session", ["cargo"]),
        _answered(["cargo", "publish", "--dry-run", "c"], "once", ["cargo"], "elicitation"),
        _answered(["cargo", "publish"], "deny", ["cargo"]),  # never allow this one
        _answered(["make", "deploy", "x"], "once", ["make", "deploy"]),
        _answered(["make", "deploy", "y"], "once", ["make", "deploy"], "approvals"),
        # nobody answered these (timeouts, --on-prompt deny): not a person's choice
        _answered(["make", "clean"], "deny", ["make"], "unanswered"),
        # banned prefixes are never proposed, however often they were allowed
        *[_answered(["git", f"x{i}"], "once", ["git"]) for i in range(5)],
        *[_answered(["python3", "-c", f"print({i})"], "once", ["python3", "-c"]) for i in range(5)],
    ]
    found = suggest(log)
    assert [(s.prefix, s.saves) for s in found] == [
        (("cargo", "publish", "--dry-run"), 3),
        (("make", "deploy"), 2),  # not shorter than the rule that asked
    ]
    assert found[0].rules_text().splitlines() == [
        "# saves 3 questions, e.g. cargo publish --dry-run a",
        'prefix_rule(pattern=["cargo", "publish", "--dry-run"], decision="allow")',
    ]
    assert suggest(log, min_count=4) == []


def test_a_full_export_queue_drops_and_counts_instead_of_waiting(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("opentelemetry.sdk")
    monkeypatch.setattr(otel, "QUEUE_LIMIT", 4)
    settings = otel.OtelSettings("http/protobuf", "http://127.0.0.1:9", {}, False)
    export = otel.OtlpExport(settings)  # nobody listens on port 9
    with caplog.at_level(logging.WARNING, logger="execgate.otel"):
        export.submit([{"decision": "run", "time": 1.0} for _ in range(5000)])
        assert export.dropped >= 5000 - 4 - otel.BATCH_LIMIT * 2
        export.close()
    assert "dropping decision events" in caplog.text
    assert f"{export.dropped} decision events dropped (queue full)" in caplog.text
