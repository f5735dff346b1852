"""A scripted Kafka partition leader for fetcher tests: what Tansu cannot show us.

``ScriptedLeader`` serves one partition's log (RecordBatch v2 bytes built with
``ingest.protocol.recordbatch.record_builder``) over real Kafka framing through
``tests.client.peer``: Metadata, ListOffsets and Fetch, with KIP-227
incremental fetch sessions granted like Kafka's broker grants them, aborted
transaction lists, and hooks to inject errors, drop connections, truncate
batches at the size limit (as pre-KIP-74 brokers do) or answer ListOffsets
wrongly (as Tansu does).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ingest.client import ClientConfig, Cluster
from ingest.protocol.codec import SUPPORTED_VERSIONS
from ingest.protocol.headers import RequestHeader
from ingest.protocol.messages import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    AbortedTransaction,
    ApiVersionsRequest,
    FetchableTopicResponse,
    FetchRequest,
    FetchResponse,
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
    MetadataRequest,
    MetadataResponse,
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
    PartitionData,
)
from ingest.protocol.recordbatch.record_builder import Record, build_batch
from ingest.worker.fetcher import PartitionFetcher
from ingest.worker.settings import EndPosition, FetchSettings, StartPosition
from tests.client.peer import PeerConnection, ScriptedPeer, kafka_script

TOPIC = "t"
TOPIC_ID = uuid.UUID("00000000-0000-0000-0000-00000000000a")
FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71


@dataclass
class LogBatch:
    base_offset: int
    last_offset: int
    data: bytes
    max_timestamp: int


@dataclass(frozen=True)
class SeenFetch:
    """One Fetch request as the broker saw it."""

    session_id: int
    epoch: int
    offsets: tuple[int, ...]  # fetch offsets of the partitions it named
    partition_max_bytes: tuple[int, ...]
    isolation_level: int
    answered_session_id: int
    answered_error: int
    named_partition_in_answer: bool


class PartitionLog:
    """Batches with increasing offsets; ``append`` builds them with record_builder."""

    def __init__(self) -> None:
        self.batches: list[LogBatch] = []
        self.log_start = 0

    @property
    def end(self) -> int:
        return self.batches[-1].last_offset + 1 if self.batches else self.log_start

    def append(self, records: Sequence[Record], **batch_options: Any) -> LogBatch:
        data = build_batch(records, base_offset=self.end, **batch_options)
        return self.append_raw(data, count=len(records), max_timestamp=_max_ts(records))

    def append_raw(
        self, data: bytes, *, count: int, base_offset: int | None = None, max_timestamp: int = 0
    ) -> LogBatch:
        base = self.end if base_offset is None else base_offset
        batch = LogBatch(base, base + count - 1, data, max_timestamp)
        self.batches.append(batch)
        return batch

    def read(self, offset: int, limit: int, *, truncate: bool) -> bytes:
        """Kafka's read: whole batches from the one holding ``offset``, up to ``limit``
        bytes; the first batch goes out whole even past the limit (KIP-74), unless
        ``truncate``, which cuts it like a pre-0.10.1 broker."""
        out = bytearray()
        for batch in self.batches:
            if batch.last_offset < offset:
                continue
            if out and len(out) + len(batch.data) > limit:
                break
            if not out and len(batch.data) > limit and truncate:
                out += batch.data[:limit]
                break
            out += batch.data
        return bytes(out)


def _max_ts(records: Sequence[Record]) -> int:
    stamps = [r.timestamp for r in records if r.timestamp is not None]
    return max(stamps) if stamps else 0


class ScriptedLeader:
    """One partition leader (node ``node_id``). Use as a context manager."""

    def __init__(
        self,
        log: PartitionLog | None = None,
        *,
        node_id: int = 1,
        grant_sessions: bool = False,
        partition: int = 0,
    ) -> None:
        self.log = log or PartitionLog()
        self.node_id = node_id
        self.partition = partition
        self.grant_sessions = grant_sessions
        self.truncate_oversize = False
        self.aborted: list[AbortedTransaction] = []
        self.last_stable_offset: int | None = None
        # Hooks, consumed in order.
        self.fetch_partition_errors: list[int] = []
        self.fetch_top_errors: list[int] = []
        self.drop_connection_on_fetch: list[int] = []  # fetch numbers (1-based) to drop
        self.latest_answer: Callable[[int], int] | None = None  # broken ListOffsets LATEST
        self.timestamp_answer: Callable[[int], int] | None = None  # broken ListOffsets(T)
        # Fetch number (1-based) -> an Event its answer waits for (a Fetch held in flight).
        self.hold_answer: dict[int, threading.Event] = {}
        # Where Metadata says the leader is (for leader moves): (node_id, port).
        self.leader: tuple[int, int] | None = None
        self.other_brokers: list[tuple[int, int]] = []
        # State.
        self.fetches: list[SeenFetch] = []
        self.metadata_requests = 0
        self.list_offsets_requests: list[tuple[int, int]] = []  # (timestamp, isolation)
        self._sessions: dict[int, tuple[int, int | None]] = {}  # id -> (next epoch, offset)
        self._next_session = 1000
        self._lock = threading.Lock()
        handlers = {
            MetadataRequest.api_key: self._metadata,
            ListOffsetsRequest.api_key: self._list_offsets,
            FetchRequest.api_key: self._fetch,
        }
        # It advertises what it answers, so no OffsetForLeaderEpoch: like Tansu, its
        # ListOffsets answers are checked, not trusted (Cluster.trusts_list_offsets).
        ranges = {key: SUPPORTED_VERSIONS[key] for key in (*handlers, ApiVersionsRequest.api_key)}
        self.peer = ScriptedPeer(kafka_script(handlers, ranges=ranges))
        self.port = self.peer.port

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> ScriptedLeader:
        self.peer.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.peer.__exit__(*exc_info)

    # -- Metadata and ListOffsets -------------------------------------------------------

    def _metadata(self, peer: PeerConnection, header: RequestHeader, request: Any) -> Any:
        self.metadata_requests += 1
        leader_id, leader_port = self.leader or (self.node_id, self.port)
        brokers = {leader_id: leader_port, self.node_id: self.port}
        brokers.update(dict(self.other_brokers))
        return MetadataResponse(
            brokers=tuple(
                MetadataResponseBroker(node_id=node, host="127.0.0.1", port=port)
                for node, port in sorted(brokers.items())
            ),
            cluster_id="scripted",
            controller_id=self.node_id,
            topics=(
                MetadataResponseTopic(
                    name=TOPIC,
                    topic_id=TOPIC_ID,
                    partitions=(
                        MetadataResponsePartition(
                            partition_index=self.partition,
                            leader_id=leader_id,
                            leader_epoch=0,
                            replica_nodes=(leader_id,),
                            isr_nodes=(leader_id,),
                        ),
                    ),
                ),
            ),
        )

    def _list_offsets(self, peer: PeerConnection, header: RequestHeader, request: Any) -> Any:
        topics = []
        for topic in request.topics:
            answers = []
            for p in topic.partitions:
                self.list_offsets_requests.append((p.timestamp, request.isolation_level))
                answers.append(
                    ListOffsetsPartitionResponse(
                        partition_index=p.partition_index,
                        error_code=0,
                        offset=self._offset_for(p.timestamp),
                        timestamp=-1,
                    )
                )
            topics.append(ListOffsetsTopicResponse(name=topic.name, partitions=tuple(answers)))
        return ListOffsetsResponse(topics=tuple(topics))

    def _offset_for(self, timestamp: int) -> int:
        if timestamp == EARLIEST_TIMESTAMP:
            return self.log.log_start
        if timestamp == LATEST_TIMESTAMP:
            end = self._stable_end()
            return self.latest_answer(end) if self.latest_answer else end
        if self.timestamp_answer is not None:
            return self.timestamp_answer(timestamp)
        for batch in self.log.batches:
            if batch.max_timestamp >= timestamp:
                return batch.base_offset  # the batch holding it; Kafka then scans records
        return -1

    def _stable_end(self) -> int:
        return self.log.end if self.last_stable_offset is None else self.last_stable_offset

    # -- Fetch --------------------------------------------------------------------------

    def _fetch(self, peer: PeerConnection, header: RequestHeader, request: Any) -> Any:
        with self._lock:
            number = len(self.fetches) + 1
            if self.drop_connection_on_fetch and self.drop_connection_on_fetch[0] == number:
                self.drop_connection_on_fetch.pop(0)
                self.fetches.append(
                    SeenFetch(request.session_id, request.session_epoch, (), (), 0, -1, -1, False)
                )
                raise ConnectionResetError("scripted: connection dropped")
            named = [
                (p.fetch_offset, p.partition_max_bytes)
                for t in request.topics
                for p in t.partitions
                if p.partition == self.partition
            ]
            top_error, session_id, incremental, offset = self._session(request, named)
            answer_partition = None
            if top_error == 0 and offset is not None:
                answer_partition = self._partition_answer(
                    offset, named[0][1] if named else 2**20, request.isolation_level
                )
                if incremental and not named and answer_partition.records == b"":
                    answer_partition = None  # nothing changed: left out of the answer
            self.fetches.append(
                SeenFetch(
                    request.session_id,
                    request.session_epoch,
                    tuple(o for o, _ in named),
                    tuple(m for _, m in named),
                    request.isolation_level,
                    session_id,
                    top_error,
                    answer_partition is not None,
                )
            )
        held = self.hold_answer.get(number)
        if held is not None:
            held.wait(10)
        if answer_partition is None or answer_partition.records == b"":
            time.sleep(min(request.max_wait_ms, 20) / 1000)  # a long poll with nothing new
        return FetchResponse(
            error_code=top_error,
            session_id=session_id,
            responses=()
            if answer_partition is None
            else (FetchableTopicResponse(topic=TOPIC, partitions=(answer_partition,)),),
        )

    def _session(
        self, request: Any, named: list[tuple[int, int]]
    ) -> tuple[int, int, bool, int | None]:
        """(top-level error, session id to answer, incremental?, offset to read from).

        Like Kafka's broker, a session remembers the fetch offset a request last named
        (not where the answer ended): a client must name the partition again once its
        position moved.
        """
        if self.fetch_top_errors:
            return self.fetch_top_errors.pop(0), 0, False, None
        offset = named[0][0] if named else None
        sid, epoch = request.session_id, request.session_epoch
        if not self.grant_sessions or epoch == -1:
            self._sessions.pop(sid, None)
            return 0, 0, False, offset
        if epoch == 0:
            self._sessions.pop(sid, None)
            new = self._next_session
            self._next_session += 1
            self._sessions[new] = (1, offset)
            return 0, new, False, offset
        if sid not in self._sessions:
            return FETCH_SESSION_ID_NOT_FOUND, 0, False, None
        expected, held = self._sessions[sid]
        if epoch != expected:
            return INVALID_FETCH_SESSION_EPOCH, 0, False, None
        if offset is None:
            offset = held
        next_epoch = 1 if expected == 2**31 - 1 else expected + 1
        self._sessions[sid] = (next_epoch, offset)
        return 0, sid, True, offset

    def _partition_answer(self, offset: int, limit: int, isolation: int) -> PartitionData:
        end = self.log.end
        stable = self._stable_end()
        if self.fetch_partition_errors:
            code = self.fetch_partition_errors.pop(0)
            return PartitionData(
                partition_index=self.partition,
                error_code=code,
                high_watermark=-1,
                last_stable_offset=-1,
                log_start_offset=-1,
                records=b"",
            )
        if not self.log.log_start <= offset <= end:
            return PartitionData(
                partition_index=self.partition,
                error_code=1,  # OFFSET_OUT_OF_RANGE
                high_watermark=end,
                last_stable_offset=stable,
                log_start_offset=self.log.log_start,
                records=b"",
            )
        records = self.log.read(offset, limit, truncate=self.truncate_oversize)
        return PartitionData(
            partition_index=self.partition,
            error_code=0,
            high_watermark=end,
            last_stable_offset=stable,
            log_start_offset=self.log.log_start,
            aborted_transactions=tuple(self.aborted) if isolation == 1 else None,
            records=records,
        )

    # -- helpers for assertions ---------------------------------------------------------

    def session_fetches(self) -> list[SeenFetch]:
        return [f for f in self.fetches if f.session_id != 0]


def values(count: int, *, start: int = 0, timestamp: int = 1_000, size: int = 10) -> list[Record]:
    """``count`` records with distinct values and timestamps ``timestamp + index``."""
    return [
        Record(
            value=f"v{start + i:0{size}d}".encode(),
            key=f"k{start + i}".encode(),
            timestamp=timestamp + start + i,
            headers=(("h", f"{start + i}".encode()),),
        )
        for i in range(count)
    ]


def make_config(bootstrap: str) -> ClientConfig:
    return ClientConfig(
        bootstrap_servers=bootstrap,
        request_timeout=3.0,
        retry_timeout=3.0,
        retry_backoff=0.01,
        retry_backoff_max=0.02,
        reconnect_backoff=0.01,
        reconnect_backoff_max=0.02,
    )


def make_fetcher(
    leader: ScriptedLeader,
    *,
    start: StartPosition | None = None,
    end: EndPosition | None = None,
    **fetch: Any,
) -> PartitionFetcher:
    fetch.setdefault("max_wait_ms", 20)
    return PartitionFetcher(
        Cluster(make_config(leader.bootstrap)),
        TOPIC,
        0,
        FetchSettings(**fetch),
        start=start or StartPosition.earliest(),
        end=end,
    )
