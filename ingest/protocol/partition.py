"""One partition of one topic: the one key of a partition from Fetch to OffsetCommit.

The client (ListOffsets, leaders), the worker, the sink (txn versions, durable
offsets), the group (assignments, commits) and the supervisor all name a
partition with this type. It lives here, at the bottom, so every layer may
import it. (``consumer.TopicPartition`` is something else: the wire struct of
one topic and a list of its partitions.)
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["TOPIC_NAME", "Partition", "topic_name_problem"]

# Apache Kafka's rule for topic names (``Topic.validate``): 1 to 249 of these characters,
# and not "." or "..". Other brokers may hand out names outside it.
TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")


class Partition(NamedTuple):
    """One partition of one topic (Kafka's ``TopicPartition``); prints as ``topic-N``."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


def topic_name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a Kafka topic name, or None when Kafka would take it."""
    if name in (".", ".."):
        return f"{name!r} is not a topic name Kafka allows"
    if not TOPIC_NAME.fullmatch(name):
        return (
            f"{name[:300]!r} is not a topic name Kafka allows "
            "(1 to 249 of a-z, A-Z, 0-9, '.', '_' and '-')"
        )
    return None
