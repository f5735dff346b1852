"""Prometheus metrics: a small thread-safe registry and its text endpoint.

The supervisor's main thread updates counters and gauges; ``MetricsServer``
(stdlib ``http.server`` on a daemon thread) serves ``/metrics`` in the
Prometheus text format (0.0.4) and ``/status`` as JSON (the supervisor's view
of each partition, failed ones included). Gauges that cost broker requests
(lag) are filled by a ``collector`` callback at scrape time, cached briefly.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ingest.errors import ConfigError

__all__ = ["METRICS", "Metrics", "MetricsServer", "parse_listen"]

log = logging.getLogger("ingest.supervisor.metrics")

Labels = tuple[tuple[str, str], ...]

# name -> (type, help)
METRICS: dict[str, tuple[str, str]] = {
    "ingest_partition_lag": ("gauge", "End offset minus committed offset, per partition."),
    "ingest_partition_end_offset": ("gauge", "End offset (Fetch high watermark) per partition."),
    "ingest_partition_committed_offset": ("gauge", "Group committed offset per partition."),
    "ingest_partition_durable_offset": ("gauge", "Delta txn version per partition."),
    "ingest_partition_failed": ("gauge", "1 when the partition is stopped after repeated crashes."),
    "ingest_partitions_assigned": ("gauge", "Partitions this supervisor owns."),
    "ingest_records_consumed_total": ("counter", "Records in sealed segments, per partition."),
    "ingest_bytes_consumed_total": ("counter", "Arrow bytes in sealed segments, per partition."),
    "ingest_rows_written_total": ("counter", "Rows committed to the Delta table."),
    "ingest_dead_letters_total": ("counter", "Rows committed to the dead-letter table."),
    "ingest_batches_total": ("counter", "Spark batches, by outcome."),
    "ingest_batch_stage_seconds": ("summary", "Time per batch stage (plan, spark, commit...)."),
    "ingest_offset_commits_total": ("counter", "Kafka offset commits, by outcome."),
    "ingest_rebalances_total": ("counter", "Assignments received from the group."),
    "ingest_partitions_lost_total": ("counter", "Partitions lost with the membership."),
    "ingest_worker_restarts_total": ("counter", "Worker restarts after a crash, per partition."),
    "ingest_buffered_bytes": ("gauge", "Bytes of sealed segments not yet released."),
    "ingest_group_requests_total": ("counter", "Requests sent to the group coordinator, per API."),
}


def _key(labels: Mapping[str, object] | None) -> Labels:
    return tuple(sorted((k, str(v)) for k, v in (labels or {}).items()))


class Metrics:
    """Counters, gauges and summaries (sum and count) by name and labels."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[Labels, float]] = {}
        self._summaries: dict[str, dict[Labels, tuple[float, int]]] = {}

    def inc(self, name: str, amount: float = 1.0, **labels: object) -> None:
        key = _key(labels)
        with self._lock:
            series = self._values.setdefault(name, {})
            series[key] = series.get(key, 0.0) + amount

    def set(self, name: str, value: float, **labels: object) -> None:
        with self._lock:
            self._values.setdefault(name, {})[_key(labels)] = float(value)

    def remove(self, name: str, **labels: object) -> None:
        with self._lock:
            self._values.get(name, {}).pop(_key(labels), None)

    def observe(self, name: str, value: float, **labels: object) -> None:
        key = _key(labels)
        with self._lock:
            series = self._summaries.setdefault(name, {})
            total, count = series.get(key, (0.0, 0))
            series[key] = (total + value, count + 1)

    def value(self, name: str, **labels: object) -> float:
        with self._lock:
            return self._values.get(name, {}).get(_key(labels), 0.0)

    def total(self, name: str) -> float:
        """The sum over every label set (tests and summaries)."""
        with self._lock:
            return sum(self._values.get(name, {}).values())

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            values = {n: dict(s) for n, s in self._values.items()}
            summaries = {n: dict(s) for n, s in self._summaries.items()}
        for name in sorted(set(values) | set(summaries)):
            kind, text = METRICS.get(name, ("untyped", name))
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in sorted(values.get(name, {}).items()):
                lines.append(f"{name}{_labels(labels)} {_number(value)}")
            for labels, (total, count) in sorted(summaries.get(name, {}).items()):
                lines.append(f"{name}_sum{_labels(labels)} {_number(total)}")
                lines.append(f"{name}_count{_labels(labels)} {count}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def parse_listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"expected host:port, got {text!r}", key="metrics.listen")
    return host.strip("[]"), int(port)


class MetricsServer:
    """Serves ``/metrics`` and ``/status`` on a daemon thread until ``close``."""

    def __init__(
        self,
        metrics: Metrics,
        listen: str,
        *,
        status: Callable[[], Mapping[str, Any]] | None = None,
        collector: Callable[[Metrics], None] | None = None,
        collect_every: float = 5.0,
    ) -> None:
        self.metrics = metrics
        host, port = parse_listen(listen)
        self._status = status
        self._collector = collector
        self._collect_every = collect_every
        self._collected_at = float("-inf")
        self._collect_lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] == "/metrics":
                    server._collect()
                    body = metrics.render().encode()
                    kind = "text/plain; version=0.0.4; charset=utf-8"
                elif self.path.split("?")[0] == "/status" and server._status is not None:
                    body = json.dumps(server._status(), default=str, indent=2).encode()
                    kind = "application/json"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("metrics: " + format, *args)

        try:
            self._http = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {listen}: {exc}", key="metrics.listen") from exc
        self._http.daemon_threads = True
        self.address = f"{host}:{self._http.server_address[1]}"
        self._thread = threading.Thread(
            target=self._http.serve_forever, name="ingest-metrics", daemon=True
        )
        self._thread.start()

    def _collect(self) -> None:
        if self._collector is None:
            return
        with self._collect_lock:
            if time.monotonic() - self._collected_at < self._collect_every:
                return
            try:
                self._collector(self.metrics)
            except Exception as exc:  # a scrape must still answer
                log.warning("metrics: collecting lag failed: %s", exc)
            self._collected_at = time.monotonic()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
