"""What the consumer-protocol machine (KIP-848) takes and gives beyond the classic machine's events.

``ConsumerMachine`` takes the classic inputs that mean the same thing (Subscribe,
Leave, Commit, FetchCommitted, RevocationDone, Tick, CoordinatorFound,
CoordinatorLookupFailed, CoordinatorLost, RequestFailed) and gives the same outputs
(SendRequest, FindCoordinator, PartitionsAssigned, PartitionsRevoked,
PartitionsLost, Fenced, Fatal, Left, and the offset events), so one driver can run
either machine. What is new here:

- ``SubscribeRegex``: subscribe to the topics a regular expression matches, resolved
  by the coordinator (ConsumerGroupHeartbeat v1's ``subscribed_topic_regex``).
- ``NeedTopicNames`` / ``TopicNames``: the coordinator assigns partitions by topic id;
  the driver looks up the names of ids the machine does not know (Metadata v10+
  answers both) and feeds them back.
- ``GroupWarning``: a heartbeat error the member survives (TOPIC_AUTHORIZATION_FAILED:
  the coordinator cannot assign a topic it may not read), reported so it is seen.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ingest.group.events import (
    OUTPUT_TYPES,
    Commit,
    CoordinatorFound,
    CoordinatorLookupFailed,
    CoordinatorLost,
    FetchCommitted,
    Leave,
    Output,
    RequestFailed,
    RevocationDone,
    Subscribe,
    Tick,
)
from ingest.protocol.messages import (
    ConsumerGroupHeartbeatResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
)

__all__ = [
    "CONSUMER_INPUT_TYPES",
    "CONSUMER_OUTPUT_TYPES",
    "ConsumerInput",
    "ConsumerOutput",
    "GroupWarning",
    "NeedTopicNames",
    "SubscribeRegex",
    "TopicNames",
]


@dataclass(frozen=True)
class SubscribeRegex:
    """Subscribe to every topic ``pattern`` matches, as the coordinator resolves it (RE2/J).

    Needs ConsumerGroupHeartbeat v1; the coordinator checks the pattern itself
    (INVALID_REGULAR_EXPRESSION).
    """

    pattern: str

    def __post_init__(self) -> None:
        if not self.pattern:
            raise ValueError("SubscribeRegex needs a pattern (use Leave to stop)")


@dataclass(frozen=True)
class TopicNames:
    """Names of topic ids (the answer to NeedTopicNames); None: no such topic (now)."""

    names: Mapping[uuid.UUID, str | None]

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", MappingProxyType(dict(self.names)))

    def __deepcopy__(self, memo: dict[int, object]) -> TopicNames:
        return self  # immutable


@dataclass(frozen=True)
class NeedTopicNames:
    """The coordinator assigned partitions of these topic ids: answer with TopicNames."""

    topic_ids: frozenset[uuid.UUID]


@dataclass(frozen=True)
class GroupWarning:
    """A coordinator error the member survives; it keeps its partitions and retries."""

    error_code: int
    error_name: str
    message: str


ConsumerInput = (
    Subscribe
    | SubscribeRegex
    | Leave
    | Commit
    | FetchCommitted
    | RevocationDone
    | Tick
    | TopicNames
    | CoordinatorFound
    | CoordinatorLookupFailed
    | CoordinatorLost
    | RequestFailed
    | ConsumerGroupHeartbeatResponse
    | OffsetCommitResponse
    | OffsetFetchResponse
)

CONSUMER_INPUT_TYPES: tuple[type, ...] = (
    Subscribe,
    SubscribeRegex,
    Leave,
    Commit,
    FetchCommitted,
    RevocationDone,
    Tick,
    TopicNames,
    CoordinatorFound,
    CoordinatorLookupFailed,
    CoordinatorLost,
    RequestFailed,
    ConsumerGroupHeartbeatResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
)

ConsumerOutput = Output | NeedTopicNames | GroupWarning

CONSUMER_OUTPUT_TYPES: tuple[type, ...] = (*OUTPUT_TYPES, NeedTopicNames, GroupWarning)
