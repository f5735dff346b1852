"""The fetch loop of one partition: start position, Fetch requests, decoding, recovery.

``PartitionFetcher.poll()`` sends a Fetch to the partition's leader, decodes
the answer into one Arrow RecordBatch (``ingest.protocol.records``) and moves
its position past it. With ``prefetch`` it sends the next Fetch before
returning, so the broker works on it while the caller writes the batch out;
only one Fetch is ever in flight, and the position only moves when an answer
has been processed, so an unprocessed prefetch can always be dropped.

Start positions, and how they stay right on brokers that answer ListOffsets
wrongly (the test broker, Tansu 0.6.0, does; docs/kafka-compat.md):

* committed offset: used as given; if it is out of range, ``auto_offset_reset``.
* earliest: ListOffsets(EARLIEST).
* latest: ListOffsets(LATEST), then a Fetch at that offset; the start is the
  larger of the ListOffsets answer and that Fetch's high watermark (its last
  stable offset for read_committed). On Kafka they are equal; Tansu answers
  ListOffsets with the newest batch's base offset + 1, which is too small,
  while its Fetch high watermark is right.
* timestamp: ListOffsets(T), then, in the decoded batches, records are skipped
  until the first one whose timestamp is >= T. On Kafka the answer already is
  that record, so nothing is skipped; Tansu looks up the time a batch was
  stored, which is at or after its records' CreateTime, so its answer is at or
  before the right record and the skip corrects it. (Not correctable this way:
  a broker answering too late, e.g. a producer clock ahead of Tansu's.)
  "Skip until the first match" rather than "drop every record below T" keeps
  Kafka's meaning when timestamps are out of order: everything after the
  start record is read.

Errors: OFFSET_OUT_OF_RANGE applies ``auto_offset_reset`` (logged with both
offsets and returned as an ``OffsetReset``); leader errors drop the leader
cache and the fetch session, then retry after a backoff; a lost connection
backs off and resumes from the position; a batch larger than the fetch size
doubles the size (up to ``max_fetch_bytes_limit``) instead of stalling; corrupt
batches come back as ``CorruptRange`` with their raw bytes and the position
moves past them. Broken framing whose end cannot be read cannot be skipped
without guessing, so it is reported and raised (``UnreadableCorruption``).

Incremental fetch sessions (KIP-227) are used when the broker grants one;
``FetchSession`` is the client's state machine, as in Kafka's Java client.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ingest.client.backoff import Backoff
from ingest.client.cluster import LEADER_ERRORS, Cluster, TopicPartition
from ingest.client.connection import BrokerConnection, InFlight, expect_response
from ingest.errors import (
    BrokerError,
    BrokerFaultError,
    ConfigError,
    CorruptBatchError,
    KafkaConnectionError,
    ProtocolError,
)
from ingest.protocol.error_codes import ErrorCode, error_for
from ingest.protocol.messages import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    PartitionData,
)
from ingest.protocol.records import RECORD_SCHEMA, DecodedRecords, decode_records
from ingest.worker.settings import EndPosition, FetchSettings, StartPosition

__all__ = [
    "CorruptRange",
    "FetchResult",
    "FetchSession",
    "OffsetReset",
    "PartitionFetcher",
    "UnreadableCorruption",
]

log = logging.getLogger("ingest.worker")

FINAL_EPOCH = -1
INITIAL_EPOCH = 0
_INT32_MAX = 2**31 - 1
_SESSION_ERRORS = frozenset(
    {
        ErrorCode.FETCH_SESSION_ID_NOT_FOUND,
        ErrorCode.INVALID_FETCH_SESSION_EPOCH,
        ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR,
    }
)
_OFFSET_COLUMN = RECORD_SCHEMA.get_field_index("offset")
_TIMESTAMP_COLUMN = RECORD_SCHEMA.get_field_index("timestamp")
_PROBE_MAX_WAIT_MS = 10
# Frame overhead kept free below max_frame_size when a fetch size grows.
_FRAME_HEADROOM = 64 * 1024

PartitionState = tuple[int, int, int]  # fetch_offset, partition_max_bytes, leader epoch


@dataclass(frozen=True, slots=True)
class CorruptRange:
    """Offsets of a batch that could not be decoded, with its exact bytes."""

    first_offset: int
    last_offset: int | None
    raw: bytes
    reason: str
    kind: str


@dataclass(frozen=True, slots=True)
class OffsetReset:
    old_offset: int
    new_offset: int
    policy: str
    reason: str


@dataclass(frozen=True, slots=True)
class FetchResult:
    """What one poll produced. ``batch`` is None when no record came back."""

    batch: pa.RecordBatch | None
    position: int
    high_watermark: int
    corrupt: tuple[CorruptRange, ...] = ()
    resets: tuple[OffsetReset, ...] = ()
    finished: bool = False
    fetched_bytes: int = 0

    @property
    def rows(self) -> int:
        return 0 if self.batch is None else self.batch.num_rows


class UnreadableCorruption(CorruptBatchError):
    """Broken framing at the fetch position: its end cannot be read, so the rest of
    the partition cannot be reached without guessing. ``corrupt`` is the report."""

    def __init__(self, message: str, corrupt: CorruptRange) -> None:
        super().__init__(message, base_offset=corrupt.first_offset)
        self.corrupt = corrupt


def _int64_values(array: pa.Array) -> np.ndarray:
    return np.frombuffer(
        array.buffers()[1], dtype=np.int64, count=len(array), offset=array.offset * 8
    )


# -- KIP-227 ----------------------------------------------------------------------------


def next_epoch(epoch: int) -> int:
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == _INT32_MAX else epoch + 1


class FetchSession:
    """The client side of an incremental fetch session for one partition on one broker.

    Pure: the fetcher asks ``next_request`` what to send and reports answers
    and failures. Mirrors Kafka's FetchSessionHandler: a full fetch with epoch
    0 asks the broker for a session; a non-zero session id in the answer grants
    it and later requests are incremental (epoch 1, 2, ... wrapping to 1), naming
    the partition only when its fetch state changed. FETCH_SESSION_ID_NOT_FOUND
    starts over with (0, 0); other errors and lost connections ask to close the
    session and open a new one (same id, epoch 0). A broker that never grants a
    session (answers 0) just gets full fetches. Disabled, every request is a
    session-less full fetch (0, -1).
    """

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.session_id = 0
        self.epoch = INITIAL_EPOCH if enabled else FINAL_EPOCH
        self._held: PartitionState | None = None  # what the broker's session holds
        self._pending: PartitionState | None = None
        self._pending_full = True
        self.sessions_granted = 0

    def __repr__(self) -> str:
        return f"FetchSession(id={self.session_id}, epoch={self.epoch})"

    @property
    def is_full(self) -> bool:
        return self.epoch in (INITIAL_EPOCH, FINAL_EPOCH)

    def next_request(self, state: PartitionState) -> tuple[int, int, bool]:
        """(session_id, session_epoch, include the partition) for the next Fetch."""
        full = self.is_full
        self._pending = state
        self._pending_full = full
        return self.session_id, self.epoch, full or state != self._held

    def on_response(self, error_code: int, session_id: int) -> None:
        """An answer arrived with this top-level error code and session id."""
        if not self.enabled:
            return
        if error_code:
            if error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND:
                self.session_id, self.epoch = 0, INITIAL_EPOCH
            else:
                self.epoch = INITIAL_EPOCH
            self._held = None
            return
        if session_id == 0:
            # No session granted, or the broker closed ours: full fetches from now on.
            self.session_id, self.epoch, self._held = 0, INITIAL_EPOCH, None
            return
        if self._pending_full:
            self.session_id, self.epoch = session_id, 1
            self.sessions_granted += 1
        else:
            self.epoch = next_epoch(self.epoch)
        self._held = self._pending

    def on_transport_error(self) -> None:
        """The request or its answer was lost: close the session, try a new one."""
        if self.enabled:
            self.epoch = INITIAL_EPOCH
        self._held = None

    def reset(self) -> None:
        """A different broker (a new leader): no session there yet."""
        self.session_id = 0
        self.epoch = INITIAL_EPOCH if self.enabled else FINAL_EPOCH
        self._held = None


# -- the fetcher ------------------------------------------------------------------------


@dataclass
class FetcherStats:
    fetches: int = 0
    fetched_bytes: int = 0
    records: int = 0
    empty_fetches: int = 0
    errors: int = 0
    reconnects: int = 0
    size_raises: int = 0
    session_fetches: int = 0
    error_names: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Sent:
    connection: BrokerConnection
    ticket: InFlight
    fetch_offset: int
    incremental: bool


class PartitionFetcher:
    """Fetches one partition from its leader. Single-owner; starts no thread."""

    def __init__(
        self,
        cluster: Cluster,
        topic: str,
        partition: int,
        settings: FetchSettings,
        *,
        start: StartPosition,
        end: EndPosition | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        self.tp = TopicPartition(topic, partition)
        self.settings = settings
        self.start_position = start
        self.end_position = end
        self._clock = clock
        self._sleep = sleep
        config = cluster.config
        self._backoff = Backoff(
            config.retry_backoff,
            max(config.retry_backoff, config.reconnect_backoff_max),
            jitter=config.backoff_jitter,
            clock=clock,
        )
        self.session = FetchSession(enabled=settings.incremental_sessions)
        self.position: int | None = None
        self.high_watermark = -1
        self.last_stable_offset = -1
        self.log_start_offset = -1
        self.finished = False
        self.end_offset: int | None = None
        self.end_timestamp: int | None = None
        self.seek_timestamp: int | None = None
        # read_committed: producers whose handed-on data has no marker yet (transactions.py)
        self._open_transactions: dict[int, int] = {}
        self.partition_max_bytes = settings.partition_max_bytes
        self.max_bytes = max(settings.max_bytes, settings.partition_max_bytes)
        self._connection: BrokerConnection | None = None
        self._sent: _Sent | None = None
        self._throttled_until = float("-inf")
        self._warned_past_end = False
        self.stats = FetcherStats()

    def __repr__(self) -> str:
        return (
            f"PartitionFetcher({self.tp}, position={self.position}, "
            f"high_watermark={self.high_watermark}, {self.session!r})"
        )

    @property
    def in_flight(self) -> bool:
        return self._sent is not None

    def close(self) -> None:
        """Forgets a Fetch in flight (its answer is dropped when it arrives)."""
        sent, self._sent = self._sent, None
        if sent is not None and sent.connection.connected:
            sent.connection.close("fetcher closed with a Fetch in flight")

    # -- start and end ------------------------------------------------------------------

    def start(self) -> int:
        """Resolves the start (and end) position; returns the start offset. Idempotent."""
        if self.position is not None:
            return self.position
        start = self.start_position
        if start.kind == "offset":
            assert start.value is not None
            position = start.value
        elif start.kind == "earliest":
            position = self._list_offset(EARLIEST_TIMESTAMP)
        elif start.kind == "latest":
            position = self.latest_offset()
        else:
            assert start.value is not None
            listed = self._list_offset(start.value)
            if listed < 0:
                # No record at or after T yet: start at the end, as Kafka consumers do.
                position = self.latest_offset()
            else:
                position = listed
                self.seek_timestamp = start.value
        end = self.end_position
        if end is not None:
            if end.kind == "offset":
                self.end_offset = end.value
            else:
                self.end_offset = self.latest_offset()
                if end.kind == "timestamp":
                    self.end_timestamp = end.value
        self.position = position
        self._open_transactions = {}
        if self.end_offset is not None and position >= self.end_offset:
            self.finished = True
        log.info(
            "%s: starting at offset %d (%s%s)%s",
            self.tp,
            position,
            start.kind,
            f" {start.value}" if start.value is not None else "",
            f", ending before {self.end_offset}" if self.end_offset is not None else "",
        )
        return position

    def _list_offset(self, timestamp: int) -> int:
        listed = self.cluster.list_offsets(
            {self.tp: timestamp}, isolation_level=self.settings.isolation_code
        )
        return listed[self.tp].offset

    def latest_offset(self) -> int:
        """The end of the partition: ListOffsets(LATEST), checked against a Fetch's high
        watermark (last stable offset for read_committed), whichever is larger."""
        listed = self._list_offset(LATEST_TIMESTAMP)
        probe_at = max(listed, 0)

        def probe() -> int:
            connection = self.cluster.leader_connection(self.topic, self.partition)
            # min_bytes 0 answers at once; max_wait_ms is not 0 because Tansu 0.6.0 then
            # answers with no partition at all.
            request = self._request(
                probe_at,
                session_id=0,
                epoch=FINAL_EPOCH,
                include=True,
                max_wait_ms=_PROBE_MAX_WAIT_MS,
                min_bytes=0,
            )
            context = f"{connection.describe()}, Fetch (end probe) of {self.tp}"
            response = expect_response(
                self.cluster.request(connection, request), FetchResponse, context
            )
            data = self._partition_data(response)
            if data is None:
                raise ProtocolError(f"{context}: the answer does not name the partition")
            if data.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                return -1  # the probe offset is past the log: ListOffsets is all we have
            if data.error_code:
                info = error_for(data.error_code)
                self.cluster.note_error(data.error_code, self.topic)
                raise BrokerError(info.code, info.name, info.retriable, context=context)
            if self.settings.read_committed and data.last_stable_offset >= 0:
                return data.last_stable_offset
            return data.high_watermark

        end = self.cluster.retrying(f"Fetch end probe of {self.tp}", probe)
        if end != listed:
            log.info(
                "%s: ListOffsets says the end is %d, a Fetch says %d; using %d",
                self.tp,
                listed,
                end,
                max(listed, end),
            )
        return max(listed, end)

    # -- polling ------------------------------------------------------------------------

    def poll(self, *, prefetch: bool | Callable[[FetchResult], bool] = True) -> FetchResult:
        """One Fetch answer, decoded. Never raises for retriable trouble: it backs off and
        returns an empty result. Raises BrokerError for non-retriable errors,
        ``UnreadableCorruption``, and ConfigError when a batch exceeds the size limit."""
        self.start()
        if self.finished:
            return self._empty()
        wait = self._hold_off()
        if wait > 0:
            self._sleep(wait)
            if self._hold_off() > 0:
                return self._empty()  # woken early (the caller has something to do)
        try:
            if self._sent is None:
                self._send()
            result = self._receive_and_handle()
        except (KafkaConnectionError, ProtocolError) as exc:
            if isinstance(exc, (CorruptBatchError, BrokerFaultError)):
                raise
            if isinstance(exc, KafkaConnectionError) and not exc.retriable:
                raise
            self._transport_failed(exc)
            return self._empty()
        except BrokerError as exc:
            if not exc.retriable:
                raise
            self._retry_later(exc)
            return self._empty()
        wanted = prefetch(result) if callable(prefetch) else prefetch
        if wanted and not self.finished:
            try:
                self._send()
            except (KafkaConnectionError, BrokerError) as exc:
                if not exc.retriable:
                    raise
                # The next poll retries; nothing was lost.
                self._transport_failed(exc)
        return result

    def _hold_off(self) -> float:
        return max(self._backoff.remaining(), self._throttled_until - self._clock())

    def _empty(
        self,
        *,
        corrupt: tuple[CorruptRange, ...] = (),
        resets: tuple[OffsetReset, ...] = (),
        fetched_bytes: int = 0,
    ) -> FetchResult:
        assert self.position is not None
        return FetchResult(
            batch=None,
            position=self.position,
            high_watermark=self.high_watermark,
            corrupt=corrupt,
            resets=resets,
            finished=self.finished,
            fetched_bytes=fetched_bytes,
        )

    def _request(
        self,
        fetch_offset: int,
        *,
        session_id: int,
        epoch: int,
        include: bool,
        max_wait_ms: int | None = None,
        min_bytes: int | None = None,
    ) -> FetchRequest:
        topics: tuple[FetchTopic, ...] = ()
        if include:
            topics = (
                FetchTopic(
                    topic=self.topic,
                    partitions=(
                        FetchPartition(
                            partition=self.partition,
                            fetch_offset=fetch_offset,
                            partition_max_bytes=self.partition_max_bytes,
                        ),
                    ),
                ),
            )
        return FetchRequest(
            max_wait_ms=self.settings.max_wait_ms if max_wait_ms is None else max_wait_ms,
            min_bytes=self.settings.min_bytes if min_bytes is None else min_bytes,
            max_bytes=self.max_bytes,
            isolation_level=self.settings.isolation_code,
            session_id=session_id,
            session_epoch=epoch,
            topics=topics,
            forgotten_topics_data=(),
        )

    def _send(self) -> None:
        assert self.position is not None and self._sent is None
        connection = self.cluster.leader_connection(self.topic, self.partition)
        if connection is not self._connection:
            if self._connection is not None:
                log.info("%s: fetching from %s now", self.tp, connection.describe())
            self._connection = connection
            self.session.reset()
        session_id, epoch, include = self.session.next_request(
            (self.position, self.partition_max_bytes, -1)
        )
        request = self._request(self.position, session_id=session_id, epoch=epoch, include=include)
        timeout = self.cluster.config.request_timeout + self.settings.max_wait_ms / 1000
        try:
            ticket = connection.send(request, timeout=timeout)
        except KafkaConnectionError:
            self.session.on_transport_error()
            raise
        self._sent = _Sent(connection, ticket, self.position, incremental=not self.session.is_full)

    def _receive_and_handle(self) -> FetchResult:
        sent = self._sent
        assert sent is not None
        self._sent = None
        context = f"{sent.connection.describe()}, Fetch v{sent.ticket.version} of {self.tp}"
        try:
            # The answer lives in the connection's reusable buffer until the next receive:
            # everything kept from it is copied out by the decoder.
            response = expect_response(
                sent.connection.receive(sent.ticket, borrow=True), FetchResponse, context
            )
        except (KafkaConnectionError, ProtocolError):
            self.session.on_transport_error()
            raise
        self.stats.fetches += 1
        if sent.incremental:
            self.stats.session_fetches += 1
        if response.throttle_time_ms > 0:
            # KIP-219: the broker answered at once and expects us to hold back this long.
            self._throttled_until = self._clock() + response.throttle_time_ms / 1000
        self.session.on_response(response.error_code, response.session_id)
        if response.error_code:
            info = error_for(response.error_code)
            retriable = info.retriable or response.error_code in _SESSION_ERRORS
            error = BrokerError(info.code, info.name, retriable, context=context)
            if response.error_code in _SESSION_ERRORS:
                log.info("%s: %s; the next Fetch is a full one", context, info.name)
                self.stats.errors += 1
                return self._empty()
            raise error
        data = self._partition_data(response)
        if data is None:
            if sent.incremental:
                return self._empty()  # an incremental answer leaves out what did not change
            self.session.reset()
            raise BrokerError(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                "MISSING_PARTITION",
                True,
                context=context,
                message="a full Fetch answer does not name the partition",
            )
        if data.error_code:
            return self._partition_error(data, sent, context)
        self.high_watermark = data.high_watermark
        self.last_stable_offset = data.last_stable_offset
        self.log_start_offset = data.log_start_offset
        if sent.fetch_offset > data.high_watermark >= 0 and not self._warned_past_end:
            # Kafka answers OFFSET_OUT_OF_RANGE past the log end (and waits between the high
            # watermark and the log end); Tansu 0.6.0 just answers nothing, forever.
            self._warned_past_end = True
            log.warning(
                "%s: fetch offset %d is past the high watermark %d; waiting for records",
                self.tp,
                sent.fetch_offset,
                data.high_watermark,
            )
        aborted: Sequence[tuple[int, int]] | None = None
        if self.settings.read_committed and data.aborted_transactions:
            aborted = [(t.producer_id, t.first_offset) for t in data.aborted_transactions]
        records = data.records
        size = 0 if records is None else len(records)
        if size == 0:
            self.stats.empty_fetches += 1
            self._backoff.succeeded()
            return self._empty()
        assert records is not None
        decoded = decode_records(
            records,
            topic=self.topic,
            partition=self.partition,
            read_committed=self.settings.read_committed,
            aborted_transactions=aborted,
            fetch_offset=sent.fetch_offset,
            check_crc=self.settings.check_crc,
            carried=self._open_transactions,
        )
        # Drop every view of the borrowed buffer so the connection can reuse it.
        del response, data, records
        if self.settings.read_committed:
            self._check_transactions(decoded)
        self.stats.fetched_bytes += size
        self._backoff.succeeded()
        return self._advance(decoded, sent.fetch_offset, size)

    def _check_transactions(self, decoded: DecodedRecords) -> None:
        """The broker's side of read_committed (transactions.py): aborts it did not list
        were dropped within the answer; one whose records an earlier answer handed on is
        fatal, before those records can be committed."""
        for abort in decoded.unlisted_aborts:
            log.warning(
                "%s: broker fault: producer %d's transaction from offset %d was aborted "
                "(ABORT marker at offset %d) but the Fetch answer did not list it in "
                "aborted_transactions; its records were dropped",
                self.tp,
                abort.producer_id,
                abort.first_offset,
                abort.marker_offset,
            )
        if decoded.carried_aborts:
            abort = decoded.carried_aborts[0]
            raise BrokerFaultError(
                f"{self.tp}: broker fault: producer {abort.producer_id}'s transaction was "
                f"aborted (ABORT marker at offset {abort.marker_offset}), but the broker "
                "did not list it in aborted_transactions and answered its records from "
                f"offset {abort.first_offset} to a read_committed Fetch before the marker "
                "(past the last stable offset). Those records must not land; this "
                "partition stops. Apache Kafka never answers this way (see "
                "docs/kafka-compat.md)",
                offset=abort.first_offset,
            )
        self._open_transactions = dict(decoded.open_transactions)

    def _partition_data(self, response: FetchResponse) -> PartitionData | None:
        for topic in response.responses:
            if topic.topic and topic.topic != self.topic:
                continue
            for data in topic.partitions:
                if data.partition_index == self.partition:
                    return data
        return None

    def _partition_error(self, data: PartitionData, sent: _Sent, context: str) -> FetchResult:
        code = data.error_code
        info = error_for(code)
        self.stats.errors += 1
        self.stats.error_names.append(info.name)
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            return self._reset_offset(sent.fetch_offset, data)
        if code in LEADER_ERRORS or code in (
            ErrorCode.KAFKA_STORAGE_ERROR,
            ErrorCode.UNKNOWN_TOPIC_ID,
            ErrorCode.REPLICA_NOT_AVAILABLE,
        ):
            # Stale leader: refresh the metadata; the session stays with the old broker.
            self.cluster.invalidate(self.topic)
            self._connection = None
            self.session.reset()
        raise BrokerError(
            info.code,
            info.name,
            info.retriable,
            context=f"{context}, offset {sent.fetch_offset}",
            message=info.description,
        )

    def _reset_offset(self, old: int, data: PartitionData) -> FetchResult:
        policy = self.settings.auto_offset_reset
        bounds = f"log start {data.log_start_offset}, high watermark {data.high_watermark}"
        if policy == "fail":
            raise BrokerError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                "OFFSET_OUT_OF_RANGE",
                False,
                context=f"{self.tp}",
                message=f"fetch offset {old} is out of range ({bounds}) and "
                "auto_offset_reset is 'fail'",
            )
        new = (
            self._list_offset(EARLIEST_TIMESTAMP) if policy == "earliest" else self.latest_offset()
        )
        reason = f"fetch offset {old} is out of range ({bounds})"
        log.warning(
            "%s: %s; auto_offset_reset=%s moves it from %d to %d", self.tp, reason, policy, old, new
        )
        self.position = new
        self.seek_timestamp = None
        self._open_transactions = {}
        if self.end_offset is not None and new >= self.end_offset:
            self.finished = True
        return self._empty(resets=(OffsetReset(old, new, policy, reason),))

    def _advance(self, decoded: DecodedRecords, fetch_offset: int, size: int) -> FetchResult:
        corrupt: list[CorruptRange] = []
        for bad in decoded.corrupt:
            first = fetch_offset if bad.base_offset is None else max(bad.base_offset, fetch_offset)
            if bad.last_offset is None:
                if decoded.next_offset is not None:
                    continue  # the next Fetch starts there and meets it again
                report = CorruptRange(first, None, bad.raw, bad.reason, bad.kind)
                raise UnreadableCorruption(
                    f"{self.tp}: unreadable record batch framing at offset {first} "
                    f"({bad.reason}); its end cannot be read, so it cannot be skipped",
                    report,
                )
            last = bad.last_offset
            if last < fetch_offset:
                continue
            if self.end_offset is not None:
                if first >= self.end_offset:
                    continue
                last = min(last, self.end_offset - 1)
            corrupt.append(CorruptRange(first, last, bad.raw, bad.reason, bad.kind))
            log.error(
                "%s: corrupt record batch, offsets %d-%d (%s): reported, not decoded",
                self.tp,
                first,
                last,
                bad.reason,
            )

        if decoded.next_offset is None:
            if decoded.incomplete_batch_size is not None:
                self._grow(decoded.incomplete_batch_size, fetch_offset)
            return self._empty(corrupt=tuple(corrupt), fetched_bytes=size)

        batch: pa.RecordBatch | None = decoded.batch
        position = max(decoded.next_offset, fetch_offset)
        if batch is not None and self.seek_timestamp is not None:
            batch = self._skip_before_timestamp(batch)
        if batch is not None and self.end_offset is not None:
            batch, position = self._cut_at_end(batch, position)
        if batch is not None and self.end_timestamp is not None:
            batch, position = self._cut_at_timestamp(batch, position, self.end_timestamp)
        self.position = position
        if self.end_offset is not None and position >= self.end_offset:
            self.finished = True
        if batch is not None and batch.num_rows == 0:
            batch = None
        if batch is not None:
            self.stats.records += batch.num_rows
        return FetchResult(
            batch=batch,
            position=position,
            high_watermark=self.high_watermark,
            corrupt=tuple(corrupt),
            finished=self.finished,
            fetched_bytes=size,
        )

    def _skip_before_timestamp(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        target = self.seek_timestamp
        assert target is not None
        timestamps = _int64_values(batch.column(_TIMESTAMP_COLUMN))
        hits = np.flatnonzero(timestamps >= target)
        if len(hits) == 0:
            return batch.slice(0, 0)
        self.seek_timestamp = None
        first = int(hits[0])
        if first:
            offsets = _int64_values(batch.column(_OFFSET_COLUMN))
            log.info(
                "%s: skipped offsets %d-%d, timestamped before %d (the start timestamp)",
                self.tp,
                int(offsets[0]),
                int(offsets[first - 1]),
                target,
            )
        return batch.slice(first)

    def _cut_at_end(self, batch: pa.RecordBatch, position: int) -> tuple[pa.RecordBatch, int]:
        end = self.end_offset
        assert end is not None
        if position <= end:
            return batch, position
        offsets = _int64_values(batch.column(_OFFSET_COLUMN))
        keep = int(np.searchsorted(offsets, end))
        return batch.slice(0, keep), end

    def _cut_at_timestamp(
        self, batch: pa.RecordBatch, position: int, end_timestamp: int
    ) -> tuple[pa.RecordBatch, int]:
        timestamps = _int64_values(batch.column(_TIMESTAMP_COLUMN))
        hits = np.flatnonzero(timestamps >= end_timestamp)
        if len(hits) == 0:
            return batch, position
        cut = int(hits[0])
        end = int(_int64_values(batch.column(_OFFSET_COLUMN))[cut])
        self.end_offset = end
        return batch.slice(0, cut), end

    def _grow(self, needed: int, fetch_offset: int) -> None:
        limit = min(
            self.settings.max_fetch_bytes_limit,
            self.cluster.config.max_frame_size - _FRAME_HEADROOM,
        )
        current = min(self.partition_max_bytes, self.max_bytes)
        if needed <= current:
            return  # cut by something else; the next Fetch asks again
        if needed > limit:
            raise ConfigError(
                f"{self.tp}: the record batch at offset {fetch_offset} is {needed} bytes, "
                f"above the fetch size limit of {limit} bytes",
                key="fetch.max_fetch_bytes_limit",
            )
        size = current
        while size < needed:
            size *= 2
        size = min(size, limit)
        log.warning(
            "%s: the record batch at offset %d is %d bytes, larger than the fetch size %d; "
            "fetching up to %d bytes from now on",
            self.tp,
            fetch_offset,
            needed,
            current,
            size,
        )
        self.partition_max_bytes = max(self.partition_max_bytes, size)
        self.max_bytes = max(self.max_bytes, size)
        self.stats.size_raises += 1

    def _transport_failed(self, exc: Exception) -> None:
        self.stats.errors += 1
        self.stats.reconnects += 1
        self.session.on_transport_error()
        self._sent = None
        # The leader may have gone with the connection: check it before the next Fetch.
        self.cluster.invalidate(self.topic)
        wait = self._backoff.failed()
        log.warning("%s: %s; resuming at offset %s in %.3fs", self.tp, exc, self.position, wait)

    def _retry_later(self, exc: BrokerError) -> None:
        self.stats.errors += 1
        self.stats.error_names.append(exc.name)
        wait = self._backoff.failed()
        log.warning("%s: %s; retrying at offset %s in %.3fs", self.tp, exc, self.position, wait)
