"""Partition workers: one process per partition fetching into Arrow IPC segments.

``fetcher.py`` is the fetch loop (Fetch, decoding, recovery) over
``positions.py`` (start and end positions; the broker answers checked rather than
trusted), ``fetch_session.py`` (the KIP-227 fetch session), ``window.py`` (cutting an
answer to the run) and ``results.py`` (what a poll returns); ``loop.py`` drives
it into a ``SegmentWriter`` under controls and backpressure, ``process.py`` runs
that in a spawned process and gives the parent a ``WorkerHandle``. ``truncation.py``
validates a restored position with OffsetForLeaderEpoch; ``ends.py`` reads where
partitions end now.
"""

from ingest.worker.fetch_session import FetchSession
from ingest.worker.fetcher import PartitionFetcher
from ingest.worker.loop import ControlInbox, PartitionWorker
from ingest.worker.parent_messages import (
    BackpressureChanged,
    Control,
    CorruptRangeReported,
    Event,
    Limits,
    OffsetResetApplied,
    Pause,
    Release,
    Resume,
    SegmentSealed,
    StopAfterSeal,
    StopNow,
    WorkerFailed,
    WorkerFinished,
    WorkerStarted,
)
from ingest.worker.process import WorkerHandle
from ingest.worker.results import CorruptRange, FetchResult, OffsetReset, UnreadableCorruption
from ingest.worker.settings import EndPosition, FetchSettings, StartPosition, WorkerSettings

__all__ = [
    "BackpressureChanged",
    "Control",
    "ControlInbox",
    "CorruptRange",
    "CorruptRangeReported",
    "EndPosition",
    "Event",
    "FetchResult",
    "FetchSession",
    "FetchSettings",
    "Limits",
    "OffsetReset",
    "OffsetResetApplied",
    "PartitionFetcher",
    "PartitionWorker",
    "Pause",
    "Release",
    "Resume",
    "SegmentSealed",
    "StartPosition",
    "StopAfterSeal",
    "StopNow",
    "UnreadableCorruption",
    "WorkerFailed",
    "WorkerFinished",
    "WorkerHandle",
    "WorkerSettings",
    "WorkerStarted",
]
