"""``ingest run --until-end``: the partitions of the snapshot that this member does not own.

The run snapshots each partition's end at start and ends once everything below those ends
is landed. The partitions it owns, it lands itself. The others may be owned by another
member (a second ``--until-end`` run, a continuous run), or by nobody yet: under the
consumer protocol (KIP-848) a member's first assignment is often empty, the coordinator
filling it in on a later heartbeat. Ending then, with exit 0 and nothing landed, would be a
lie. So the run ends only when the group's committed offset of each partition it does not
own has reached its end: the owner commits it after the Delta commit, past the last data
record (control records and all), so this holds exactly when the table has the partition's
records below the end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

from ingest.group import CommittedOffset
from ingest.logs import event
from ingest.membership.committed import committed_value
from ingest.protocol.partition import Partition

__all__ = ["OthersWatch"]

log = logging.getLogger("ingest.supervisor")

CHECK_EVERY_S = 0.5
SAY_EVERY_S = 10.0


class OthersWatch:
    """Whether the group holds the snapshot's ends of the partitions owned elsewhere."""

    def __init__(
        self,
        ends: Mapping[Partition, int],
        fetch: Callable[[list[Partition]], Mapping[Partition, CommittedOffset | None]],
    ) -> None:
        self.ends = ends
        self.fetch = fetch
        self._next_check = 0.0
        self._said_at = 0.0
        self._done: set[Partition] = set()

    def landed(self, owned: Collection[Partition], now: float) -> bool:
        """True once every partition of the snapshot outside ``owned`` (with records
        below its end) is committed at its end; asks the group at most every 0.5 s."""
        others = [
            p for p, end in self.ends.items() if end > 0 and p not in owned and p not in self._done
        ]
        if not others:
            return True
        if now < self._next_check:
            return False
        self._next_check = now + CHECK_EVERY_S
        committed = self.fetch(others)
        for partition in others:
            offset = committed_value(committed.get(partition))
            if offset is not None and offset >= self.ends[partition]:
                self._done.add(partition)
        left = [p for p in others if p not in self._done]
        if left and now - self._said_at >= SAY_EVERY_S:
            self._said_at = now
            event(
                log,
                "until_end_waiting",
                reason="partitions owned elsewhere (or not assigned yet) are not landed to the end",
                partitions=",".join(str(p) for p in sorted(left)),
            )
        return not left
