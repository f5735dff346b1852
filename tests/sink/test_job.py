"""The Spark job end to end: records produced through the real broker, drained by real
workers into segments, landed in Delta, read back by delta-rs and by Spark."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from ingest.engines.spark.job import Batch, run_batch
from ingest.errors import SinkError
from ingest.handoff import HandoffConfig, HandoffStore, SegmentWriter
from ingest.sink.delta import DeltaTarget
from ingest.sink.storage import TableLocation
from ingest.sink.table_config import TableConfig
from ingest.sink.txn import app_id
from ingest.testing import ConsumedRecord, KafkaCluster, S3Server, create_topic, produce, read_topic
from ingest.testing import unique_name as unique
from tests.sink.support import (
    JSON_SCHEMA,
    Drained,
    assert_rows_equal_reference,
    delta_rows,
    drain,
    is_malformed,
    json_records,
    spark_rows,
)

pytestmark = pytest.mark.spark

RECORDS = 1500
PARTITIONS = 2


@pytest.fixture(scope="module")
def drained(broker: KafkaCluster) -> Iterator[Drained]:
    topic = unique("t-sink")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    produce(broker.bootstrap, topic, json_records(RECORDS))
    reference = tuple(read_topic(broker.bootstrap, topic))
    # Small segments: several per partition, so batches can overlap and arrive out of order.
    with HandoffStore(HandoffConfig(segment_max_bytes=24 * 1024)) as store:
        segments = drain(broker, store, topic, PARTITIONS)
        assert sum(s.record_count for s in segments) == RECORDS
        assert all(len([s for s in segments if s.partition == p]) >= 3 for p in range(PARTITIONS))
        yield Drained(topic, reference, tuple(segments), store)


def last_offsets(segments: Any) -> dict[tuple[str, int], int]:
    last: dict[tuple[str, int], int] = {}
    for s in segments:
        last[(s.topic, s.partition)] = max(last.get((s.topic, s.partition), -1), s.next_offset - 1)
    return last


def good(records: Any) -> list[ConsumedRecord]:
    return [r for r in records if not is_malformed(r.value)]


@pytest.mark.quick
def test_append_lands_each_record_once_as_the_reference_reader_sees_it(
    spark: Any, drained: Drained, tmp_path: Path
) -> None:
    config = TableConfig(uri=str(tmp_path / "events"), group="g")
    early = [s for p in range(PARTITIONS) for s in drained.of_partition(p)[:2]]
    first = run_batch(spark, Batch(config, tuple(early)))
    assert first.table_version == 1 and first.path == "arrow"  # version 0: the empty create
    assert first.rows_written == sum(s.record_count for s in early)
    # Overlapping and repeated replays, segments out of order: every offset still once.
    everything = tuple(reversed(drained.segments))
    second = run_batch(spark, Batch(config, everything))
    assert second.rows_written == RECORDS - first.rows_written
    for _ in range(2):
        again = run_batch(spark, Batch(config, everything))
        assert again.rows_written == 0 and again.table_version == second.table_version
    assert second.durable_offsets == last_offsets(drained.segments)
    table = DeltaTable(config.uri)
    for (topic, partition), offset in last_offsets(drained.segments).items():
        assert table.transaction_version(app_id(config.uri, "g", topic, partition)) == offset
    # UTC timestamps keep the table readable by every engine (protocol 1/2).
    assert (table.protocol().min_reader_version, table.protocol().min_writer_version) == (1, 2)
    assert_rows_equal_reference(delta_rows(config.uri), drained.reference)
    assert_rows_equal_reference(spark_rows(spark, config.uri), drained.reference)
    assert set(second.stage_seconds) == {"plan", "spark", "dead_letters", "commit", "total"}


def test_json_values_decode_and_malformed_ones_land_in_the_dead_letter_table(
    spark: Any, drained: Drained, tmp_path: Path
) -> None:
    config = TableConfig(
        uri=str(tmp_path / "events"),
        group="g",
        value_format="json",
        value_schema=JSON_SCHEMA,
        date_column="day",
        partition_by=("day",),
    )
    result = run_batch(spark, Batch(config, drained.segments))
    expected = good(drained.reference)
    malformed = [r for r in drained.reference if is_malformed(r.value)]
    assert result.rows_written == len(expected) and result.dead_letters == len(malformed) > 0
    for rows in (delta_rows(config.uri), spark_rows(spark, config.uri)):
        assert_rows_equal_reference(rows, expected, with_value=False)
        documents = [orjson.loads(r.value) for r in expected]
        assert rows.column("id").to_pylist() == [d["id"] for d in documents]
        assert rows.column("user").to_pylist() == [d["user"] for d in documents]
        assert rows.column("amount").to_pylist() == [d["amount"] for d in documents]
        assert rows.column("tags").to_pylist() == [d.get("tags") for d in documents]
        assert set(rows.column("day").to_pylist()) == {
            r["timestamp"].date() for r in rows.to_pylist()
        }
    dead = delta_rows(config.dead_letters)
    assert_rows_equal_reference(dead, malformed)
    assert set(dead.column("error_stage").to_pylist()) == {"decode"}
    assert all(dead.column("error_message").to_pylist())
    # A replay lands nothing twice, in either table.
    again = run_batch(spark, Batch(config, drained.segments))
    assert again.rows_written == 0 and again.dead_letters == 0
    assert delta_rows(config.dead_letters).num_rows == len(malformed)


def test_a_crash_between_the_dead_letter_and_table_commits_is_completed_by_a_replay(
    spark: Any, drained: Drained, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = TableConfig(
        uri=str(tmp_path / "events"), group="g", value_format="json", value_schema=JSON_SCHEMA
    )
    batch = Batch(config, drained.segments)
    commit = DeltaTarget.commit_files

    def crash_on_the_table(self: DeltaTarget, *args: Any, **kwargs: Any) -> Any:
        if self.uri == config.uri:
            raise RuntimeError("the driver died here")
        return commit(self, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(DeltaTarget, "commit_files", crash_on_the_table)
        with pytest.raises(RuntimeError, match="died"):
            run_batch(spark, batch)
    malformed = [r for r in drained.reference if is_malformed(r.value)]
    assert delta_rows(config.dead_letters).num_rows == len(malformed)
    assert DeltaTarget(TableLocation.of(config.uri)).load() is None
    result = run_batch(spark, batch)
    assert result.dead_letters == 0 and result.rows_written == len(good(drained.reference))
    assert_rows_equal_reference(delta_rows(config.dead_letters), malformed)
    assert_rows_equal_reference(delta_rows(config.uri), good(drained.reference), with_value=False)


def test_a_sql_transform_shapes_rows_and_its_rejects_become_dead_letters(
    spark: Any, drained: Drained, tmp_path: Path
) -> None:
    config = TableConfig(
        uri=str(tmp_path / "events"),
        group="g",
        value_format="json",
        value_schema=JSON_SCHEMA,
        transform=(
            "SELECT topic, partition, offset, upper(user) AS user, amount * 2 AS doubled, "
            "CASE WHEN amount > 500 THEN concat('too big: ', amount) END AS _dead_letter "
            "FROM batch"
        ),
    )
    result = run_batch(spark, Batch(config, drained.segments))
    assert result.path == "spark"
    documents = {(r.partition, r.offset): orjson.loads(r.value) for r in good(drained.reference)}
    kept = {key: d for key, d in documents.items() if d["amount"] <= 500}
    rows = delta_rows(config.uri)
    assert rows.column_names == ["topic", "partition", "offset", "user", "doubled"]
    assert list(
        zip(rows.column("partition").to_pylist(), rows.column("offset").to_pylist(), strict=True)
    ) == sorted(kept)
    assert rows.column("user").to_pylist() == [kept[k]["user"].upper() for k in sorted(kept)]
    assert rows.column("doubled").to_pylist() == [kept[k]["amount"] * 2 for k in sorted(kept)]
    rejected = [
        r for r in drained.reference if is_malformed(r.value) or (r.partition, r.offset) not in kept
    ]
    dead = delta_rows(config.dead_letters)
    assert_rows_equal_reference(dead, rejected)
    stages = {(row["partition"], row["offset"]): row["error_stage"] for row in dead.to_pylist()}
    assert {stages[(r.partition, r.offset)] for r in rejected if is_malformed(r.value)} == {
        "decode"
    }
    too_big = [r for r in rejected if not is_malformed(r.value)]
    assert too_big and {stages[(r.partition, r.offset)] for r in too_big} == {"transform"}


def latest_per_user(records: Any) -> dict[str, tuple[int, int, float]]:
    latest: dict[str, tuple[int, int, float]] = {}
    for r in good(records):
        document = orjson.loads(r.value)
        previous = latest.get(document["user"])
        if previous is None or r.offset > previous[1]:
            latest[document["user"]] = (r.partition, r.offset, document["amount"])
    return latest


def table_by_user(uri: str) -> dict[str, tuple[int, int, float]]:
    rows = delta_rows(uri).to_pylist()
    assert len({r["user"] for r in rows}) == len(rows), "a key landed twice"
    return {r["user"]: (r["partition"], r["offset"], r["amount"]) for r in rows}


def test_upsert_keeps_the_newest_value_per_key_under_out_of_order_replays(
    spark: Any, drained: Drained, tmp_path: Path
) -> None:
    config = TableConfig(
        uri=str(tmp_path / "users"),
        group="g1",
        mode="upsert",
        merge_keys=("user",),
        value_format="json",
        value_schema=JSON_SCHEMA,
    )
    halves = [
        (
            drained.of_partition(p)[: len(drained.of_partition(p)) // 2],
            drained.of_partition(p)[len(drained.of_partition(p)) // 2 :],
        )
        for p in range(PARTITIONS)
    ]
    older = tuple(s for first, _ in halves for s in first)
    newer = tuple(s for _, second in halves for s in reversed(second))
    newer_records = [
        r
        for r in drained.reference
        if any(
            s.partition == r.partition and s.first_offset <= r.offset <= s.last_offset
            for s in newer
        )
    ]
    merged = run_batch(spark, Batch(config, newer))
    assert merged.table_version == DeltaTable(config.uri).version()
    assert table_by_user(config.uri) == latest_per_user(newer_records)
    # Another group replays older offsets: they never overwrite newer values, and
    # users only seen in the older offsets are inserted.
    other = dataclasses.replace(config, group="g2")
    run_batch(spark, Batch(other, older))
    assert table_by_user(config.uri) == latest_per_user(drained.reference)
    # A merge that changes nothing still records its txn actions.
    version = DeltaTable(config.uri).version()
    unchanged = run_batch(spark, Batch(dataclasses.replace(config, group="g3"), older))
    assert unchanged.rows_written == 0 and unchanged.table_version == version + 1
    table = DeltaTable(config.uri)
    for (topic, partition), offset in last_offsets(older).items():
        assert table.transaction_version(app_id(config.uri, "g3", topic, partition)) == offset
    # The first group's replay of everything: its txn versions drop it all.
    replay = run_batch(spark, Batch(config, drained.segments))
    assert replay.rows_written == 0
    assert table_by_user(config.uri) == latest_per_user(drained.reference)


def test_upsert_through_a_transform_sends_rows_without_a_key_to_dead_letters(
    spark: Any, drained: Drained, tmp_path: Path
) -> None:
    config = TableConfig(
        uri=str(tmp_path / "users"),
        group="g",
        mode="upsert",
        merge_keys=("user",),
        value_format="json",
        value_schema=JSON_SCHEMA,
        transform=(
            "SELECT topic, partition, offset, amount, _delete, "
            "CASE WHEN id % 10 = 0 THEN NULL ELSE user END AS user FROM batch"
        ),
    )
    result = run_batch(spark, Batch(config, drained.segments))
    keyed = [r for r in good(drained.reference) if orjson.loads(r.value)["id"] % 10]
    assert table_by_user(config.uri) == latest_per_user(keyed)
    assert result.table_version == DeltaTable(config.uri).version()
    dead = {
        (row["partition"], row["offset"]): row
        for row in delta_rows(config.dead_letters).to_pylist()
    }
    keyless = [r for r in good(drained.reference) if orjson.loads(r.value)["id"] % 10 == 0]
    assert len(dead) == len(keyless) + len([r for r in drained.reference if is_malformed(r.value)])
    for record in keyless:
        row = dead[(record.partition, record.offset)]
        assert row["value"] == record.value and row["error_stage"] == "transform"
        assert "merge key is null" in row["error_message"]
    # The staging files of the merge source are gone.
    assert not list((tmp_path / "users").glob("_ingest_staging/*/*"))


def test_corrupt_batches_land_as_dead_letters_and_move_the_partition_on(
    spark: Any, drained: Drained, tmp_path: Path
) -> None:
    config = TableConfig(uri=str(tmp_path / "events"), group="g")
    segments = tuple(drained.of_partition(0))
    end = segments[-1].next_offset
    writer = SegmentWriter(drained.store.location, drained.topic, 0, start_offset=end)
    raw = b"\x00\x00\x00\x00\x00\x00\x00\x07garbage-batch"
    corrupt = writer.write_corrupt(
        first_offset=end, last_offset=end + 4, raw=raw, reason="CRC mismatch", kind="crc"
    )
    result = run_batch(spark, Batch(config, segments, corrupt=(corrupt,)))
    assert result.durable_offsets == {(drained.topic, 0): end + 4}
    [dead] = delta_rows(config.dead_letters).to_pylist()
    assert (dead["topic"], dead["partition"], dead["offset"], dead["value"]) == (
        drained.topic,
        0,
        end,
        raw,
    )
    assert dead["error_stage"] == "corrupt batch" and "CRC mismatch" in dead["error_message"]
    again = run_batch(spark, Batch(config, segments, corrupt=(corrupt,)))
    assert again.dead_letters == 0 and delta_rows(config.dead_letters).num_rows == 1


def test_the_schema_evolves_with_new_json_fields_and_refuses_changed_types(
    spark: Any, drained: Drained, tmp_path: Path
) -> None:
    segments = drained.of_partition(0)
    narrow = TableConfig(
        uri=str(tmp_path / "events"),
        group="g",
        value_format="json",
        value_schema="id BIGINT, user STRING",
    )
    run_batch(spark, Batch(narrow, tuple(segments[:1])))
    wider = dataclasses.replace(narrow, value_schema="id BIGINT, user STRING, amount DOUBLE")
    run_batch(spark, Batch(wider, tuple(segments[1:2])))
    rows = delta_rows(narrow.uri)
    amounts = rows.column("amount").to_pylist()
    first_count = len(
        good(
            r for r in drained.reference if r.partition == 0 and r.offset <= segments[0].last_offset
        )
    )
    assert amounts[:first_count] == [None] * first_count
    assert None not in amounts[first_count:] and len(amounts) > first_count
    changed = dataclasses.replace(narrow, value_schema="id STRING, user BIGINT")
    with pytest.raises(SinkError, match=r"columns: id \(table \"long\", batch \"string\"\); user"):
        run_batch(spark, Batch(changed, tuple(segments[2:3])))
    assert delta_rows(narrow.uri).num_rows == rows.num_rows


def test_a_table_on_s3_lands_each_record_once(spark: Any, drained: Drained, s3: S3Server) -> None:
    uri = f"s3://{s3.bucket}/{unique('tables')}/events"
    config = TableConfig(
        uri=uri,
        group="g",
        value_format="json",
        value_schema=JSON_SCHEMA,
        storage_options=s3.storage_options(),
    )
    for _ in range(2):
        run_batch(spark, Batch(config, drained.segments))
    options = s3.storage_options()
    assert_rows_equal_reference(delta_rows(uri, options), good(drained.reference), with_value=False)
    malformed = [r for r in drained.reference if is_malformed(r.value)]
    assert_rows_equal_reference(delta_rows(config.dead_letters, options), malformed)
    assert pa.compute.all(delta_rows(uri, options).column("id").is_valid()).as_py()
