"""MaintenanceReport passes (``ingest.sink.maintenance.maintain``) on real delta-rs tables on local disk, and
``ingest maintain`` as a process. Ages are made with file times, never with sleeps: Delta's
log cleanup and a full VACUUM judge files by their modification time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from ingest.errors import ConfigError
from ingest.sink.files import write_data_files
from ingest.sink.maintenance.maintain import (
    TXN_RETENTION_PROPERTY,
    MaintenanceSettings,
    check_txn_retention,
    last_checkpoint,
    log_entries,
    maintain,
)
from ingest.sink.txnlog import txn_times
from ingest.testing.configs import write_toml
from tests.sink import committer
from tests.sink.test_replace import append, landed, offsets

ROOT = Path(__file__).resolve().parents[2]
ONLY_CHECKPOINTS = MaintenanceSettings(compact=False, vacuum=False, checkpoint_every=5)


def age(paths: list[Path], seconds: float) -> None:
    then = time.time() - seconds
    for path in paths:
        os.utime(path, (then, then))


def test_a_checkpoint_comes_once_the_table_moved_checkpoint_every_versions(
    tmp_path: Path,
) -> None:
    # The commits' own checkpoints (delta.checkpointInterval) put off past the test.
    target, apps = landed(tmp_path, {"delta.checkpointInterval": "1000"})  # versions 0-6
    location = target.location
    assert last_checkpoint(location) is None
    # Version 7 sets the log retention on the table, then the checkpoint.
    assert maintain(location, ONLY_CHECKPOINTS).checkpoint == 7
    assert last_checkpoint(location) == 7 and log_entries(location)[1] == 1
    # The checkpoint holds the txn actions: versions and their times read from it.
    times = txn_times(location, list(apps.values()))
    assert all(t is not None for t in times.values()), times
    for number in range(4):
        append(target, apps, 0, 300 + number * 10, 10, f"more{number}")
    assert maintain(location, ONLY_CHECKPOINTS).checkpoint is None  # 4 versions since
    append(target, apps, 0, 340, 10, "more4")
    assert maintain(location, ONLY_CHECKPOINTS).checkpoint == 12
    table = DeltaTable(target.uri)
    assert table.transaction_version(apps[0]) == 349 and table.transaction_version(apps[1]) == 299


def test_log_retention_is_set_on_the_table_and_old_commits_go(tmp_path: Path) -> None:
    target, apps = landed(tmp_path)
    location = target.location
    settings = MaintenanceSettings(
        compact=False, vacuum=False, checkpoint_every=1, log_retention_seconds=3600
    )
    maintain(location, settings)  # sets the property (a commit) and checkpoints
    log_dir = Path(target.uri) / "_delta_log"
    assert DeltaTable(target.uri).metadata().configuration["delta.logRetentionDuration"] == (
        "interval 3600 seconds"
    )
    age(list(log_dir.iterdir()), 2 * 3600)  # all of it two hours old
    done = maintain(location, settings)
    # Versions 0-6 went; the checkpoint's version 7 stays, so the table still reads.
    assert done.log_files_deleted == 7
    assert sorted(int(p.name[:20]) for p in log_dir.glob("*.json")) == [7]
    for number in range(3):
        append(target, apps, 1, 300 + number * 10, 10, f"late{number}")
    assert maintain(location, settings).log_files_deleted == 0  # young commits stay
    assert sorted(int(p.name[:20]) for p in log_dir.glob("*.json")) == [7, 8, 9, 10]
    table = DeltaTable(target.uri)
    assert offsets(table, 0) == list(range(300)) and offsets(table, 1) == list(range(330))
    assert table.transaction_version(apps[0]) == 299 and table.transaction_version(apps[1]) == 329
    assert all(t is not None for t in txn_times(location, list(apps.values())).values())


def test_vacuum_deletes_old_orphans_never_a_batch_in_flight(tmp_path: Path) -> None:
    target, apps = landed(tmp_path)
    location = target.location
    root = Path(target.uri)
    orphan = write_data_files(committer.rows(1, 0, 5), location, name="killed-run")
    in_flight = write_data_files(committer.rows(1, 300, 5), location, name="in-flight")
    age([root / orphan[0].path], 25 * 3600)
    age([root / in_flight[0].path], 23 * 3600)  # a batch's files, not committed yet
    done = maintain(location, MaintenanceSettings(compact=False, vacuum_retention_hours=24))
    assert done.vacuumed == (orphan[0].path,)
    assert (root / in_flight[0].path).exists()
    # The batch in flight still commits its files, and the table reads whole.
    outcome = target.commit_files(
        in_flight,
        {apps[1]: 304},
        committer.rows(1, 0, 0).schema,
        planned={apps[1]: 299},
        app_id_of=lambda t, p: apps[p],
    )
    assert outcome.committed
    assert offsets(DeltaTable(target.uri), 1) == list(range(305))


def test_vacuum_below_the_floor_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"maintenance.vacuum_retention: 23h is below the floor"):
        MaintenanceSettings(vacuum_retention_hours=23)
    with pytest.raises(ConfigError, match=r"maintenance.log_retention: 60s is below the floor"):
        MaintenanceSettings(log_retention_seconds=60)


def test_a_table_whose_txns_expire_is_refused(tmp_path: Path) -> None:
    target, apps = landed(tmp_path)
    check_txn_retention(target.location)  # unset: fine
    DeltaTable(target.uri).alter.set_table_properties(
        {TXN_RETENTION_PROPERTY: "interval 1 seconds"}
    )
    time.sleep(1.5)
    # What the property does: delta-rs already hides the txn of the quiet partitions.
    assert DeltaTable(target.uri).transaction_version(apps[0]) is None
    with pytest.raises(ConfigError) as refused:
        check_txn_retention(target.location)
    text = str(refused.value)
    assert f"sets {TXN_RETENTION_PROPERTY} = 'interval 1 seconds'" in text
    assert "exactly-once" in text and "land its offsets twice" in text
    with pytest.raises(ConfigError):
        maintain(target.location, MaintenanceSettings())


def _maintain_cli(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingest.cli", "maintain", "-c", str(config), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _config(tmp_path: Path, table: Path, **maintenance: object) -> Path:
    return write_toml(
        tmp_path / "maintain.toml",
        {
            "kafka": {"bootstrap_servers": ["127.0.0.1:1"]},
            "source": {"topics": ["race"], "group_id": "g"},
            "table": {"uri": str(table)},
            "maintenance": dict(maintenance),
        },
    )


def test_ingest_maintain_runs_one_pass_and_exits_0(tmp_path: Path) -> None:
    target, _ = landed(tmp_path)
    before = DeltaTable(target.uri).to_pyarrow_table().num_rows
    done = _maintain_cli(_config(tmp_path, Path(target.uri), checkpoint_every=5), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report[0]["table"] == target.uri and report[0]["compacted_files"] == 6
    # 0-6 the batches, 7 the compaction, 8 the log retention set on the table.
    assert report[0]["into_files"] == 1 and report[0]["checkpoint"] == 8
    assert report[1]["skipped"] == "no table yet"  # no dead letters yet
    table = DeltaTable(target.uri)
    assert len(table.file_uris()) == 1 and table.to_pyarrow_table().num_rows == before
    assert offsets(table, 0) == list(range(300))


def test_ingest_maintain_refuses_unsafe_settings_with_exit_2(tmp_path: Path) -> None:
    target, _ = landed(tmp_path)
    config = _config(tmp_path, Path(target.uri), vacuum_retention="12h")
    done = _maintain_cli(config)
    assert done.returncode == 2
    assert f"{config}: maintenance.vacuum_retention: 12h is below the floor of 24h" in done.stderr
    assert "batch in flight" in done.stderr
    DeltaTable(target.uri).alter.set_table_properties({TXN_RETENTION_PROPERTY: "interval 7 days"})
    done = _maintain_cli(_config(tmp_path, Path(target.uri)))
    assert done.returncode == 2 and TXN_RETENTION_PROPERTY in done.stderr, done.stderr
