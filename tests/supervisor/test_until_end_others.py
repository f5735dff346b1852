"""``--until-end``: partitions owned elsewhere, or not assigned yet, hold the run until the
group has them committed at the snapshot's ends (``ingest/membership/until_end.py``).

A KIP-848 member's first assignment is often empty; ending on it, exit 0 with nothing
landed, happened in scripts/bench/e2e.py (500k records: no table, no commit).
"""

from __future__ import annotations

from collections.abc import Mapping

from ingest.group import CommittedOffset
from ingest.membership.until_end import CHECK_EVERY_S, OthersWatch
from ingest.protocol.partition import Partition

P0, P1, P2, P3 = (Partition("t", n) for n in range(4))


class Group:
    """The committed offsets the group holds, as OffsetFetch would answer them."""

    def __init__(self) -> None:
        self.offsets: dict[Partition, int] = {}
        self.asked: list[list[Partition]] = []

    def fetch(self, partitions: list[Partition]) -> Mapping[Partition, CommittedOffset | None]:
        self.asked.append(sorted(partitions))
        return {
            p: CommittedOffset(self.offsets[p], "", -1) if p in self.offsets else None
            for p in partitions
        }


def test_an_empty_assignment_waits_for_the_group_to_hold_the_ends() -> None:
    group = Group()
    watch = OthersWatch({P0: 10, P1: 0, P2: 5, P3: 7}, group.fetch)
    assert not watch.landed(set(), 0.0)  # nothing committed: not the end
    assert group.asked == [[P0, P2, P3]]  # an empty partition has nothing to land
    group.offsets = {P0: 10, P2: 4}
    assert not watch.landed(set(), 0.1)  # asked at most every CHECK_EVERY_S
    assert len(group.asked) == 1
    assert not watch.landed(set(), CHECK_EVERY_S)  # P2 short of its end, P3 not committed
    group.offsets.update({P2: 5, P3: 9})
    assert watch.landed(set(), 2 * CHECK_EVERY_S)
    assert group.asked[-1] == [P2, P3]  # P0 is not asked again


def test_owned_partitions_are_left_to_the_run_itself() -> None:
    group = Group()
    watch = OthersWatch({P0: 10, P1: 3}, group.fetch)
    assert watch.landed({P0, P1}, 0.0)
    assert group.asked == []
    group.offsets = {P1: 3}
    assert watch.landed({P0}, 1.0)
    assert group.asked == [[P1]]
