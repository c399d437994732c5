"""OTLP export of the decisions, received by a real OTLP/HTTP receiver on loopback that
decodes the protobuf requests."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from .conftest import Gate

logs_pb2 = pytest.importorskip("opentelemetry.proto.collector.logs.v1.logs_service_pb2")
metrics_pb2 = pytest.importorskip("opentelemetry.proto.collector.metrics.v1.metrics_service_pb2")


class Receiver:
    def __init__(self) -> None:
        self.logs: list[dict[str, Any]] = []
        self.metrics: dict[tuple[str, ...], int] = {}
        self.headers: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.headers.append(self.headers.get("x-team", ""))
                if self.path == "/v1/logs":
                    receiver._logs(body)
                elif self.path == "/v1/metrics":
                    receiver._metrics(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _logs(self, body: bytes) -> None:
        request = logs_pb2.ExportLogsServiceRequest.FromString(body)
        for resource in request.resource_logs:
            service = {a.key: _value(a.value) for a in resource.resource.attributes}
            for scope in resource.scope_logs:
                for record in scope.log_records:
                    attributes = {a.key: _value(a.value) for a in record.attributes}
                    self.logs.append({"service": service, "event": record.event_name, **attributes})

    def _metrics(self, body: bytes) -> None:
        request = metrics_pb2.ExportMetricsServiceRequest.FromString(body)
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.sum.data_points:
                        attrs = {a.key: _value(a.value) for a in point.attributes}
                        key = (metric.name, attrs["execgate.decision"], attrs["execgate.source"])
                        self.metrics[key] = point.as_int


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.server.shutdown()


def _config(gate: Gate, text: str) -> None:
    (Path(gate.env["EXECGATE_HOME"]) / "config.toml").write_text(text)


def test_every_decision_reaches_an_otlp_receiver_redacted(gate: Gate, receiver: Receiver) -> None:
    _config(gate, f'[otel]\nendpoint = "{receiver.url}"\nheaders = {{ x-team = "blue" }}\n')
    gate.write_rules(
        'prefix_rule(["marker"], "forbidden", justification="no markers")\n'
        'prefix_rule(["other", "--never"], "forbidden")\n'
    )
    result = gate.run("marker secret-token; other secret-arg; exit 0")
    assert result.returncode == 0, result.stderr
    log = Path(gate.env["EXECGATE_HOME"]) / "log" / "decisions.jsonl"
    session = json.loads(log.read_text().splitlines()[0])["session"]
    events = receiver.logs
    assert [e["execgate.decision"] for e in events] == ["run", "deny", "run"]
    denied = events[1]
    assert denied["event"] == "execgate.exec_decision"
    assert denied["execgate.source"] == "rule"
    assert denied["execgate.session.id"] == session
    assert denied["execgate.front_end"] == "run"
    assert denied["process.executable.path"] == str(gate.bin / "marker")
    assert denied["execgate.rule"] == f"{gate.rules}:1"
    assert denied["service"]["service.name"] == "execgate"
    # arguments are redacted unless include_arguments
    assert "process.command_args" not in denied and denied["execgate.arguments_redacted"]
    assert not any("secret" in json.dumps(e) for e in events)
    assert receiver.metrics[("execgate.decisions", "deny", "rule")] == 1
    assert receiver.metrics[("execgate.decisions", "run", "none")] == 2
    assert set(receiver.headers) == {"blue"}


def test_arguments_are_exported_when_asked_and_a_dead_collector_blocks_nothing(
    gate: Gate, receiver: Receiver
) -> None:
    _config(gate, f'[otel]\nendpoint = "{receiver.url}"\ninclude_arguments = true\n')
    gate.run("marker one two")
    denied = next(e for e in receiver.logs if e["execgate.decision"] == "deny")
    assert denied["process.command_args"] == ["marker", "one", "two"]
    assert denied["process.working_directory"] == str(gate.root)
    # nobody listening: the session still works and says what was not delivered
    _config(gate, '[otel]\nendpoint = "http://127.0.0.1:9"\n')
    result = gate.run("other fine")
    assert result.returncode == 0 and b"fine" in result.stdout
    assert b"not delivered" in result.stderr or b"OTLP export failed" in result.stderr
