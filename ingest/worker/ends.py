"""Where partitions end now, read with ``PartitionFetcher.latest_offset``: ListOffsets (the
last stable offset under read_committed), checked against a Fetch's high watermark on
brokers whose ListOffsets "latest" is wrong (Tansu 0.6.0; docs/kafka-compat.md).
``end_marks`` gives both ends, and the newest record's timestamp where the broker answers
MAX_TIMESTAMP."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from ingest.client import Cluster
from ingest.protocol.messages import MAX_TIMESTAMP, MAX_TIMESTAMP_MIN_VERSION, ListOffsetsRequest
from ingest.protocol.partition import Partition
from ingest.worker.fetcher import PartitionFetcher
from ingest.worker.settings import FetchSettings, StartPosition

__all__ = ["EndMarks", "end_marks", "end_offsets"]


def end_offsets(
    cluster: Cluster, partitions: Iterable[Partition], settings: FetchSettings
) -> dict[Partition, int]:
    """The end of each partition now (read_committed: its last stable offset)."""
    ends: dict[Partition, int] = {}
    for partition in partitions:
        fetcher = PartitionFetcher(
            cluster, partition.topic, partition.partition, settings, start=StartPosition.earliest()
        )
        ends[partition] = fetcher.latest_offset()
    return ends


@dataclass(frozen=True)
class EndMarks:
    """Where a partition ends now: the high watermark, the last stable offset (below
    it while a transaction is open), and the newest record's timestamp (None: the
    partition is empty, or the broker is not asked MAX_TIMESTAMP)."""

    high_watermark: int
    last_stable_offset: int
    newest_timestamp: int | None

    @property
    def held_back(self) -> int:
        """Offsets an open transaction keeps from a read_committed reader."""
        return max(self.high_watermark - self.last_stable_offset, 0)


def end_marks(
    cluster: Cluster, partitions: Iterable[Partition], settings: FetchSettings
) -> dict[Partition, EndMarks]:
    """Both ends of each partition and its newest record's time. MAX_TIMESTAMP
    (ListOffsets v7+) is asked only of a broker whose ListOffsets answers are trusted:
    Tansu 0.6.0 advertises v7 but closes the connection on it."""
    wanted = sorted(set(partitions))
    high = end_offsets(cluster, wanted, replace(settings, isolation_level="read_uncommitted"))
    stable = end_offsets(cluster, wanted, replace(settings, isolation_level="read_committed"))
    newest: dict[Partition, int | None] = dict.fromkeys(wanted)
    if wanted and cluster.trusts_list_offsets():
        version = cluster.any_connection().version_for(ListOffsetsRequest.api_key)
        if version >= MAX_TIMESTAMP_MIN_VERSION:
            listed = cluster.list_offsets({p: MAX_TIMESTAMP for p in wanted}, isolation_level=0)
            newest = {p: (v.timestamp if v.offset >= 0 else None) for p, v in listed.items()}
    return {p: EndMarks(high[p], stable[p], newest[p]) for p in wanted}
