"""A driver-side committer run in spawned processes (no Spark): pyarrow-written files,
one delta-rs commit per round, racing another process for the same offsets."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pyarrow as pa

from ingest.sink.delta import DeltaTarget
from ingest.sink.files import write_data_files
from ingest.sink.storage import TableLocation
from ingest.sink.txn import app_id

TOPIC = "race"
GROUP = "g"
ROWS_PER_ROUND = 50


def rows(partition: int, start: int, count: int) -> pa.Table:
    offsets = np.arange(start, start + count, dtype=np.int64)
    return pa.table(
        {
            "topic": pa.array([TOPIC] * count, pa.string()),
            "partition": pa.array(np.full(count, partition, np.int32)),
            "offset": pa.array(offsets),
            "timestamp": pa.array(
                [dt.datetime(2024, 1, 1, tzinfo=dt.UTC)] * count, pa.timestamp("us", tz="UTC")
            ),
            "value": pa.array([b"v%d" % o for o in offsets], pa.binary()),
        }
    )


def commit_rounds(uri: str, me: int, rounds: int, barrier: Any, results: Any) -> None:
    """Each round: both processes read the txn versions and write the same offsets of
    the shared partition 0 (and of their own partition), then both commit at once.
    Reports (me, round, committed, dropped rows, attempts) per round."""
    target = DeltaTarget(TableLocation.of(uri), backoff_seconds=0.01)
    apps = {p: app_id(uri, GROUP, TOPIC, p) for p in (0, 10 + me)}

    def app_id_of(topic: str, partition: int) -> str:
        return apps[partition]

    for number in range(rounds):
        barrier.wait()
        start = number * ROWS_PER_ROUND
        planned = target.versions(list(apps.values()))
        files = []
        for partition, app in apps.items():
            fresh = rows(partition, start, ROWS_PER_ROUND)
            version = planned[app]
            if version is not None:
                fresh = fresh.filter(pa.compute.greater(fresh.column("offset"), version))
            files += write_data_files(fresh, target.location, name=f"p{me}-r{number}-{partition}")
        last = start + ROWS_PER_ROUND - 1
        # Both have planned from the same versions: exactly one must lose partition 0.
        barrier.wait()
        outcome = target.commit_files(
            files,
            {app: last for app in apps.values()},
            rows(0, 0, 0).schema,
            planned=planned,
            app_id_of=app_id_of,
        )
        results.put((me, number, outcome.committed, outcome.dropped_rows, outcome.attempts))


def first_commit_trials(base_uri: str, me: int, trials: int, barrier: Any, results: Any) -> None:
    """Each trial: both processes make the FIRST commit of a fresh table, with the same
    offsets of partition 0, at the same moment. Reports (me, trial, committed)."""
    for trial in range(trials):
        uri = f"{base_uri}/t{trial}"
        properties = {"delta.logRetentionDuration": f"interval {60 + me} days"}
        target = DeltaTarget(TableLocation.of(uri), properties=properties, backoff_seconds=0.01)
        app = app_id(uri, GROUP, TOPIC, 0)
        files = write_data_files(rows(0, 0, ROWS_PER_ROUND), target.location, name=f"p{me}")
        barrier.wait()
        outcome = target.commit_files(
            files,
            {app: ROWS_PER_ROUND - 1},
            rows(0, 0, 0).schema,
            planned={app: None},
            app_id_of=lambda topic, partition, app=app: app,
        )
        results.put((me, trial, outcome.committed))
