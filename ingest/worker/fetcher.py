"""The fetch loop of one partition: Fetch requests, decoding, recovery.

``PartitionFetcher.poll()`` sends a Fetch to the partition's leader, decodes
the answer into one Arrow RecordBatch (``ingest.protocol.recordbatch.records``) and moves
its position past it. With ``prefetch`` it sends the next Fetch before
returning, so the broker works on it while the caller writes the batch out;
only one Fetch is ever in flight, and the position only moves when an answer
has been processed, so an unprocessed prefetch can always be dropped.

Its parts: ``positions.py`` resolves the start and end (and where a reset
goes), with every broker answer it does not trust checked in one section;
``fetch_session.py`` is the KIP-227 fetch session (used when the broker grants one)
and the shape of the Fetch; ``window.py`` cuts decoded batches to the run.

Errors: OFFSET_OUT_OF_RANGE applies ``auto_offset_reset`` (logged with both
offsets and returned as an ``OffsetReset``); leader errors drop the leader
cache and the fetch session, then retry after a backoff; a lost connection
backs off and resumes from the position; a batch larger than the fetch size
doubles the size (up to ``max_fetch_bytes_limit``) instead of stalling; corrupt
batches come back as ``CorruptRange`` with their raw bytes and the position
moves past them. Broken framing whose end cannot be read cannot be skipped
without guessing, so it is reported and raised (``UnreadableCorruption``).
read_committed: the broker's side of it is checked (``_check_transactions``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa

from ingest.client.backoff import Backoff
from ingest.client.cluster import Cluster
from ingest.client.connection import BrokerConnection, InFlight, expect_response
from ingest.client.metadata_cache import LEADER_ERRORS
from ingest.errors import (
    BrokerError,
    BrokerFaultError,
    ConfigError,
    CorruptBatchError,
    KafkaConnectionError,
    ProtocolError,
)
from ingest.protocol.error_codes import ErrorCode, error_for
from ingest.protocol.messages import FetchResponse, PartitionData
from ingest.protocol.partition import Partition
from ingest.protocol.recordbatch.records import DecodedRecords, decode_records
from ingest.worker import results
from ingest.worker.fetch_session import SESSION_ERRORS, FetchSession, fetch_request, partition_data
from ingest.worker.positions import PastLogEndWatch, PositionResolver
from ingest.worker.results import CorruptRange, FetchResult, OffsetReset, corrupt_ranges
from ingest.worker.settings import EndPosition, FetchSettings, StartPosition
from ingest.worker.window import cut_at_end, cut_at_timestamp, skip_before_timestamp

__all__ = ["PartitionFetcher"]

log = logging.getLogger("ingest.worker")

# Frame overhead kept free below max_frame_size when a fetch size grows.
_FRAME_HEADROOM = 64 * 1024


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
        self.tp = Partition(topic, partition)
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
        self.positions = PositionResolver(
            cluster, self.tp, settings, lambda: (self.partition_max_bytes, self.max_bytes)
        )
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
        self._past_log_end = PastLogEndWatch(self.tp)

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
        resolved = self.positions.resolve(start, self.end_position)
        position = resolved.position
        self.seek_timestamp = resolved.skip_before_timestamp
        self.end_offset = resolved.end_offset
        self.end_timestamp = resolved.end_timestamp
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

    def latest_offset(self) -> int:
        """The end of the partition: ListOffsets(LATEST), checked against a Fetch's high
        watermark (last stable offset for read_committed), whichever is larger."""
        return self.positions.latest()

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

    def _send(self) -> None:
        assert self.position is not None and self._sent is None
        connection = self.cluster.leader_connection(self.topic, self.partition)
        if connection is not self._connection:
            if self._connection is not None:
                log.info("%s: fetching from %s now", self.tp, connection.describe())
            self._connection = connection
            self.session.reset()
        leader_epoch = self.cluster.leader_epoch(self.topic, self.partition)
        session_id, epoch, include = self.session.next_request(
            (self.position, self.partition_max_bytes, leader_epoch)
        )
        request = fetch_request(
            self.topic,
            self.partition,
            self.position,
            self.settings,
            partition_max_bytes=self.partition_max_bytes,
            max_bytes=self.max_bytes,
            session_id=session_id,
            epoch=epoch,
            include=include,
            # A fetch toward an end takes what there is: waiting for min_bytes near the
            # end would only hold the run up for max_wait.
            min_bytes=1 if self.end_offset is not None else None,
            current_leader_epoch=leader_epoch,
        )
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
        if response.throttle_time_ms > 0:
            # KIP-219: the broker answered at once and expects us to hold back this long.
            self._throttled_until = self._clock() + response.throttle_time_ms / 1000
        self.session.on_response(response.error_code, response.session_id)
        if response.error_code:
            info = error_for(response.error_code)
            if response.error_code in SESSION_ERRORS:
                log.info("%s: %s; the next Fetch is a full one", context, info.name)
                return self._empty()
            raise BrokerError(info.code, info.name, info.retriable, context=context)
        data = partition_data(response, self.topic, self.partition)
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
        self._past_log_end.check(sent.fetch_offset, data.high_watermark)
        aborted: Sequence[tuple[int, int]] | None = None
        if self.settings.read_committed and data.aborted_transactions:
            aborted = [(t.producer_id, t.first_offset) for t in data.aborted_transactions]
        records = data.records
        size = 0 if records is None else len(records)
        if size == 0:
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
            max_decode_bytes=self.settings.max_decode_bytes,
        )
        # Drop every view of the borrowed buffer so the connection can reuse it.
        del response, data, records
        if self.settings.read_committed:
            self._check_transactions(decoded)
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

    def _partition_error(self, data: PartitionData, sent: _Sent, context: str) -> FetchResult:
        code = data.error_code
        info = error_for(code)
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
        new = self.positions.reset_target(policy)
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
        corrupt = corrupt_ranges(decoded, fetch_offset, self.end_offset, str(self.tp))
        if decoded.next_offset is None:
            if decoded.incomplete_batch_size is not None:
                self._grow(decoded.incomplete_batch_size, fetch_offset)
            return self._empty(corrupt=corrupt, fetched_bytes=size)

        batch: pa.RecordBatch | None = decoded.batch
        position = max(decoded.next_offset, fetch_offset)
        if batch is not None and self.seek_timestamp is not None:
            batch = self._skip_before_timestamp(batch, self.seek_timestamp)
        if batch is not None and self.end_offset is not None:
            batch, position = cut_at_end(batch, position, self.end_offset)
        if batch is not None and self.end_timestamp is not None:
            batch, position, reached = cut_at_timestamp(batch, position, self.end_timestamp)
            if reached:
                self.end_offset = position
        if batch is not None and batch.num_rows:
            limit = self.settings.max_record_bytes
            batch, oversized = results.split_oversized(batch, limit, str(self.tp))
            corrupt += oversized
        self.position = position
        if self.end_offset is not None and position >= self.end_offset:
            self.finished = True
        if batch is not None and batch.num_rows == 0:
            batch = None
        return FetchResult(
            batch=batch,
            position=position,
            high_watermark=self.high_watermark,
            corrupt=corrupt,
            finished=self.finished,
            fetched_bytes=size,
            epochs=decoded.epochs,
        )

    def _skip_before_timestamp(self, batch: pa.RecordBatch, target: int) -> pa.RecordBatch:
        kept, reached, _ = skip_before_timestamp(batch, target, str(self.tp))
        if reached:
            self.seek_timestamp = None
        return kept

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

    def _transport_failed(self, exc: Exception) -> None:
        self.session.on_transport_error()
        self._sent = None
        # The leader may have gone with the connection: check it before the next Fetch.
        self.cluster.invalidate(self.topic)
        wait = self._backoff.failed()
        log.warning("%s: %s; resuming at offset %s in %.3fs", self.tp, exc, self.position, wait)

    def _retry_later(self, exc: BrokerError) -> None:
        wait = self._backoff.failed()
        log.warning("%s: %s; retrying at offset %s in %.3fs", self.tp, exc, self.position, wait)
