"""read_committed across Fetch answers: Kafka's aborted-transaction filter, and what a
client can check of the broker's side of that contract.

Kafka's rule (the Java consumer's ``CompletedFetch``): walking batches in offset order, an
entry of the answer's ``aborted_transactions`` whose first offset is at or below a batch's
last offset marks its producer aborted; that producer's transactional batches are dropped
until its ABORT marker. A broker that keeps the contract lists every aborted transaction
with data in the answer, and answers nothing past its last stable offset, so every
transactional batch it returns is decided, and every one it does not list is committed.

A broker may break it: Tansu 0.6.0 lists no aborted transaction and answers up to the high
watermark, open transactions included. The walk checks the contract from the log itself:
a transactional batch that was kept must be followed by its producer's COMMIT marker.

* **An unlisted abort within one answer.** The ABORT marker is in the same answer as
  kept data of its producer: that data is dropped before it is handed on, and the
  answer reports it (``UnlistedAbort``) so the broker's fault is logged.
* **An unlisted abort across answers.** Kept data was handed on in an earlier answer with
  no marker (``open_transactions``, which the fetcher carries into the next answer as
  ``carried``); a later answer shows its ABORT. The records may already be on their way to
  the table, so the answer reports it (``carried_aborts``) and the fetcher stops with a
  fatal error naming the broker's fault, before the batch that holds them can commit.

On Apache Kafka neither check ever fires: both cost one dict lookup per transactional
batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["CommittedWalk", "UnlistedAbort"]

CONTROL_ABORT = 0


@dataclass(frozen=True)
class UnlistedAbort:
    """Records of an aborted transaction that the broker did not list in
    ``aborted_transactions``: a broker fault. ``first_offset`` is the first of them this
    client kept, ``marker_offset`` the ABORT marker that showed them aborted."""

    producer_id: int
    first_offset: int
    marker_offset: int


class CommittedWalk:
    """One answer's batches, in offset order, through the read_committed rules.

    Feed every valid batch that carries a producer id: ``data`` for a transactional data
    batch (returns whether it is kept), ``marker`` for a control batch (returns the indices
    of kept batches its ABORT turns out to abort). Then ``open_transactions()`` gives what
    the next answer must be checked against.
    """

    def __init__(
        self,
        aborted_transactions: Sequence[tuple[int, int]] | None,
        fetch_offset: int | None,
        carried: Mapping[int, int] | None = None,
    ) -> None:
        self._pending = sorted(aborted_transactions or (), key=lambda txn: txn[1])
        self._next = 0
        self._aborted: set[int] = set()
        self._fetch_offset = fetch_offset
        # producer id -> first offset handed on by earlier answers, marker not yet seen
        self._carried = dict(carried or {})
        # producer id -> (first kept offset, indices of kept batches) since its last marker
        self._open: dict[int, tuple[int, list[int]]] = {}
        self.unlisted: list[UnlistedAbort] = []
        self.carried_aborts: list[UnlistedAbort] = []

    def reach(self, last_offset: int) -> None:
        """Listed aborts begin at or below ``last_offset``: mark their producers."""
        while self._next < len(self._pending) and self._pending[self._next][1] <= last_offset:
            self._aborted.add(self._pending[self._next][0])
            self._next += 1

    def data(self, index: int, producer_id: int, base_offset: int, last_offset: int) -> bool:
        """A transactional data batch: False when a listed abort drops it."""
        if producer_id in self._aborted:
            return False
        if self._fetch_offset is not None and last_offset < self._fetch_offset:
            return True  # below the fetch offset: not handed on anyway
        first = base_offset if self._fetch_offset is None else max(base_offset, self._fetch_offset)
        _, kept = self._open.setdefault(producer_id, (first, []))
        kept.append(index)
        return True

    def marker(self, producer_id: int, offset: int, marker: int) -> list[int]:
        """A control batch; returns the kept batches an unlisted ABORT aborts."""
        if marker == CONTROL_ABORT:
            self._aborted.discard(producer_id)
        if self._fetch_offset is not None and offset < self._fetch_offset:
            return []  # read by an earlier answer
        opened = self._open.pop(producer_id, None)
        carried = self._carried.pop(producer_id, None)
        if marker != CONTROL_ABORT:
            return []
        if carried is not None:
            self.carried_aborts.append(UnlistedAbort(producer_id, carried, offset))
        if opened is None:
            return []
        first, kept = opened
        self.unlisted.append(UnlistedAbort(producer_id, first, offset))
        return kept

    def open_transactions(self) -> tuple[tuple[int, int], ...]:
        """Producers whose kept data has no marker yet: (producer id, first offset),
        those carried in included, ordered by producer id."""
        opened = dict(self._carried)
        for producer_id, (first, _) in self._open.items():
            opened.setdefault(producer_id, first)
        return tuple(sorted(opened.items()))
