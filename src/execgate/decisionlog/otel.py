"""Optional OTLP export of the decisions (``pip install 'execgate[otel]'``).

One OTLP log event per decision (``execgate.exec_decision``) and a counter per decision
(``execgate.decisions``, by decision and source), in the shape agents already export
(docs/threat-model.md, shared/reference/codex-compat.md §5): a ``source``, the session and call
ids, standard attribute names (``process.pid``, ``process.executable.path``,
``process.command_args``), arguments redacted unless ``include_arguments``.

Export never holds up an exec: records go into a bounded queue (full: dropped and counted);
a worker thread imports the SDK (start-up never pays for it), batches and exports. What was
dropped or failed is logged when the export closes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import queue
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from execgate import __version__
from execgate.config import OtelConfig
from execgate.errors import ExecgateError

log = logging.getLogger("execgate.otel")

EVENT_NAME = "execgate.exec_decision"
COUNTER_NAME = "execgate.decisions"
QUEUE_LIMIT = 2048
BATCH_LIMIT = 256
#: How long closing waits for the last batch to leave (at exit; never during an exec), and
#: how long one export may take (retries included).
CLOSE_TIMEOUT = 3.0
EXPORT_TIMEOUT = 2.0

_HTTP_MODULE = "opentelemetry.exporter.otlp.proto.http"
_GRPC_MODULE = "opentelemetry.exporter.otlp.proto.grpc"


@dataclass(frozen=True)
class OtelSettings:
    protocol: str  # "http/protobuf" or "grpc"
    endpoint: str | None  # base URL (config.toml); None: the SDK reads OTEL_EXPORTER_OTLP_*
    headers: Mapping[str, str]
    include_arguments: bool


def settings_from(config: OtelConfig, env: Mapping[str, str]) -> OtelSettings | None:
    """What to export with, from ``[otel]`` and the standard variables; None when export is
    not configured (no endpoint anywhere) or ``OTEL_SDK_DISABLED`` is true."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    configured = (
        config.endpoint
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT")
    )
    if not configured:
        return None
    protocol = (
        config.protocol
        or env.get("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    if protocol not in ("http/protobuf", "grpc"):
        raise ExecgateError(f"OTLP protocol {protocol!r} is not supported (http/protobuf, grpc)")
    return OtelSettings(
        protocol=protocol,
        endpoint=config.endpoint,
        headers=dict(config.headers),
        include_arguments=config.include_arguments,
    )


def start_export(settings: OtelSettings) -> OtlpExport:
    """Start exporting; a missing SDK is refused now, in one sentence (the import itself
    happens on the worker thread)."""
    module = _GRPC_MODULE if settings.protocol == "grpc" else _HTTP_MODULE
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        extra = (
            "pip install opentelemetry-exporter-otlp-proto-grpc"
            if settings.protocol == "grpc"
            else "pip install 'execgate[otel]'"
        )
        raise ExecgateError(f"OTLP export is configured but the SDK is not installed ({extra})")
    return OtlpExport(settings)


def event_attributes(record: Mapping[str, Any], *, include_arguments: bool) -> dict[str, Any]:
    """A decision record as OTLP attributes (standard names where they exist)."""
    attributes: dict[str, Any] = {
        "event.name": EVENT_NAME,
        "execgate.session.id": record.get("session", ""),
        "execgate.front_end": record.get("front", ""),
        "execgate.decision": record.get("decision", ""),
        "execgate.source": record.get("source", ""),
        "process.pid": record.get("pid", 0),
        "process.parent_pid": record.get("ppid", 0),
        "process.executable.path": record.get("program", ""),
    }
    optional = {
        "execgate.call.id": record.get("call"),
        "execgate.kind": record.get("kind"),
        "execgate.policy_decision": record.get("policy"),
        "execgate.rule": record.get("rule"),
        "execgate.justification": record.get("justification"),
        "execgate.answer": record.get("answer"),
        "execgate.answered_by": record.get("answered_by"),
        "execgate.sandbox": record.get("sandbox"),
    }
    if include_arguments:
        optional |= {
            "process.command_args": record.get("argv"),
            "process.working_directory": record.get("cwd"),
            "execgate.reason": record.get("reason"),
        }
    else:
        attributes["execgate.arguments_redacted"] = True
    attributes |= {k: v for k, v in optional.items() if v not in (None, "", [])}
    return attributes


class OtlpExport:
    """The bounded queue and the worker thread that drains it into the OTLP exporters."""

    def __init__(self, settings: OtelSettings) -> None:
        self.settings = settings
        self.dropped = 0
        self.failed = 0
        self.sent = 0
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUE_LIMIT)
        self._thread = threading.Thread(target=self._work, name="execgate-otlp", daemon=True)
        self._thread.start()

    def submit(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            try:
                self._queue.put_nowait(record)
            except queue.Full:
                if self.dropped == 0:
                    log.warning("OTLP export cannot keep up: dropping decision events")
                self.dropped += 1

    def close(self) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=CLOSE_TIMEOUT)
        self._thread.join(CLOSE_TIMEOUT)
        if self.dropped or self.failed:
            log.warning(
                "OTLP export: %d decision events dropped (queue full), %d not delivered",
                self.dropped,
                self.failed,
            )

    # -- the worker thread ---------------------------------------------------------------------

    def _work(self) -> None:
        try:
            sink = _Sink(self.settings)
        except Exception as exc:  # the SDK did not load or rejected the settings
            log.warning("OTLP export is off: %s", exc)
            self._discard()
            return
        try:
            while True:
                first = self._queue.get()
                batch = [] if first is None else [first]
                stop = first is None
                while not stop and len(batch) < BATCH_LIMIT:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        stop = True
                    else:
                        batch.append(more)
                if batch:
                    try:
                        sink.export(batch)
                        self.sent += len(batch)
                    except Exception as exc:
                        if not self.failed:
                            log.warning("OTLP export failed: %s", exc)
                        self.failed += len(batch)
                if stop:
                    break
        finally:
            sink.shutdown()

    def _discard(self) -> None:
        while self._queue.get() is not None:
            self.failed += 1


class _Sink:
    """The SDK's logger and meter, imported here (on the worker thread)."""

    def __init__(self, settings: OtelSettings) -> None:
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import (
            InMemoryLogRecordExporter,
            SimpleLogRecordProcessor,
        )
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        self._exporter, metric_exporter = _exporters(settings)
        self._include = settings.include_arguments
        resource = Resource.create(
            {
                "service.name": os.environ.get("OTEL_SERVICE_NAME", "execgate"),
                "service.version": __version__,
            }
        )
        # Our queue batches: the SDK's processor only collects what one batch emits.
        self._collected = InMemoryLogRecordExporter()  # type: ignore[no-untyped-call,unused-ignore]
        self._logs = LoggerProvider(resource=resource)
        self._logs.add_log_record_processor(SimpleLogRecordProcessor(self._collected))
        self._logger = self._logs.get_logger("execgate", __version__)
        self._meters = MeterProvider(
            resource=resource, metric_readers=[PeriodicExportingMetricReader(metric_exporter)]
        )
        self._counter = self._meters.get_meter("execgate", __version__).create_counter(
            COUNTER_NAME, unit="{decision}", description="exec decisions by decision and source"
        )

    def export(self, records: Sequence[Mapping[str, Any]]) -> None:
        from opentelemetry._logs import SeverityNumber

        for record in records:
            denied = record.get("decision") == "deny"
            self._logger.emit(
                timestamp=int(float(record.get("time", 0)) * 1e9),
                severity_number=SeverityNumber.WARN if denied else SeverityNumber.INFO,
                severity_text="WARN" if denied else "INFO",
                body=EVENT_NAME,
                attributes=event_attributes(record, include_arguments=self._include),
                event_name=EVENT_NAME,
            )
            self._counter.add(
                1,
                {
                    "execgate.decision": str(record.get("decision", "")),
                    "execgate.source": str(record.get("source", "")),
                    "execgate.front_end": str(record.get("front", "")),
                },
            )
        batch = self._collected.get_finished_logs()
        self._collected.clear()
        if self._exporter.export(batch).value != 0:  # LogRecordExportResult.SUCCESS is 0
            raise OSError(f"the collector did not take {len(batch)} events")

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self._meters.shutdown(timeout_millis=int(EXPORT_TIMEOUT * 1000))
        with contextlib.suppress(Exception):
            self._exporter.shutdown()


def _exporters(settings: OtelSettings) -> tuple[Any, Any]:
    headers = dict(settings.headers) or None
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import (
            OTLPLogExporter as GrpcLogs,
        )
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as GrpcMetrics,
        )

        grpc_kwargs: dict[str, Any] = {"headers": headers, "timeout": EXPORT_TIMEOUT}
        if settings.endpoint:
            grpc_kwargs["endpoint"] = settings.endpoint
        return GrpcLogs(**grpc_kwargs), GrpcMetrics(**grpc_kwargs)
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    if settings.endpoint:
        base = settings.endpoint.rstrip("/")
        return (
            OTLPLogExporter(endpoint=f"{base}/v1/logs", headers=headers, timeout=EXPORT_TIMEOUT),
            OTLPMetricExporter(
                endpoint=f"{base}/v1/metrics", headers=headers, timeout=EXPORT_TIMEOUT
            ),
        )
    return (
        OTLPLogExporter(headers=headers, timeout=EXPORT_TIMEOUT),
        OTLPMetricExporter(headers=headers, timeout=EXPORT_TIMEOUT),
    )
