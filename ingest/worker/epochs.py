"""The partition leader epochs of the offsets a worker has fetched (KIP-101, KIP-320).

Each record batch names the epoch of the leader that wrote it. A sealed segment
carries the epoch of the batch holding its last offset (``next_offset - 1``), so
that the OffsetCommit of ``next_offset`` records it as ``committed_leader_epoch``
and a later start from that offset can be validated with OffsetForLeaderEpoch.
Pure: no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

__all__ = ["EpochTrack"]


class EpochTrack:
    """Runs of (first offset, epoch), ascending by offset."""

    def __init__(self) -> None:
        self._bases: list[int] = []
        self._epochs: list[int] = []

    def __repr__(self) -> str:
        return f"EpochTrack({list(zip(self._bases, self._epochs, strict=True))})"

    def note(self, runs: Iterable[tuple[int, int]]) -> None:
        """Adds a Fetch answer's epoch changes. A run at or below a known one (the
        position moved back: a reset, a restart) replaces what followed it."""
        for base, epoch in runs:
            if self._bases and base <= self._bases[-1]:
                cut = bisect.bisect_left(self._bases, base)
                del self._bases[cut:], self._epochs[cut:]
            if self._epochs and self._epochs[-1] == epoch:
                continue
            self._bases.append(base)
            self._epochs.append(epoch)

    def at(self, offset: int) -> int:
        """The epoch of the batch holding ``offset``; -1 if none was seen."""
        index = bisect.bisect_right(self._bases, offset) - 1
        return self._epochs[index] if index >= 0 else -1

    def trim(self, offset: int) -> None:
        """Forgets the runs wholly below ``offset`` (keeps the one holding it)."""
        index = bisect.bisect_right(self._bases, offset) - 1
        if index > 0:
            del self._bases[:index], self._epochs[:index]
