"""Living within the handoff's space: measure it at start, plan the sizes that fit.

A container's ``/dev/shm`` is 64 MiB unless ``--shm-size`` says otherwise, and a
Kubernetes pod's is whatever its memory-backed ``emptyDir`` allows; the defaults
(64 MiB segments, a 1 GiB buffer cap) assume far more. So at start the supervisor
measures the free space of the handoff's filesystem (``statvfs``; object stores
have no such bound) and plans within a share of it:

* the **budget** is ``BUDGET_SHARE`` of the free space: the rest is headroom for
  the Fetch answers that arrive after a pause, and for other writers;
* each assigned partition keeps one **open segment**: ``segment_max_bytes`` is
  at most budget / (4 x partitions), never below ``MIN_SEGMENT_BYTES``;
* the **global buffer cap** (sealed segments not yet durable) takes what the open
  segments leave: budget - partitions x segment;
* the workers' own caps share the global one (each at least two segments), so
  their sum is bounded even before the supervisor's pause reaches them.

If not even one ``MIN_SEGMENT_BYTES`` segment per partition fits in the budget,
the run is refused (``HandoffTooSmall``, exit 2) with the free space, the need and
the knobs. The plan is redone whenever the number of partitions changes.

A plan is a bound, not a reservation: another process may fill the filesystem
anyway. Then a segment write meets ENOSPC, which the writer turns into
``HandoffFull`` and the worker into backpressure (see ``worker/loop.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ingest.errors import ConfigError

__all__ = [
    "BUDGET_SHARE",
    "MIN_SEGMENT_BYTES",
    "HandoffTooSmall",
    "SpacePlan",
    "Wanted",
    "free_bytes",
    "plan_space",
]

BUDGET_SHARE = 0.75
MIN_SEGMENT_BYTES = 1024 * 1024
_MIB = 1024 * 1024


class HandoffTooSmall(ConfigError):
    """The handoff's filesystem cannot hold one segment per partition."""


@dataclass(frozen=True, slots=True)
class Wanted:
    """The configured sizes, which a plan may only lower."""

    segment_max_bytes: int
    max_buffered_bytes: int
    max_unacked_bytes: int
    resume_unacked_bytes: int


@dataclass(frozen=True, slots=True)
class SpacePlan:
    """Sizes that fit the handoff: what the supervisor and its workers use."""

    segment_max_bytes: int
    max_buffered_bytes: int
    max_unacked_bytes: int
    resume_unacked_bytes: int
    free_bytes: int | None  # measured at start; None: no bound (an object store)
    partitions: int

    @property
    def budget_bytes(self) -> int:
        return int(self.free_bytes * BUDGET_SHARE) if self.free_bytes is not None else 0

    @property
    def resume_buffered_bytes(self) -> int:
        return self.max_buffered_bytes // 2


def free_bytes(path: str) -> int | None:
    """Bytes an unprivileged writer may still use on the filesystem holding ``path``
    (``statvfs``); None for an object store (a URI) or a path that is not there."""
    if "://" in path:
        return None
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def plan_space(wanted: Wanted, free: int | None, partitions: int, *, where: str) -> SpacePlan:
    """The sizes for ``partitions`` open segments within ``free`` bytes (None: no bound).

    Raises ``HandoffTooSmall`` when one ``MIN_SEGMENT_BYTES`` segment per partition
    does not fit in the budget."""
    partitions = max(1, partitions)
    if free is None:
        return SpacePlan(
            wanted.segment_max_bytes,
            wanted.max_buffered_bytes,
            wanted.max_unacked_bytes,
            wanted.resume_unacked_bytes,
            None,
            partitions,
        )
    budget = int(free * BUDGET_SHARE)
    need = partitions * MIN_SEGMENT_BYTES
    if budget < need:
        raise HandoffTooSmall(
            f"{where} has {free / _MIB:.1f} MiB free; {partitions} partition(s) need at "
            f"least {need / BUDGET_SHARE / _MIB:.1f} MiB (one {MIN_SEGMENT_BYTES // _MIB} MiB "
            f"segment each, in {BUDGET_SHARE:.0%} of the free space). Give the handoff more "
            "room: a larger filesystem for handoff.root, handoff.mode = 'files' on a disk, "
            "Docker's --shm-size, or a Kubernetes emptyDir with medium: Memory and a "
            "sizeLimit mounted at /dev/shm",
            key="handoff",
        )
    segment = min(wanted.segment_max_bytes, max(MIN_SEGMENT_BYTES, budget // (4 * partitions)))
    buffered = min(wanted.max_buffered_bytes, max(2, budget - partitions * segment))
    # The workers' own caps share the global one: their sum is bounded without waiting
    # for the supervisor's pause to travel (each may still overshoot by one Fetch answer).
    unacked = min(wanted.max_unacked_bytes, max(2 * segment, buffered // partitions))
    resume = min(wanted.resume_unacked_bytes, unacked // 2)
    return SpacePlan(segment, buffered, unacked, resume, free, partitions)
