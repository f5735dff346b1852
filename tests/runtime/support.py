"""Shared pieces of the supervisor tests: configs, the CLI as a subprocess, table checks.

Times: the configs use a 2 s session, so a member that dies is noticed quickly (and, on
Tansu, which holds a JoinGroup for max(1 s, session_timeout / 2), rebalances stay short;
docs/kafka-compat.md). Every wait is a
deadline on a condition, never a sleep that has to be long enough.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from ingest.client import Cluster
from ingest.config import IngestConfig, load_config
from ingest.membership.committed import as_offsets, committed_offsets
from ingest.protocol.partition import Partition
from ingest.supervisor.wiring import client_config, fetch_settings
from ingest.testing import ProducedRecord
from ingest.testing.configs import write_toml
from ingest.worker.ends import end_offsets

ROOT = Path(__file__).resolve().parents[2]
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def write_config(
    path: Path,
    *,
    bootstrap: str,
    topic: str,
    group: str,
    table: Path | None,
    sections: Mapping[str, Mapping[str, Any]] | None = None,
) -> Path:
    """A config for the test broker: short session, small triggers, local[2] Spark
    (``table`` None: no table.uri, ``sections`` name the table)."""
    values: dict[str, dict[str, Any]] = {
        "kafka": {"bootstrap_servers": bootstrap.split(","), "retry_timeout": "10s"},
        "source": {
            "topics": [topic],
            "group_id": group,
            "session_timeout": "2s",
            "heartbeat_interval": "300ms",
            "rebalance_timeout": "20s",
        },
        "fetch": {"max_wait": "100ms"},
        "handoff": {"segment_max_age": "500ms"},
        "trigger": {"max_age": "1s", "shutdown_timeout": "60s"},
        "worker": {"restart_backoff": "200ms"},
        "table": {} if table is None else {"uri": str(table)},
        "spark": {"master": "local[2]"},
    }
    for section, entries in (sections or {}).items():
        values.setdefault(section, {}).update(entries)
    return write_toml(path, values)


def config(path: Path) -> IngestConfig:
    return load_config(path)


def records(
    partition: int, start: int, count: int, *, base_ms: int = BASE_MS
) -> list[ProducedRecord]:
    """Records whose value names (partition, number) and whose timestamps are
    ``base_ms + number`` ms, so a time range picks known records."""
    return [
        ProducedRecord(
            b"p%d-%d" % (partition, n) + b"x" * 60,
            key=b"k%d" % (n % 17),
            partition=partition,
            timestamp_ms=base_ms + n,
        )
        for n in range(start, start + count)
    ]


# -- reading the table back -----------------------------------------------------------------


def table_offsets(uri: str | Path) -> pa.Table:
    """(partition, offset) of every row, sorted."""
    table = DeltaTable(str(uri)).to_pyarrow_table(columns=["partition", "offset"])
    return table.sort_by([("partition", "ascending"), ("offset", "ascending")])


def assert_exact(
    uri: str | Path, ends: Mapping[int, int], *, starts: Mapping[int, int] | None = None
) -> None:
    """Each offset of [start, end) of each partition is in the table exactly once, and
    nothing else is."""
    rows = table_offsets(uri)
    expected = sum(end - (starts or {}).get(p, 0) for p, end in ends.items())
    partitions = rows.column("partition").to_numpy()
    offsets = rows.column("offset").to_numpy()
    for partition, end in ends.items():
        start = (starts or {}).get(partition, 0)
        mine = offsets[partitions == partition]
        np.testing.assert_array_equal(
            mine, np.arange(start, end), err_msg=f"partition {partition}: offsets differ"
        )
    assert rows.num_rows == expected, (rows.num_rows, expected)
    assert set(np.unique(partitions).tolist()) <= set(ends)


def row_count(uri: str | Path, storage_options: Mapping[str, str] | None = None) -> int:
    """Rows in the table; 0 while it does not exist yet. Any other failure is raised: a
    broken table must not read as an empty one."""
    try:
        table = DeltaTable(str(uri), storage_options=dict(storage_options or {}))
    except TableNotFoundError:
        return 0
    return table.to_pyarrow_table(columns=["offset"]).num_rows


def table_version(uri: str | Path) -> int:
    return DeltaTable(str(uri)).version()


def group_offsets(
    cfg: IngestConfig, partitions: Iterable[Partition]
) -> dict[Partition, int | None]:
    with Cluster(client_config(cfg)) as cluster:
        return as_offsets(committed_offsets(cluster, cfg.source.group_id, partitions))


def broker_ends(cfg: IngestConfig, partitions: Iterable[Partition]) -> dict[Partition, int]:
    with Cluster(client_config(cfg)) as cluster:
        return end_offsets(cluster, partitions, fetch_settings(cfg))


def status_json(path: Path) -> dict[str, Any]:
    """``ingest status --json`` of the config at ``path``, parsed."""
    import json

    done = subprocess.run(
        [sys.executable, "-m", "ingest.cli", "status", "--json", "--config", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def values_of(uri: str | Path) -> list[bytes]:
    table = DeltaTable(str(uri)).to_pyarrow_table(columns=["value"])
    return table.column("value").to_pylist()


def distinct(column: pa.ChunkedArray) -> int:
    return len(pc.unique(column))


# -- waiting --------------------------------------------------------------------------------


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)
    return time.monotonic() - start


class Cli:
    """``ingest ...`` in a subprocess; its stderr (the structured log) is kept in a file
    and read as it grows."""

    def __init__(self, args: list[str], log: Path, env: Mapping[str, str] | None = None) -> None:
        self.log = log
        self._out = open(log, "w")  # noqa: SIM115 (closed in wait)
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ingest.cli", *args],
            cwd=ROOT,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def lines(self, event: str) -> list[str]:
        return [line for line in self.text().splitlines() if f"event={event} " in line + " "]

    def wait_for_event(self, event: str, timeout: float, count: int = 1) -> str:
        def seen() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"exited ({self.process.returncode}) before {event}:\n{self.text()[-4000:]}"
                )
            return len(self.lines(event)) >= count

        wait_until(seen, timeout, f"event {event} x{count}")
        return self.lines(event)[count - 1]

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout: float) -> int:
        try:
            code = self.process.wait(timeout)
        finally:
            self._out.close()
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._out.close()


class InProcess:
    """An engine (from ``group_run`` or ``replay_run``) running on a thread of the test process,
    with the session's Spark."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.outcome: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="test-supervisor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.outcome = self.engine.run()
        except BaseException as exc:
            self.error = exc

    def partitions(self) -> dict[int, dict[str, Any]]:
        return {row["partition"]: row for row in self.engine.status().get("partitions", [])}

    def stop(self, timeout: float = 90) -> Any:
        self.engine.request_stop("test")
        return self.join(timeout)

    def join(self, timeout: float = 90) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the supervisor did not stop"
        if self.error is not None:
            raise self.error
        return self.outcome

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()
