"""Prometheus metrics on ``prometheus_client``: the supervisor's registry and its endpoint.

``Metrics`` holds a registry of its own (never the global one): the families of
``METRICS``, and ``ProcessCollector``'s CPU, RSS and open fds of the supervisor.
The main thread updates them by name. Every series labelled by partition starts at
zero when the partition is assigned (``partition_assigned``), and the series of a
fixed label set (batch outcomes, commit outcomes, batch stages) when the registry is
made, so ``rate()`` and alerts have a baseline before the first batch. A partition's
gauges (``OWNED``: lag, offsets, failed) go once it is no longer owned
(``retain_partitions``, at each status publication): a former owner never exports a lag
that stopped moving. Batch stage times are histograms with buckets from 50 ms to 10 min.

``MetricsServer`` serves ``/metrics`` (``prometheus_client``'s WSGI app) and
``/status`` (JSON: the supervisor's view of each partition) on
``prometheus_client``'s threading WSGI server. Gauges that cost broker requests
(lag) are filled by a ``collector`` callback at scrape time, cached briefly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.exposition import ThreadingWSGIServer

from ingest.errors import ConfigError
from ingest.processes import start_thread
from ingest.protocol.partition import Partition

__all__ = [
    "METRICS",
    "OWNED",
    "STAGES",
    "STAGE_BUCKETS",
    "Metrics",
    "MetricsServer",
    "parse_listen",
]

log = logging.getLogger("ingest.supervisor.output.metrics")

# The exposition keeps its families as before: no ``_created`` series beside the counters.
disable_created_metrics()  # type: ignore[no-untyped-call]

PARTITION = ("topic", "partition")
# The stages ``ingest.sink.land`` times (``BatchResult.stage_seconds``); "total" is the
# whole batch.
STAGES = ("plan", "spark", "dead_letters", "commit", "total")
# Batches take seconds to minutes: 50 ms .. 10 min.
STAGE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

# name -> (type, help, labels)
METRICS: dict[str, tuple[type[Counter | Gauge | Histogram], str, tuple[str, ...]]] = {
    "ingest_partition_lag": (
        Gauge, "End offset minus committed offset, per partition.", PARTITION),
    "ingest_partition_end_offset": (
        Gauge, "End offset (Fetch high watermark) per partition.", PARTITION),
    "ingest_partition_committed_offset": (
        Gauge, "Group committed offset per partition.", PARTITION),
    "ingest_partition_durable_offset": (Gauge, "Delta txn version per partition.", PARTITION),
    "ingest_partition_failed": (
        Gauge, "1 when the partition is stopped after repeated crashes.", PARTITION),
    "ingest_partitions_assigned": (Gauge, "Partitions this supervisor owns.", ()),
    "ingest_records_consumed_total": (
        Counter, "Records in sealed segments, per partition.", PARTITION),
    "ingest_bytes_consumed_total": (
        Counter, "Arrow bytes in sealed segments, per partition.", PARTITION),
    "ingest_rows_written_total": (Counter, "Rows committed to the Delta table.", ()),
    "ingest_dead_letters_total": (Counter, "Rows committed to the dead-letter table.", ()),
    "ingest_batches_total": (Counter, "Spark batches, by outcome.", ("outcome",)),
    "ingest_batch_stage_seconds": (
        Histogram, "Time per batch stage (plan, spark, dead_letters, commit; total: the "
        "whole batch).", ("stage",)),
    "ingest_offset_commits_total": (Counter, "Kafka offset commits, by outcome.", ("outcome",)),
    "ingest_rebalances_total": (Counter, "Assignments received from the group.", ()),
    "ingest_partitions_lost_total": (Counter, "Partitions lost with the membership.", ()),
    "ingest_worker_restarts_total": (
        Counter, "Worker restarts after a crash, per partition.", PARTITION),
    "ingest_buffered_bytes": (Gauge, "Bytes of sealed segments not yet released.", ()),
    "ingest_group_requests_total": (
        Counter, "Requests sent to the group coordinator, per API.", ("api",)),
}  # fmt: skip

# A partition's state (its gauges: lag, offsets, failed), which only its owner reports:
# dropped once it is no longer owned (revoked, lost), so a former owner never keeps
# exporting a lag that stopped moving.
OWNED = tuple(
    n for n, (kind, _, labels) in METRICS.items() if kind is Gauge and labels == PARTITION
)

# Fixed label sets, exported at zero from the start.
_BASELINE: dict[str, Iterable[str]] = {
    "ingest_batches_total": ("ok", "failed"),
    "ingest_offset_commits_total": ("ok", "failed"),
    "ingest_batch_stage_seconds": STAGES,
}


class Metrics:
    """The supervisor's metrics, by name and labels, on a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self._families: dict[str, Any] = {}
        self._owned: set[tuple[str, str]] = set()  # (topic, partition) with OWNED series
        self._owned_lock = threading.Lock()  # the main thread and the scrape's collector
        for name, (kind, text, labels) in METRICS.items():
            options: dict[str, Any] = {"buckets": STAGE_BUCKETS} if kind is Histogram else {}
            self._families[name] = kind(name, text, labels, registry=self.registry, **options)
        for name, values in _BASELINE.items():
            for value in values:
                self._families[name].labels(value)

    def _series(self, name: str, labels: Mapping[str, object]) -> Any:
        family = self._families[name]
        return family.labels(**{k: str(v) for k, v in labels.items()}) if labels else family

    def partition_assigned(self, partition: Partition) -> None:
        """Every series of the partition, at zero where it has no value yet."""
        with self._owned_lock:
            self._owned.add((partition.topic, str(partition.partition)))
            for name, (_kind, _text, labels) in METRICS.items():
                if labels == PARTITION:
                    self._families[name].labels(
                        topic=partition.topic, partition=str(partition.partition)
                    )

    def retain_partitions(self, owned: Iterable[Partition]) -> None:
        """Drops the ``OWNED`` series of every partition not in ``owned`` (revoked or lost
        since); its counters stay, they count what this process did."""
        keep = {(p.topic, str(p.partition)) for p in owned}
        with self._owned_lock:
            for topic, partition in self._owned - keep:
                for name in OWNED:
                    with contextlib.suppress(KeyError):  # a series never made
                        self._families[name].remove(topic, partition)
            self._owned &= keep

    def inc(self, name: str, amount: float = 1.0, **labels: object) -> None:
        self._series(name, labels).inc(amount)

    def set(self, name: str, value: float, **labels: object) -> None:
        if name not in OWNED:
            self._series(name, labels).set(value)
            return
        with self._owned_lock:
            self._owned.add((str(labels["topic"]), str(labels["partition"])))
            self._series(name, labels).set(value)

    def advance_to(self, name: str, total: float, **labels: object) -> None:
        """A counter kept elsewhere (the membership's request counts): raised to ``total``."""
        grown = total - self.value(name, **labels)
        if grown > 0:
            self.inc(name, grown, **labels)

    def remove(self, name: str, **labels: object) -> None:
        values = [str(labels[label]) for label in METRICS[name][2]]
        with contextlib.suppress(KeyError):  # a series never made
            self._families[name].remove(*values)

    def observe(self, name: str, value: float, **labels: object) -> None:
        self._series(name, labels).observe(value)

    def value(self, name: str, **labels: object) -> float:
        found = self.registry.get_sample_value(name, {k: str(v) for k, v in labels.items()})
        return 0.0 if found is None else found

    def total(self, name: str) -> float:
        """The sum over every label set (tests and summaries)."""
        return sum(
            sample.value
            for family in self.registry.collect()
            for sample in family.samples
            if sample.name == name
        )

    def render(self) -> str:
        return generate_latest(self.registry).decode()


def parse_listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"expected host:port, got {text!r}", key="metrics.listen")
    return host.strip("[]"), int(port)


class _Handler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics: " + format, *args)


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
        exposition = make_wsgi_app(metrics.registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path == "/metrics":
                self._collect()
                answer: Iterable[bytes] = exposition(environ, start_response)
                return answer
            if path == "/status" and self._status is not None:
                body = json.dumps(self._status(), default=str, indent=2).encode()
                start_response("200 OK", [("Content-Type", "application/json")])
                return [body]
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: /metrics or /status\n"]

        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

            class Server(ThreadingWSGIServer):
                address_family = family

            self._http = make_server(host, port, app, Server, handler_class=_Handler)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {listen}: {exc}", key="metrics.listen") from exc
        self.address = f"{host}:{self._http.server_address[1]}"
        self._thread = start_thread("metrics", self._http.serve_forever)

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
