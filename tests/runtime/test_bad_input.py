"""Bad input end to end: a leader serving broken batches and bad values, through
``ingest replay`` (no group needed) into Delta. Each bad record or batch becomes a
dead-letter row with its provenance; every offset ends in exactly one table.

A real broker re-validates what it stores, so the broken batches come from a
scripted leader speaking the Kafka protocol over TCP (tests/worker/scripted.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from ingest.protocol.recordbatch.record_builder import Record, build_batch
from ingest.sink.deadletter import STAGE_CORRUPT, STAGE_DECODE
from ingest.supervisor.modes.replay import Position, replay_run
from ingest.supervisor.output.progress import Progress
from tests.runtime.support import config, write_config
from tests.worker.scripted import TOPIC, ScriptedLeader

pytestmark = pytest.mark.spark

MAGIC_AT = 16  # base offset (8) + batch length (4) + leader epoch (4)
FIRST_RECORD_AT = 61  # the v2 batch header is 61 bytes; the first record's length follows


def good(start: int, count: int) -> list[Record]:
    return [
        Record(value=b'{"id": %d, "amount": %d.5}' % (n, n), key=b"k%d" % n, timestamp=1000 + n)
        for n in range(start, start + count)
    ]


BAD_VALUES = {
    22: (b'{"id": 22, "amount": ', "JSON parse error"),
    23: (b"[1, 2]", "not a JSON object"),
    24: (b'{"id": "twenty-four", "amount": 1.0}', "changed from number to string"),
    26: (b"\xff\xfe{", "not valid UTF-8"),
}


def with_bad_values(start: int, count: int) -> list[Record]:
    records = good(start, count)
    for offset, (value, _) in BAD_VALUES.items():
        records[offset - start] = Record(value=value, key=b"bad", timestamp=1000 + offset)
    return records


def unknown_magic(start: int, count: int) -> bytes:
    data = bytearray(build_batch(good(start, count), base_offset=start))
    data[MAGIC_AT] = 7
    return bytes(data)


def record_overruns_its_batch(start: int, count: int) -> bytes:
    data = bytearray(build_batch(good(start, count), base_offset=start))
    data[FIRST_RECORD_AT] = 0x7E  # zigzag 63: longer than the records that follow hold
    return bytes(data)


def miscounted(start: int, count: int) -> bytes:
    return build_batch(good(start, count), base_offset=start, record_count=count + 1)


def test_broken_batches_and_bad_values_become_dead_letters_with_provenance(
    spark: Any, tmp_path: Path
) -> None:
    with ScriptedLeader() as leader:
        log = leader.log
        log.append(good(0, 10))  # 0-9
        magic = log.append_raw(unknown_magic(10, 10), count=10)  # 10-19
        log.append(with_bad_values(20, 10))  # 20-29
        counted = log.append_raw(miscounted(30, 10), count=10)  # 30-39
        overrun = log.append_raw(record_overruns_its_batch(40, 10), count=10)  # 40-49
        log.append(good(50, 10))  # 50-59
        path = write_config(
            tmp_path / "bad.toml",
            bootstrap=leader.bootstrap,
            topic=TOPIC,
            group="g-bad-input",
            table=tmp_path / "table",
            sections={"table.value": {"format": "json", "schema": "id BIGINT, amount DOUBLE"}},
        )
        cfg = config(path)
        outcome = replay_run(
            cfg,
            start=Position("earliest"),
            spark=spark,
            progress=Progress("replay"),
        ).run()
    assert outcome.exit_code == 0, outcome.message

    rows = DeltaTable(str(tmp_path / "table")).to_pyarrow_table()
    landed = sorted(rows.column("offset").to_pylist())
    bad_offsets = set(BAD_VALUES)
    assert landed == [
        o for o in [*range(10), *range(20, 30), *range(50, 60)] if o not in bad_offsets
    ]
    assert rows.filter(pc.equal(rows.column("offset"), 25)).column("amount").to_pylist() == [25.5]

    dead = DeltaTable(cfg.dead_letter_uri()).to_pyarrow_table().sort_by("offset")
    by_offset = {row["offset"]: row for row in dead.to_pylist()}
    # Bad values: one row each, with the raw value, key, timestamp and the reason.
    for offset, (value, reason) in BAD_VALUES.items():
        row = by_offset[offset]
        assert (row["topic"], row["partition"], row["value"], row["key"]) == (
            TOPIC,
            0,
            value,
            b"bad",
        )
        assert row["error_stage"] == STAGE_DECODE and reason in row["error_message"]
        assert row["timestamp"] is not None
    # Broken batches: one row each, holding the batch's bytes and its offset range.
    for first, batch, words in (
        (10, magic, "unknown magic 7"),
        (30, counted, "declares 11 records"),
        (40, overrun, "fields end before its declared length"),
    ):
        row = by_offset[first]
        assert row["value"] == batch.data
        assert row["error_stage"] == STAGE_CORRUPT
        assert f"(offsets {first}-{first + 9})" in row["error_message"]
        assert words in row["error_message"], row["error_message"]
    assert sorted(by_offset) == sorted([10, 30, 40, *bad_offsets])
    # Every offset is accounted for once: landed, a bad value, or inside a broken batch.
    accounted = landed + sorted(bad_offsets) + [*range(10, 20), *range(30, 50)]
    assert sorted(accounted) == list(range(60))
