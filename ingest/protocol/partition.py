"""One partition of one topic: the one key of a partition from Fetch to OffsetCommit.

The client (ListOffsets, leaders), the worker, the sink (txn versions, durable
offsets), the group (assignments, commits) and the supervisor all name a
partition with this type. It lives here, at the bottom, so every layer may
import it. (``consumer.TopicPartition`` is something else: the wire struct of
one topic and a list of its partitions.)
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Partition"]


class Partition(NamedTuple):
    """One partition of one topic (Kafka's ``TopicPartition``); prints as ``topic-N``."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"
