"""Where a partition's run starts and ends, resolved once before the first Fetch and
again on an offset reset.

* committed offset: used as given once OffsetForLeaderEpoch shows the log still holds
  the records before it (``truncation.py``); if it is out of range, ``auto_offset_reset``.
* earliest: ListOffsets(EARLIEST).
* latest: ListOffsets(LATEST) (read_committed: the last stable offset).
* timestamp: ListOffsets(T), the first record at or after T; no record at or after T
  yet: the end, as Kafka consumers do.
* end: an offset as given; latest is the latest offset at start; a timestamp is
  ListOffsets(T) for the end, so the run ends before the first record at or after T
  (at the latest offset at start if there is none).

Brokers do not all answer these right (docs/kafka-compat.md; Tansu 0.6.0 gets
several wrong). Whether an answer is trusted is ``Cluster.trusts_list_offsets``
(the ``kafka.list_offsets`` setting; by default, detected). An answer not trusted
is checked as the last section of this module, "Answers checked, not trusted",
says under the name of the behaviour it handles: LATEST against a Fetch's high
watermark, a timestamp by skipping records before it, an end timestamp by cutting
the records at it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from ingest.client.cluster import Cluster
from ingest.client.connection import expect_response
from ingest.errors import BrokerError, ProtocolError
from ingest.protocol.error_codes import ErrorCode, error_for
from ingest.protocol.messages import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, FetchResponse
from ingest.protocol.partition import Partition
from ingest.worker.fetch_session import FINAL_EPOCH, fetch_request, partition_data
from ingest.worker.settings import EndPosition, FetchSettings, StartPosition
from ingest.worker.truncation import validate_position

__all__ = [
    "END_PROBE_MAX_WAIT_MS",
    "PastLogEndWatch",
    "PositionResolver",
    "Resolved",
    "latest_offset_from_high_watermark",
    "skip_until_timestamp",
]

log = logging.getLogger("ingest.worker")


@dataclass(frozen=True, slots=True)
class Resolved:
    """A run's start and bounds."""

    position: int
    end_offset: int | None = None
    end_timestamp: int | None = None
    # Records before the first one at or after this timestamp are skipped.
    skip_before_timestamp: int | None = None


class PositionResolver:
    """ListOffsets and end probes for one partition, through the cluster's retries.

    ``sizes`` gives the fetcher's current (partition_max_bytes, max_bytes), which the
    end probe asks for like any Fetch.
    """

    def __init__(
        self,
        cluster: Cluster,
        tp: Partition,
        settings: FetchSettings,
        sizes: Callable[[], tuple[int, int]],
    ) -> None:
        self.cluster = cluster
        self.tp = tp
        self.settings = settings
        self._sizes = sizes

    def resolve(self, start: StartPosition, end: EndPosition | None) -> Resolved:
        """The start position, then the end, as ``start`` and ``end`` ask."""
        skip_before: int | None = None
        trusted = self.cluster.trusts_list_offsets()
        if start.kind == "offset":
            assert start.value is not None
            position = start.value
            validate_position(
                self.cluster,
                self.tp,
                position,
                start.leader_epoch,
                self.settings.auto_offset_reset,
            )
        elif start.kind == "earliest":
            position = self.earliest()
        elif start.kind == "latest":
            position = self.latest()
        else:
            assert start.value is not None
            listed = self.list_offset(start.value)
            if listed < 0:
                # No record at or after T yet: start at the end, as Kafka consumers do.
                position = self.latest()
            elif trusted:
                position = listed
            else:
                position, skip_before = skip_until_timestamp(listed, start.value)
        end_offset: int | None = None
        end_timestamp: int | None = None
        if end is not None:
            if end.kind == "offset":
                end_offset = end.value
            elif end.kind == "timestamp" and trusted:
                assert end.value is not None
                listed = self.list_offset(end.value)
                end_offset = listed if listed >= 0 else self.latest()
            else:
                end_offset = self.latest()
                if end.kind == "timestamp":
                    end_timestamp = end.value
        return Resolved(position, end_offset, end_timestamp, skip_before)

    def list_offset(self, timestamp: int) -> int:
        listed = self.cluster.list_offsets(
            {self.tp: timestamp}, isolation_level=self.settings.isolation_code
        )
        return listed[self.tp].offset

    def earliest(self) -> int:
        return self.list_offset(EARLIEST_TIMESTAMP)

    def latest(self) -> int:
        """The end of the partition (read_committed: its last stable offset)."""
        listed = self.list_offset(LATEST_TIMESTAMP)
        if self.cluster.trusts_list_offsets():
            return listed
        partition_max_bytes, max_bytes = self._sizes()
        return latest_offset_from_high_watermark(
            self.cluster,
            self.tp,
            self.settings,
            listed,
            partition_max_bytes=partition_max_bytes,
            max_bytes=max_bytes,
        )

    def reset_target(self, policy: str) -> int:
        """Where ``auto_offset_reset`` (earliest or latest) moves an out-of-range fetch."""
        return self.earliest() if policy == "earliest" else self.latest()


# -- answers checked, not trusted (docs/kafka-compat.md) -----------------------------------

# An end probe's wait. A Fetch with max_wait_ms 0 answers at once on Kafka, but Tansu 0.6.0
# then answers with no partition at all; min_bytes 0 with a short wait answers at once on both.
END_PROBE_MAX_WAIT_MS = 10


def latest_offset_from_high_watermark(
    cluster: Cluster,
    tp: Partition,
    settings: FetchSettings,
    listed: int,
    *,
    partition_max_bytes: int,
    max_bytes: int,
) -> int:
    """The end of the partition: the ListOffsets(LATEST) answer ``listed`` checked
    against a Fetch's high watermark (last stable offset for read_committed), whichever
    is larger.

    On Kafka they are equal. Tansu 0.6.0 answers ListOffsets LATEST with the newest
    batch's base offset + 1, which is too small, while its Fetch high watermark is
    right. A probe offset past the log (OFFSET_OUT_OF_RANGE) leaves ``listed``.
    """
    probe_at = max(listed, 0)

    def probe() -> int:
        connection = cluster.leader_connection(tp.topic, tp.partition)
        request = fetch_request(
            tp.topic,
            tp.partition,
            probe_at,
            settings,
            partition_max_bytes=partition_max_bytes,
            max_bytes=max_bytes,
            session_id=0,
            epoch=FINAL_EPOCH,
            include=True,
            max_wait_ms=END_PROBE_MAX_WAIT_MS,
            min_bytes=0,
        )
        context = f"{connection.describe()}, Fetch (end probe) of {tp}"
        response = expect_response(cluster.request(connection, request), FetchResponse, context)
        data = partition_data(response, tp.topic, tp.partition)
        if data is None:
            raise ProtocolError(f"{context}: the answer does not name the partition")
        if data.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
            return -1  # the probe offset is past the log: ListOffsets is all we have
        if data.error_code:
            info = error_for(data.error_code)
            cluster.note_error(data.error_code, tp.topic)
            raise BrokerError(info.code, info.name, info.retriable, context=context)
        if settings.read_committed and data.last_stable_offset >= 0:
            return data.last_stable_offset
        return data.high_watermark

    end = cluster.retrying(f"Fetch end probe of {tp}", probe)
    if end != listed:
        log.info(
            "%s: ListOffsets says the end is %d, a Fetch says %d; using %d",
            tp,
            listed,
            end,
            max(listed, end),
        )
    return max(listed, end)


def skip_until_timestamp(listed: int, timestamp: int) -> tuple[int, int]:
    """A timestamp start: the ListOffsets(T) answer ``listed``, and T, before whose first
    record the fetcher skips (``window.skip_before_timestamp``).

    On Kafka the answer already is that record, so nothing is skipped. Tansu 0.6.0
    looks up the time a batch was stored, which is at or after its records'
    CreateTime, so its answer is at or before the right record and the skip corrects
    it. (Not correctable this way: a broker answering too late, e.g. a producer clock
    ahead of Tansu's.)
    """
    return listed, timestamp


class PastLogEndWatch:
    """A Fetch past the high watermark answered without an error.

    Kafka answers OFFSET_OUT_OF_RANGE past the log end (so ``auto_offset_reset``
    applies) and waits between the high watermark and the log end; Tansu 0.6.0 just
    answers nothing, forever. The fetcher waits for records, warning once.
    """

    def __init__(self, tp: Partition) -> None:
        self.tp = tp
        self.warned = False

    def check(self, fetch_offset: int, high_watermark: int) -> None:
        if fetch_offset > high_watermark >= 0 and not self.warned:
            self.warned = True
            log.warning(
                "%s: fetch offset %d is past the high watermark %d; waiting for records",
                self.tp,
                fetch_offset,
                high_watermark,
            )
