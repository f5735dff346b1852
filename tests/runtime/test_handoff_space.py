"""``ingest run`` within the handoff space it has: a container-sized tmpfs (mounted by the
test, as root), a refusal at start when it is too small, and a filesystem that another
process fills mid-run.

Without root the tests skip with the reason (``ingest.testing.tmpfs.mount_refusal``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ingest.supervisor.modes.group_run import group_run
from ingest.supervisor.output.metrics import Metrics
from ingest.testing import KafkaCluster, create_topic, produce, unique_name
from ingest.testing.tmpfs import fill, mount_refusal, small_tmpfs
from tests.runtime.support import (
    Cli,
    InProcess,
    assert_exact,
    config,
    records,
    wait_until,
    write_config,
)

MIB = 1024 * 1024
PARTITIONS = 4

pytestmark = pytest.mark.skipif(mount_refusal() is not None, reason=str(mount_refusal()))


class Events(logging.Handler):
    """The supervisor's structured events, as they are logged. A hook set in ``on`` runs
    in the logging thread, before the supervisor goes on: at ``handoff_space`` (the space
    just measured, no worker started yet) another writer can take the space."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: list[dict[str, Any]] = []
        self.on: dict[str, Callable[[], object]] = {}
        self._lock_seen = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "ingest_fields", None)  # ingest.logs.event's fields
        if fields is not None:
            with self._lock_seen:
                self.seen.append(dict(fields))
            hook = self.on.pop(fields["event"], None)
            if hook is not None:
                hook()

    def named(self, name: str) -> list[dict[str, Any]]:
        with self._lock_seen:
            return [e for e in self.seen if e.get("event") == name]


@pytest.fixture
def events() -> Iterator[Events]:
    handler = Events()
    logger = logging.getLogger("ingest.supervisor")
    previous = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(previous)


def _topic(broker: KafkaCluster, per_partition: int) -> str:
    topic = unique_name("t-space")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)

    def generate() -> Iterator[Any]:
        for chunk in range(0, per_partition, 10_000):
            for partition in range(PARTITIONS):
                yield from records(partition, chunk, min(10_000, per_partition - chunk))

    assert produce(broker.bootstrap, topic, generate(), compression="lz4") == (
        PARTITIONS * per_partition
    )
    return topic


def _config(broker: KafkaCluster, topic: str, tmp_path: Path, handoff: dict[str, Any]) -> Path:
    """A run config for ``topic`` whose handoff section is ``handoff``."""
    return write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=unique_name("g-space"),
        table=tmp_path / "table",
        sections={"handoff": handoff},
    )


def test_a_handoff_too_small_for_one_segment_is_refused_at_start(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    topic = unique_name("t-space")
    create_topic(broker.bootstrap, topic, partitions=1)
    with small_tmpfs(MIB, base=tmp_path) as root:
        path = _config(broker, topic, tmp_path, {"mode": "shm", "root": str(root)})
        started = time.monotonic()
        cli = Cli(["run", "--until-end", "-c", str(path)], tmp_path / "cli.log")
        code = cli.wait(60)
        took = time.monotonic() - started
        text = cli.text()
    assert code == 2, text
    for part in (str(root), "MiB free", "handoff", "--shm-size", "emptyDir", "sizeLimit"):
        assert part in text, text
    assert "worker_started" not in text and "Traceback" not in text, text
    print(f"refused in {took:.1f}s (a process start, the bootstrap check, the refusal)")


@pytest.mark.spark
@pytest.mark.parametrize(
    ("size_mib", "mode"),
    [(32, "files"), (64, "shm")],
    ids=["32MiB-files", "64MiB-shm"],
)
def test_default_settings_complete_exact_in_a_small_handoff(
    broker: KafkaCluster, spark: Any, tmp_path: Path, size_mib: int, mode: str, events: Events
) -> None:
    per_partition = 250_000
    topic = _topic(broker, per_partition)
    with small_tmpfs(size_mib * MIB, base=tmp_path) as root:
        # The handoff's defaults (64 MiB segments, a 1 GiB cap), in a small filesystem.
        path = _config(
            broker, topic, tmp_path, {"mode": mode, "root": str(root), "segment_max_age": "5s"}
        )
        metrics = Metrics()
        started = time.monotonic()
        outcome = group_run(config(path), until_end=True, spark=spark, metrics=metrics).run()
        took = time.monotonic() - started
    assert outcome.exit_code == 0, outcome.message
    assert_exact(tmp_path / "table", dict.fromkeys(range(PARTITIONS), per_partition))
    assert metrics.total("ingest_worker_restarts_total") == 0
    plans = events.named("handoff_plan")
    assert plans, "the default sizes were not lowered to fit"
    last = plans[-1]
    assert last["max_buffered_bytes"] + PARTITIONS * last["segment_max_bytes"] < size_mib * MIB
    rate = PARTITIONS * per_partition / took
    print(
        f"{size_mib} MiB {mode}: {PARTITIONS * per_partition} records in {took:.1f}s "
        f"({rate:,.0f}/s), {outcome.batches} batches, plan {last}, "
        f"handoff_full x{len(events.named('handoff_full'))}"
    )


@pytest.mark.spark
def test_a_handoff_filled_by_another_process_is_backpressure_not_a_crash(
    broker: KafkaCluster, spark: Any, tmp_path: Path, events: Events
) -> None:
    per_partition = 100_000
    topic = _topic(broker, per_partition)
    with small_tmpfs(48 * MIB, base=tmp_path) as root:
        path = _config(
            broker, topic, tmp_path, {"mode": "files", "root": str(root), "full_timeout": "120s"}
        )
        metrics = Metrics()
        engine = group_run(config(path), until_end=True, spark=spark, metrics=metrics)
        filler = root / "another-writer"
        # Once the plan is made, before any worker writes, another writer takes all but
        # 2 MiB: the workers hit ENOSPC at once and go on in what landed batches free.
        events.on["handoff_space"] = lambda: fill(filler, leave=2 * MIB)
        run = InProcess(engine)
        wait_until(lambda: len(events.named("handoff_full")) >= 2, 120, "two handoff_full events")
        full_at = time.monotonic()
        # The writers keep going on the little room that landed batches free...
        wait_until(lambda: engine.batches >= 2, 120, "batches while the other writer holds")
        assert run.alive
        filler.unlink()  # ...and the other writer gives its space back.
        outcome = run.join(180)
    assert outcome.exit_code == 0, outcome.message
    assert_exact(tmp_path / "table", dict.fromkeys(range(PARTITIONS), per_partition))
    assert metrics.total("ingest_worker_restarts_total") == 0
    assert events.named("handoff_room"), "no worker reported room again"
    print(
        f"handoff_full x{len(events.named('handoff_full'))}, handoff_room "
        f"x{len(events.named('handoff_room'))}, {outcome.batches} batches, "
        f"{time.monotonic() - full_at:.1f}s from the first full to the end"
    )


@pytest.mark.spark
def test_a_handoff_that_stays_full_fails_the_run_once_with_the_reason(
    broker: KafkaCluster, spark: Any, tmp_path: Path, events: Events
) -> None:
    topic = _topic(broker, 20_000)
    with small_tmpfs(16 * MIB, base=tmp_path) as root:
        path = _config(
            broker, topic, tmp_path, {"mode": "files", "root": str(root), "full_timeout": "3s"}
        )
        metrics = Metrics()
        engine = group_run(config(path), until_end=True, spark=spark, metrics=metrics)
        # Once the plan is made, before any worker writes, another writer takes it all:
        # nothing of ours is in the handoff, so no batch can free anything.
        events.on["handoff_space"] = lambda: fill(root / "another-writer", leave=0)
        outcome = InProcess(engine).join(120)
    assert outcome.exit_code == 1, outcome.message
    assert "stayed full" in outcome.message and "handoff.full_timeout" in outcome.message
    assert metrics.total("ingest_worker_restarts_total") == 0  # no crash loop
