"""Messages between a worker process and its parent: controls down, events up.

Frozen dataclasses, pickled over ``multiprocessing`` pipes. The handoff events
(``SegmentSealed``, ``CorruptRangeReported``) are defined in ``ingest.handoff``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ingest.handoff.messages import CorruptRangeReported, SegmentSealed

__all__ = [
    "BackpressureChanged",
    "Control",
    "CorruptRangeReported",
    "Event",
    "Limits",
    "OffsetResetApplied",
    "Pause",
    "Release",
    "Resume",
    "SegmentSealed",
    "StopAfterSeal",
    "StopNow",
    "WorkerFailed",
    "WorkerFinished",
    "WorkerStarted",
]

# -- parent to worker ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pause:
    """Stop fetching (the Fetch in flight, if any, is still taken in)."""


@dataclass(frozen=True, slots=True)
class Resume:
    """Fetch again (backpressure may still hold the worker)."""


@dataclass(frozen=True, slots=True)
class StopAfterSeal:
    """Seal the open segment, report it, exit 0."""


@dataclass(frozen=True, slots=True)
class StopNow:
    """Exit within a second; the open segment is dropped (its records are fetched again
    from the last sealed segment's next offset by whoever takes over)."""


@dataclass(frozen=True, slots=True)
class Release:
    """These segments (and corrupt side files) are durable downstream and deleted."""

    item_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Limits:
    """New sizes from the handoff's space plan (the partitions assigned changed)."""

    segment_max_bytes: int
    max_unacked_bytes: int
    resume_unacked_bytes: int


Control = Pause | Resume | StopAfterSeal | StopNow | Release | Limits

# -- worker to parent ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerStarted:
    topic: str
    partition: int
    pid: int
    start_offset: int
    end_offset: int | None
    how: str  # the start position's kind and value, e.g. "timestamp 1700000000000"


@dataclass(frozen=True, slots=True)
class OffsetResetApplied:
    """OFFSET_OUT_OF_RANGE moved the position (records between may be lost)."""

    topic: str
    partition: int
    old_offset: int
    new_offset: int
    policy: str
    reason: str


@dataclass(frozen=True, slots=True)
class BackpressureChanged:
    """The worker stopped (``paused``) or resumed fetching: because of its unreleased
    bytes (``unacked``), or because the handoff's filesystem is full (``handoff_full``)."""

    partition: int
    paused: bool
    unacked_bytes: int
    reason: Literal["unacked", "handoff_full"] = "unacked"


@dataclass(frozen=True, slots=True)
class WorkerFinished:
    """The worker is about to exit 0. ``next_offset``: where a successor starts. Every
    offset below it is in a sealed segment, in a corrupt report, or holds no data
    record; after ``stop_now`` it is the end of the last sealed segment's span."""

    topic: str
    partition: int
    reason: Literal["end", "stopped", "stop_now"]
    next_offset: int
    segments: int
    records: int


@dataclass(frozen=True, slots=True)
class WorkerFailed:
    """Sent just before a worker exits non-zero."""

    topic: str
    partition: int
    error_type: str
    message: str
    traceback: str
    # ``ingest.errors.is_transient``: a store or server unreachable for now (the restart
    # policy then allows ``worker.retry_for`` beyond the restart count).
    transient: bool = False


Event = (
    WorkerStarted
    | SegmentSealed
    | CorruptRangeReported
    | OffsetResetApplied
    | BackpressureChanged
    | WorkerFinished
    | WorkerFailed
)
