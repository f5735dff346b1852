"""Partition workers: one process per partition fetching into Arrow IPC segments.

``fetcher.py`` is the fetch loop (start positions, Fetch, decoding, recovery,
KIP-227 sessions), ``loop.py`` drives it into a ``SegmentWriter`` under controls
and backpressure, ``process.py`` runs that in a spawned process and gives the
parent a ``WorkerHandle``.
"""

from ingest.worker.fetcher import (
    CorruptRange,
    FetchResult,
    FetchSession,
    OffsetReset,
    PartitionFetcher,
    UnreadableCorruption,
)
from ingest.worker.loop import ControlInbox, PartitionWorker
from ingest.worker.messages import (
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
    WorkerFailed,
    WorkerFinished,
    WorkerStarted,
)
from ingest.worker.process import WorkerHandle, prestart_fork_server, spawn_workers
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
    "prestart_fork_server",
    "spawn_workers",
]
