"""PartitionFetcher against a scripted leader: sessions, errors, start and end positions.

Tansu never grants fetch sessions, sends no aborted-transaction lists, answers
ListOffsets wrongly and never cuts a batch at the size limit, so these paths
are checked here, over real Kafka framing, with a broker we script.
"""

from __future__ import annotations

import logging
import struct

import pyarrow as pa
import pytest

from ingest.errors import BrokerError, ConfigError
from ingest.protocol.messages import AbortedTransaction
from ingest.protocol.recordbatch.record_builder import Record, build_batch, control_batch
from ingest.worker.fetcher import PartitionFetcher
from ingest.worker.results import FetchResult, UnreadableCorruption
from ingest.worker.settings import EndPosition, StartPosition
from tests.worker.scripted import PartitionLog, ScriptedLeader, make_fetcher, values


def drain(
    fetcher: PartitionFetcher, *, polls: int = 50, prefetch: bool = True
) -> tuple[pa.Table, list[FetchResult]]:
    """Polls until the end position (or ``polls`` answers); returns the records."""
    results: list[FetchResult] = []
    for _ in range(polls):
        result = fetcher.poll(prefetch=prefetch)
        results.append(result)
        if result.finished:
            break
    batches = [r.batch for r in results if r.batch is not None]
    table = (
        pa.Table.from_batches(batches)
        if batches
        else pa.table({"offset": pa.array([], pa.int64())})
    )
    return table, results


def worker_warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    """The fetcher's warnings that contain ``text``."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "ingest.worker" and r.levelno == logging.WARNING and text in r.getMessage()
    ]


def three_batches(log: PartitionLog, *, per_batch: int = 10) -> None:
    for index in range(3):
        log.append(values(per_batch, start=index * per_batch))


def offsets(table: pa.Table) -> list[int]:
    values: list[int] = table.column("offset").to_pylist()
    return values


def test_records_come_out_once_in_order_with_every_field() -> None:
    with ScriptedLeader() as leader:
        three_batches(leader.log)
        fetcher = make_fetcher(leader, end=EndPosition.latest())
        table, _ = drain(fetcher)
        fetcher.cluster.close()
    assert offsets(table) == list(range(30))
    assert table.column("value").to_pylist()[12] == b"v0000000012"
    assert table.column("key").to_pylist()[12] == b"k12"
    assert table.column("headers").to_pylist()[12] == [{"key": "h", "value": b"12"}]
    assert table.column("timestamp").cast(pa.int64()).to_pylist()[12] == 1012
    assert fetcher.position == 30 and fetcher.finished


def test_granted_sessions_go_incremental_with_rising_epochs() -> None:
    with ScriptedLeader(grant_sessions=True) as leader:
        three_batches(leader.log)
        batch_size = len(leader.log.batches[0].data)
        fetcher = make_fetcher(leader, partition_max_bytes=batch_size)  # one batch a Fetch
        # 3 with data, then 3 finding nothing new; no prefetch, so every request is answered.
        table, _ = drain(fetcher, polls=6, prefetch=False)
        fetcher.cluster.close()
        fetches = leader.fetches
    assert offsets(table) == list(range(30))
    assert (fetches[0].session_id, fetches[0].epoch) == (0, 0)
    session_id = fetches[0].answered_session_id
    assert session_id != 0
    incremental = fetches[1:]
    assert [f.session_id for f in incremental] == [session_id] * len(incremental)
    assert [f.epoch for f in incremental] == list(range(1, len(incremental) + 1))
    # The partition is named while the position moves, left out once it stops.
    assert [f.offsets for f in incremental] == [(10,), (20,), (30,), (), ()]
    # Every incremental answer was taken in: each moved the session's epoch on by one.
    assert (fetcher.session.session_id, fetcher.session.epoch) == (
        session_id,
        len(incremental) + 1,
    )


def test_session_errors_fall_back_to_full_fetches_and_lose_nothing() -> None:
    with ScriptedLeader(grant_sessions=True) as leader:
        three_batches(leader.log)
        fetcher = make_fetcher(leader, partition_max_bytes=len(leader.log.batches[0].data))
        # No prefetch: each error hook meets the request the next poll sends.
        first = fetcher.poll(prefetch=False)
        session_id = leader.fetches[0].answered_session_id
        leader.fetch_top_errors = [70]  # FETCH_SESSION_ID_NOT_FOUND
        assert fetcher.poll(prefetch=False).rows == 0
        second = fetcher.poll(prefetch=False)
        renewed = leader.fetches[2].answered_session_id
        leader.fetch_top_errors = [71]  # INVALID_FETCH_SESSION_EPOCH
        assert fetcher.poll(prefetch=False).rows == 0
        third = fetcher.poll(prefetch=False)
        fetcher.cluster.close()
        seen = [(f.session_id, f.epoch, f.offsets) for f in leader.fetches]
    assert (first.rows, second.rows, third.rows) == (10, 10, 10)
    assert 0 != renewed != session_id
    assert seen == [
        (0, 0, (0,)),
        (session_id, 1, (10,)),  # answered FETCH_SESSION_ID_NOT_FOUND
        (0, 0, (10,)),  # a full fetch without an id, creating a new session
        (renewed, 1, (20,)),  # answered INVALID_FETCH_SESSION_EPOCH
        (renewed, 0, (20,)),  # close that session, open a new one
    ]
    assert fetcher.position == 30


def test_a_lost_connection_backs_off_and_resumes_from_the_position(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with ScriptedLeader(grant_sessions=True) as leader:
        three_batches(leader.log)
        leader.drop_connection_on_fetch = [2]
        fetcher = make_fetcher(
            leader, partition_max_bytes=len(leader.log.batches[0].data), end=EndPosition.offset(30)
        )
        with caplog.at_level(logging.WARNING, logger="ingest.worker"):
            table, results = drain(fetcher)
        fetcher.cluster.close()
        accepted = leader.peer.accepted
        after_drop = leader.fetches[2]
    assert offsets(table) == list(range(30))
    assert any(r.rows == 0 and not r.finished for r in results)  # the poll that lost it
    assert accepted == 2 and len(worker_warnings(caplog, "; resuming at offset")) == 1
    # KIP-227 after a network error: close the old session, ask for a new one.
    assert after_drop.epoch == 0 and after_drop.offsets == (10,)


def test_a_leader_change_refreshes_metadata_and_fetches_from_the_new_leader(
    caplog: pytest.LogCaptureFixture,
) -> None:
    shared = PartitionLog()
    three_batches(shared)
    with ScriptedLeader(shared, node_id=1) as old, ScriptedLeader(shared, node_id=2) as new:
        old.other_brokers = [(2, new.port)]
        fetcher = make_fetcher(old, partition_max_bytes=len(shared.batches[0].data))
        assert fetcher.poll(prefetch=False).rows == 10
        # The partition moves: the old leader says so and its metadata names the new one.
        old.fetch_partition_errors = [6]  # NOT_LEADER_OR_FOLLOWER
        old.leader = (2, new.port)
        before = old.metadata_requests
        with caplog.at_level(logging.WARNING, logger="ingest.worker"):
            table, _ = drain(fetcher, polls=6, prefetch=False)
        fetcher.cluster.close()
        assert old.metadata_requests > before
        assert [f.offsets for f in new.fetches][:2] == [(10,), (20,)]
    assert worker_warnings(caplog, "NOT_LEADER_OR_FOLLOWER")
    assert offsets(table) == list(range(10, 30))


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("earliest", 100), ("latest", 130)],
)
def test_offset_out_of_range_applies_the_reset_policy_and_logs_both_offsets(
    policy: str, expected: int, caplog: pytest.LogCaptureFixture
) -> None:
    log = PartitionLog()
    log.log_start = 100  # retention removed 0-99
    three_batches(log)
    with ScriptedLeader(log) as leader:
        fetcher = make_fetcher(leader, start=StartPosition.offset(5), auto_offset_reset=policy)
        with caplog.at_level(logging.WARNING, logger="ingest.worker"):
            result = fetcher.poll()
        table, _ = drain(fetcher, polls=4)
        fetcher.cluster.close()
    assert [(r.old_offset, r.new_offset, r.policy) for r in result.resets] == [
        (5, expected, policy)
    ]
    assert f"moves it from 5 to {expected}" in caplog.text
    assert offsets(table) == list(range(expected, 130))


def test_offset_out_of_range_with_fail_raises() -> None:
    log = PartitionLog()
    log.log_start = 100
    three_batches(log)
    with ScriptedLeader(log) as leader:
        fetcher = make_fetcher(leader, start=StartPosition.offset(5), auto_offset_reset="fail")
        with pytest.raises(BrokerError) as info:
            fetcher.poll()
        fetcher.cluster.close()
    assert info.value.name == "OFFSET_OUT_OF_RANGE" and not info.value.retriable
    assert "fetch offset 5" in str(info.value) and "log start 100" in str(info.value)


def test_a_batch_larger_than_the_fetch_size_raises_the_size(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with ScriptedLeader() as leader:
        leader.truncate_oversize = True  # a broker that cuts the batch at the limit
        leader.log.append(values(5))
        big = leader.log.append(values(200, start=5, size=50))
        leader.log.append(values(5, start=205))
        fetcher = make_fetcher(leader, partition_max_bytes=1024, end=EndPosition.offset(210))
        with caplog.at_level(logging.WARNING, logger="ingest.worker"):
            table, _ = drain(fetcher)
        fetcher.cluster.close()
        asked = [f.partition_max_bytes[0] for f in leader.fetches if f.offsets]
    assert offsets(table) == list(range(210))
    doubled = 1024
    while doubled < len(big.data):
        doubled *= 2
    assert fetcher.partition_max_bytes == doubled  # doubled up to the batch, not beyond
    assert asked[0] == 1024 and asked[-1] == fetcher.partition_max_bytes
    assert len(worker_warnings(caplog, "larger than the fetch size")) == 1


def test_a_batch_above_the_size_limit_is_a_config_error_not_a_stall() -> None:
    with ScriptedLeader() as leader:
        leader.truncate_oversize = True
        leader.log.append(values(200, size=50))
        fetcher = make_fetcher(leader, partition_max_bytes=1024, max_fetch_bytes_limit=4096)
        with pytest.raises(ConfigError, match="above the fetch size limit of 4096"):
            drain(fetcher)
        fetcher.cluster.close()


def test_a_corrupt_batch_is_reported_with_its_bytes_and_skipped_once() -> None:
    with ScriptedLeader() as leader:
        leader.log.append(values(10))
        bad = build_batch(values(10, start=10), base_offset=10, record_count=11)  # one missing
        leader.log.append_raw(bad, count=10)
        leader.log.append(values(10, start=20))
        fetcher = make_fetcher(leader, end=EndPosition.offset(30))
        table, results = drain(fetcher)
        fetcher.cluster.close()
        fetch_count = len(leader.fetches)
    corrupt = [c for r in results for c in r.corrupt]
    assert [(c.first_offset, c.last_offset, c.kind) for c in corrupt] == [(10, 19, "structure")]
    assert corrupt[0].raw == bad
    assert "declares 11 records" in corrupt[0].reason
    assert offsets(table) == list(range(10)) + list(range(20, 30))
    assert fetch_count <= 3  # no refetching of the bad batch (one end probe, one or two Fetches)


def test_unreadable_framing_is_reported_and_raised_not_retried_forever() -> None:
    with ScriptedLeader() as leader:
        leader.log.append(values(10))
        garbage = struct.pack(">qi", 10, 5) + b"\x00" * 40  # length 5: no batch is that short
        leader.log.append_raw(garbage, count=10)
        fetcher = make_fetcher(leader)
        first = fetcher.poll()
        with pytest.raises(UnreadableCorruption) as info:
            fetcher.poll()
        fetcher.cluster.close()
    assert first.rows == 10 and first.corrupt == ()  # seen again at the next position
    report = info.value.corrupt
    assert (report.first_offset, report.last_offset, report.kind) == (10, None, "framing")
    assert report.raw == garbage
    assert fetcher.position == 10


def transactional_log() -> PartitionLog:
    """offsets 0-2: producer 7, aborted (marker 3); 4-5: producer 8, committed (marker 6);
    7-8: not transactional."""
    log = PartitionLog()
    log.append(values(3), transactional=True, producer_id=7, producer_epoch=0)
    log.append_raw(control_batch("abort", base_offset=3, producer_id=7), count=1)
    log.append(values(2, start=4), transactional=True, producer_id=8, producer_epoch=0)
    log.append_raw(control_batch("commit", base_offset=6, producer_id=8), count=1)
    log.append(values(2, start=7))
    return log


@pytest.mark.parametrize(
    ("isolation", "expected"),
    [("read_committed", [4, 5, 7, 8]), ("read_uncommitted", [0, 1, 2, 4, 5, 7, 8])],
)
def test_read_committed_drops_aborted_transactions(isolation: str, expected: list[int]) -> None:
    with ScriptedLeader(transactional_log()) as leader:
        leader.aborted = [AbortedTransaction(producer_id=7, first_offset=0)]
        fetcher = make_fetcher(leader, isolation_level=isolation, end=EndPosition.offset(9))
        table, _ = drain(fetcher)
        fetcher.cluster.close()
        levels = {f.isolation_level for f in leader.fetches if f.offsets}
    assert offsets(table) == expected
    assert levels == {1 if isolation == "read_committed" else 0}
    assert fetcher.position == 9


@pytest.mark.parametrize("answer", ["right", "tansu"])
def test_latest_start_is_never_below_the_fetch_high_watermark(answer: str) -> None:
    with ScriptedLeader() as leader:
        three_batches(leader.log)
        if answer == "tansu":
            # Tansu: the newest batch's base offset + 1, not the log end.
            leader.latest_answer = lambda end: leader.log.batches[-1].base_offset + 1
        fetcher = make_fetcher(leader, start=StartPosition.latest())
        assert fetcher.start() == 30
        leader.log.append(values(5, start=30))
        table, _ = drain(fetcher, polls=3)
        fetcher.cluster.close()
    assert offsets(table) == list(range(30, 35))


def test_latest_start_for_read_committed_is_the_last_stable_offset() -> None:
    with ScriptedLeader() as leader:
        three_batches(leader.log)
        leader.last_stable_offset = 20  # a transaction is open from offset 20
        fetcher = make_fetcher(leader, start=StartPosition.latest())
        assert fetcher.start() == 20
        fetcher.cluster.close()


def out_of_order_log() -> PartitionLog:
    """Timestamps 1000 + offset, except offset 22, stamped 500 (a late producer clock)."""
    log = PartitionLog()
    log.append(values(10))
    log.append(values(10, start=10))
    records = values(10, start=20)
    records[2] = Record(value=records[2].value, key=records[2].key, timestamp=500)
    log.append(records)
    return log


@pytest.mark.parametrize("answer", ["right", "tansu"])
def test_timestamp_start_skips_until_the_first_record_at_the_target(answer: str) -> None:
    with ScriptedLeader(out_of_order_log()) as leader:
        if answer == "tansu":
            leader.timestamp_answer = lambda _ts: 0  # store time: too early
        fetcher = make_fetcher(
            leader, start=StartPosition.timestamp(1015), end=EndPosition.latest()
        )
        table, _ = drain(fetcher)
        fetcher.cluster.close()
    # Offset 15 is the first at or after 1015; 22 (stamped 500) comes after it, so it is read.
    assert offsets(table) == list(range(15, 30))


def test_an_end_offset_cuts_the_run() -> None:
    with ScriptedLeader() as leader:
        three_batches(leader.log)
        fetcher = make_fetcher(leader, end=EndPosition.offset(17))
        table, results = drain(fetcher)
        fetcher.cluster.close()
    assert offsets(table) == list(range(17))
    assert results[-1].finished and fetcher.position == 17


def test_an_end_timestamp_stops_before_the_first_record_at_it() -> None:
    with ScriptedLeader(out_of_order_log()) as leader:
        fetcher = make_fetcher(leader, end=EndPosition.timestamp(1012))
        table, results = drain(fetcher)
        fetcher.cluster.close()
    assert offsets(table) == list(range(12))
    assert results[-1].finished and fetcher.position == 12


def test_an_end_timestamp_never_waits_past_the_end_at_start() -> None:
    with ScriptedLeader() as leader:
        three_batches(leader.log)
        fetcher = make_fetcher(leader, end=EndPosition.timestamp(10**12))
        table, results = drain(fetcher)
        fetcher.cluster.close()
    assert offsets(table) == list(range(30))
    assert results[-1].finished and fetcher.position == 30


def test_a_broker_without_sessions_gets_full_fetches_naming_the_partition() -> None:
    with ScriptedLeader(grant_sessions=False) as leader:
        three_batches(leader.log)
        fetcher = make_fetcher(leader, partition_max_bytes=len(leader.log.batches[0].data))
        table, _ = drain(fetcher, polls=5, prefetch=False)
        fetcher.cluster.close()
        seen = [(f.session_id, f.epoch, f.offsets) for f in leader.fetches]
    assert offsets(table) == list(range(30))
    assert seen == [(0, 0, (o,)) for o in (0, 10, 20, 30, 30)]
