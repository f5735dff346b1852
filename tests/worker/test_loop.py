"""PartitionWorker in this process, over a scripted leader: backpressure, controls, resets."""

from __future__ import annotations

import itertools
import queue
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ingest.handoff import HandoffConfig, HandoffStore, SegmentWriter
from ingest.protocol.recordbatch.record_builder import build_batch
from ingest.worker.loop import ControlInbox, PartitionWorker
from ingest.worker.parent_messages import (
    BackpressureChanged,
    Control,
    CorruptRangeReported,
    Event,
    OffsetResetApplied,
    Pause,
    Release,
    Resume,
    SegmentSealed,
    StopAfterSeal,
    StopNow,
    WorkerFinished,
    WorkerStarted,
)
from ingest.worker.results import FetchResult, UnreadableCorruption
from ingest.worker.settings import EndPosition, StartPosition
from tests.worker.scripted import TOPIC, PartitionLog, ScriptedLeader, make_fetcher, values


class WatchedInbox(ControlInbox):
    """Tells the test when the loop goes idle: it only waits on its inbox while paused,
    with no Fetch in flight and the open segment sealed."""

    def __init__(self) -> None:
        super().__init__()
        self.idle = threading.Event()

    def put(self, control: Control) -> None:
        if isinstance(control, Pause):
            self.idle.clear()
        super().put(control)

    def wait(self, timeout: float) -> None:
        self.idle.set()
        super().wait(timeout)


class MeasuredWorker(PartitionWorker):
    """Records the most unreleased bytes the worker held: after it takes in each Fetch
    answer, and before each seal (which may come at the end of taking one in)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_unacked_seen = 0

    def _measure(self) -> None:
        self.max_unacked_seen = max(self.max_unacked_seen, self.unacked_bytes)

    def _take(self, result: FetchResult) -> None:
        super()._take(result)
        self._measure()

    def _seal(self, next_offset: int | None = None) -> None:
        self._measure()
        super()._seal(next_offset)


class Running:
    """A PartitionWorker on a thread; the test plays its parent."""

    def __init__(
        self,
        leader: ScriptedLeader,
        store: HandoffStore,
        *,
        start: StartPosition | None = None,
        end: EndPosition | None = None,
        max_unacked_bytes: int = 1 << 30,
        resume_unacked_bytes: int = 1 << 29,
        **fetch: Any,
    ) -> None:
        self.fetcher = make_fetcher(leader, start=start, end=end, **fetch)
        self.writer = SegmentWriter(store.location, TOPIC, 0)
        self.events: queue.Queue[Event] = queue.Queue()
        self.inbox = WatchedInbox()
        self.worker = MeasuredWorker(
            self.fetcher,
            self.writer,
            self._emit,
            self.inbox,
            max_unacked_bytes=max_unacked_bytes,
            resume_unacked_bytes=resume_unacked_bytes,
        )
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _emit(self, event: Event) -> None:
        if isinstance(event, BackpressureChanged) and event.paused:
            self.inbox.idle.clear()  # on the loop's thread: before it can go idle
        self.events.put(event)

    def wait_idle(self) -> None:
        assert self.inbox.idle.wait(5), "the worker never went idle"

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:
            self.error = exc
        finally:
            self.fetcher.cluster.close()

    def next_event(self, timeout: float = 5.0) -> Event:
        return self.events.get(timeout=timeout)

    def until(self, kind: type[Any], timeout: float = 5.0) -> tuple[Any, list[Event]]:
        seen: list[Event] = []
        deadline = time.monotonic() + timeout
        while True:
            event = self.events.get(timeout=max(deadline - time.monotonic(), 0.01))
            if isinstance(event, kind):
                return event, seen
            seen.append(event)

    def join(self, timeout: float = 5.0) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[HandoffStore]:
    config = HandoffConfig(root=str(tmp_path), segment_max_bytes=8_000, segment_max_age=30.0)
    with HandoffStore(config) as opened:
        yield opened


def read_all(store: HandoffStore, segments: list[SegmentSealed]) -> pa.Table:
    return pa.concat_tables([store.read(s.uri) for s in segments])


def check_tiling(segments: list[SegmentSealed], start: int, end: int) -> None:
    assert segments[0].from_offset == start and segments[-1].next_offset == end
    for before, after in itertools.pairwise(segments):
        assert after.from_offset == before.next_offset


def test_backpressure_stops_at_the_cap_resumes_on_release_and_loses_nothing(
    store: HandoffStore,
) -> None:
    with ScriptedLeader() as leader:
        for index in range(40):
            leader.log.append(values(20, start=index * 20, size=100))  # ~2.7 KB a batch
        batch_bytes = len(leader.log.batches[0].data)
        running = Running(
            leader,
            store,
            end=EndPosition.offset(800),
            max_unacked_bytes=20_000,
            resume_unacked_bytes=10_000,
            partition_max_bytes=2 * batch_bytes,
        )
        segments: list[SegmentSealed] = []
        read: list[int] = []
        unreleased: list[SegmentSealed] = []
        pauses = resumes = 0
        most_unreleased = 0
        while True:
            event = running.next_event()
            if isinstance(event, SegmentSealed):
                segments.append(event)
                unreleased.append(event)
                read.extend(store.read(event.uri).column("offset").to_pylist())
            elif isinstance(event, BackpressureChanged):
                if event.paused:
                    pauses += 1
                    # Paused: the Fetch in flight is taken in and the open segment is
                    # sealed so that it can be released, then nothing more arrives
                    # until we release.
                    fetches = len(leader.fetches)
                    running.wait_idle()
                    assert len(leader.fetches) <= fetches + 1
                    while not running.events.empty():
                        sealed = running.next_event()
                        assert isinstance(sealed, SegmentSealed)
                        segments.append(sealed)
                        unreleased.append(sealed)
                        read.extend(store.read(sealed.uri).column("offset").to_pylist())
                    fetches = len(leader.fetches)
                    time.sleep(0.1)
                    assert len(leader.fetches) == fetches and running.events.empty()
                    most_unreleased = max(most_unreleased, sum(s.bytes for s in unreleased))
                    running.inbox.put(Release(tuple(s.segment_id for s in unreleased)))
                    store.release(s.segment_id for s in unreleased)
                    unreleased.clear()
                else:
                    resumes += 1
            elif isinstance(event, WorkerFinished):
                break
            most_unreleased = max(most_unreleased, sum(s.bytes for s in unreleased))
        running.join()
    assert running.error is None
    assert pauses >= 3 and resumes == pauses
    # Soft cap: exceeded by at most one Fetch answer's worth of records.
    assert running.worker.max_unacked_seen < 20_000 + 3 * batch_bytes
    assert most_unreleased < 20_000 + 3 * batch_bytes
    check_tiling(segments, 0, 800)
    assert read == list(range(800))


def test_pause_stops_fetching_until_resume(store: HandoffStore) -> None:
    with ScriptedLeader() as leader:
        leader.log.append(values(10))
        running = Running(leader, store, max_wait_ms=10)
        wait_for_records(running, 10)
        running.inbox.put(Pause())
        running.wait_idle()  # the Fetch in flight, if any, is taken in
        fetches = len(leader.fetches)
        time.sleep(0.3)
        assert len(leader.fetches) == fetches
        leader.log.append(values(10, start=10))
        running.inbox.put(Resume())
        wait_for_records(running, 20)
        assert len(leader.fetches) > fetches
        running.inbox.put(StopAfterSeal())
        finished, seen = running.until(WorkerFinished)
        running.join()
    segments = [e for e in seen if isinstance(e, SegmentSealed)]
    assert finished.reason == "stopped"
    assert finished.next_offset == segments[-1].next_offset == 20
    check_tiling(segments, 0, 20)
    assert read_all(store, segments).column("offset").to_pylist() == list(range(20))


def test_a_pause_that_comes_while_a_fetch_is_in_flight_stops_the_next_one(
    store: HandoffStore,
) -> None:
    """The answer in flight is taken in, but no Fetch follows it: the parent's pause is
    heard before the loop gets back to its inbox (the global cap's overshoot)."""
    with ScriptedLeader() as leader:
        leader.log.append(values(10))
        running = Running(leader, store, max_wait_ms=10)
        wait_for_records(running, 10)
        held = leader.hold_answer[len(leader.fetches) + 2] = threading.Event()
        deadline = time.monotonic() + 5
        while len(leader.fetches) < max(leader.hold_answer):
            assert time.monotonic() < deadline, "the held Fetch never came"
            time.sleep(0.005)
        running.inbox.put(Pause())  # the loop is inside poll(), waiting on the held answer
        in_flight = len(leader.fetches)
        held.set()
        running.wait_idle()
        assert len(leader.fetches) == in_flight
        running.inbox.put(StopNow())
        running.until(WorkerFinished)
        running.join()


def wait_for_records(running: Running, count: int) -> None:
    deadline = time.monotonic() + 5
    while running.worker.records < count:
        assert time.monotonic() < deadline, f"{running.worker.records} records, not {count}"
        time.sleep(0.01)


def test_stop_now_drops_the_open_segment(store: HandoffStore) -> None:
    with ScriptedLeader() as leader:
        leader.log.append(values(10))
        running = Running(leader, store, max_wait_ms=10)
        deadline = time.monotonic() + 5
        while running.writer.open_bytes == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        running.inbox.put(StopNow())
        finished, seen = running.until(WorkerFinished)
        running.join()
    assert finished.reason == "stop_now" and finished.next_offset == 0
    assert [e for e in seen if isinstance(e, SegmentSealed)] == []
    assert store.visible() == [] and store.temporary_files() == []


def test_an_offset_reset_seals_first_then_starts_a_new_span(store: HandoffStore) -> None:
    with ScriptedLeader() as leader:
        leader.log.append(values(10))
        leader.log.append(values(10, start=10))
        running = Running(leader, store, max_wait_ms=10)
        wait_for_records(running, 20)
        # Retention removes offsets 0-24 while the worker waits at 20.
        leader.log.log_start = 25
        leader.log.batches = []
        leader.log.append_raw(
            build_batch(values(10, start=20), base_offset=20), count=10, base_offset=20
        )
        leader.log.append(values(10, start=30))
        reset, before = running.until(OffsetResetApplied)
        wait_for_records(running, 35)
        running.inbox.put(StopAfterSeal())
        finished, after = running.until(WorkerFinished)
        running.join()
    segments = [e for e in before + after if isinstance(e, SegmentSealed)]
    assert (reset.old_offset, reset.new_offset, reset.policy) == (20, 25, "earliest")
    # The segment before the reset was sealed first, ending where the old position was.
    assert isinstance(before[-1], SegmentSealed) and before[-1].next_offset == 20
    assert [(s.from_offset, s.next_offset) for s in segments] == [(0, 20), (25, 40)]
    table = read_all(store, segments)
    # The batch holding 25 starts at 20: records below the new position are dropped.
    assert table.column("offset").to_pylist() == list(range(20)) + list(range(25, 40))
    assert finished.next_offset == 40


def test_a_corrupt_batch_becomes_a_side_file_between_good_segments(store: HandoffStore) -> None:
    with ScriptedLeader() as leader:
        leader.log.append(values(10))
        bad = build_batch(values(10, start=10), base_offset=10, record_count=11)
        leader.log.append_raw(bad, count=10)
        leader.log.append(values(10, start=20))
        running = Running(leader, store, end=EndPosition.offset(30))
        finished, seen = running.until(WorkerFinished)
        running.join()
    reports = [e for e in seen if isinstance(e, CorruptRangeReported)]
    segments = [e for e in seen if isinstance(e, SegmentSealed)]
    assert [(r.first_offset, r.last_offset, r.kind) for r in reports] == [(10, 19, "structure")]
    assert Path(reports[0].uri).read_bytes() == bad
    table = read_all(store, segments)
    assert table.column("offset").to_pylist() == list(range(10)) + list(range(20, 30))
    check_tiling(segments, 0, 30)
    assert finished.reason == "end"


def test_unreadable_framing_publishes_what_came_before_then_fails(store: HandoffStore) -> None:
    with ScriptedLeader() as leader:
        leader.log.append(values(10))
        garbage = struct.pack(">qi", 10, 3) + b"\xff" * 20
        leader.log.append_raw(garbage, count=5)
        running = Running(leader, store)
        segment, _ = running.until(SegmentSealed)
        report, _ = running.until(CorruptRangeReported)
        running.join()
    assert isinstance(running.error, UnreadableCorruption)
    assert (segment.first_offset, segment.last_offset, segment.next_offset) == (0, 9, 10)
    assert (report.first_offset, report.last_offset) == (10, None)
    assert Path(report.uri).read_bytes() == garbage


def test_a_partition_log_that_grows_while_running_is_followed(store: HandoffStore) -> None:
    log = PartitionLog()
    with ScriptedLeader(log) as leader:
        running = Running(leader, store, max_wait_ms=10, start=StartPosition.latest())
        started, _ = running.until(WorkerStarted)
        assert started.start_offset == 0  # resolved before anything was appended
        log.append(values(10))
        log.append(values(10, start=10))
        wait_for_records(running, 20)
        running.inbox.put(StopAfterSeal())
        finished, seen = running.until(WorkerFinished)
        running.join()
    segments = [e for e in seen if isinstance(e, SegmentSealed)]
    assert read_all(store, segments).column("offset").to_pylist() == list(range(20))
    assert finished.next_offset == 20


def test_a_fetch_answer_larger_than_a_segment_is_split_at_the_bound(store: HandoffStore) -> None:
    with ScriptedLeader() as leader:
        leader.log.append(values(2000, size=100))  # one batch, ~250 KB decoded; bound 8 KB
        running = Running(leader, store, end=EndPosition.offset(2000))
        finished, seen = running.until(WorkerFinished)
        running.join()
    segments = [e for e in seen if isinstance(e, SegmentSealed)]
    assert len(segments) > 20
    assert all(s.bytes <= 1.25 * 8_000 for s in segments)
    check_tiling(segments, 0, 2000)
    assert read_all(store, segments).column("offset").to_pylist() == list(range(2000))
    assert finished.next_offset == 2000
