"""The pure side of fetching one partition: the KIP-227 fetch session, and the Fetch
request and answer as the fetcher sends and reads them. No I/O: the fetcher
(``fetcher.py``) asks what to send and reports what came back.
"""

from __future__ import annotations

from ingest.protocol.error_codes import ErrorCode
from ingest.protocol.messages import (
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    PartitionData,
)
from ingest.worker.settings import FetchSettings

__all__ = [
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "SESSION_ERRORS",
    "FetchSession",
    "SessionPartition",
    "fetch_request",
    "next_epoch",
    "partition_data",
]

FINAL_EPOCH = -1
INITIAL_EPOCH = 0
_INT32_MAX = 2**31 - 1
# Top-level Fetch errors that concern the session, not the partition: the next Fetch is full.
SESSION_ERRORS = frozenset(
    {
        ErrorCode.FETCH_SESSION_ID_NOT_FOUND,
        ErrorCode.INVALID_FETCH_SESSION_EPOCH,
        ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR,
    }
)

# What a fetch session holds of its one partition: fetch_offset, partition_max_bytes,
# current leader epoch.
SessionPartition = tuple[int, int, int]


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
        self._held: SessionPartition | None = None  # what the broker's session holds
        self._pending: SessionPartition | None = None
        self._pending_full = True

    def __repr__(self) -> str:
        return f"FetchSession(id={self.session_id}, epoch={self.epoch})"

    @property
    def is_full(self) -> bool:
        return self.epoch in (INITIAL_EPOCH, FINAL_EPOCH)

    def next_request(self, state: SessionPartition) -> tuple[int, int, bool]:
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


# -- the Fetch of one partition ---------------------------------------------------------


def fetch_request(
    topic: str,
    partition: int,
    fetch_offset: int,
    settings: FetchSettings,
    *,
    partition_max_bytes: int,
    max_bytes: int,
    session_id: int,
    epoch: int,
    include: bool,
    max_wait_ms: int | None = None,
    min_bytes: int | None = None,
    current_leader_epoch: int = -1,
) -> FetchRequest:
    """A Fetch of one partition; ``include`` False leaves it out (an incremental Fetch
    whose partition did not change). Waits and sizes default to ``settings``.
    ``current_leader_epoch`` (KIP-320): the leader epoch the client knows; a broker whose
    epoch differs answers FENCED_LEADER_EPOCH (ours is older) or UNKNOWN_LEADER_EPOCH
    (ours is newer) instead of serving a stale or truncated log."""
    topics: tuple[FetchTopic, ...] = ()
    if include:
        topics = (
            FetchTopic(
                topic=topic,
                partitions=(
                    FetchPartition(
                        partition=partition,
                        fetch_offset=fetch_offset,
                        partition_max_bytes=partition_max_bytes,
                        current_leader_epoch=current_leader_epoch,
                    ),
                ),
            ),
        )
    return FetchRequest(
        max_wait_ms=settings.max_wait_ms if max_wait_ms is None else max_wait_ms,
        min_bytes=settings.min_bytes if min_bytes is None else min_bytes,
        max_bytes=max_bytes,
        isolation_level=settings.isolation_code,
        session_id=session_id,
        session_epoch=epoch,
        topics=topics,
        forgotten_topics_data=(),
    )


def partition_data(response: FetchResponse, topic: str, partition: int) -> PartitionData | None:
    """The answer's part for this partition; None when it names the partition nowhere."""
    for answered in response.responses:
        if answered.topic and answered.topic != topic:
            continue
        for data in answered.partitions:
            if data.partition_index == partition:
                return data
    return None
