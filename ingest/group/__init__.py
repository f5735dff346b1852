"""Consumer-group membership, sans I/O: the state machines and the partition assignors.

``GroupMachine`` (the classic protocol) and ``ConsumerMachine`` (the consumer
protocol of KIP-848) take inputs (commands, ticks, driver reports, decoded
coordinator responses) with the current monotonic time and return outputs
(requests to send, lookups to make, events). A driver in a higher layer does
the I/O. Nothing here reads a clock, opens a socket or starts a thread.

Each protocol has its sub-package, ``classic/`` and ``consumer/`` (tables, settings,
requests, the member's record, the machine); both run on one table engine
(``engine.py``) and share the root modules: events, in-flight requests, the
coordinator link, commits and offset fetches, requests both send, value types, the
assignors and their snapshot. The sub-packages import the root, never each other;
only this module imports both, to re-export them.
"""

from __future__ import annotations

from ingest.group.assignors import (
    Assignor,
    CooperativeStickyAssignor,
    MemberAssignment,
    MemberSubscription,
    RangeAssignor,
    RoundRobinAssignor,
)
from ingest.group.classic.classic_config import GroupConfig
from ingest.group.classic.classic_machine import GroupMachine
from ingest.group.classic.classic_transitions import TRANSITIONS
from ingest.group.consumer.consumer_config import ConsumerGroupConfig
from ingest.group.consumer.consumer_events import (
    GroupWarning,
    NeedTopicNames,
    SubscribeRegex,
    TopicNames,
)
from ingest.group.consumer.consumer_machine import ConsumerMachine
from ingest.group.consumer.consumer_transitions import ConsumerState
from ingest.group.coordinator_versions import CoordinatorVersions
from ingest.group.events import (
    INPUT_TYPES,
    OUTPUT_TYPES,
    Commit,
    CommitFailed,
    CommittedOffset,
    CoordinatorFound,
    CoordinatorLookupFailed,
    CoordinatorLost,
    Fatal,
    Fenced,
    FetchCommitted,
    FindCoordinator,
    Input,
    Leave,
    Left,
    MetadataUpdate,
    NeedMetadata,
    OffsetFetchFailed,
    OffsetsCommitted,
    OffsetsFetched,
    Output,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
    RequestFailed,
    RevocationDone,
    SendRequest,
    Subscribe,
    Tick,
)
from ingest.group.types import InvalidTransition, MemberState, RebalanceProtocol
from ingest.protocol.partition import Partition

__all__ = [
    "INPUT_TYPES",
    "OUTPUT_TYPES",
    "TRANSITIONS",
    "Assignor",
    "Commit",
    "CommitFailed",
    "CommittedOffset",
    "ConsumerGroupConfig",
    "ConsumerMachine",
    "ConsumerState",
    "CooperativeStickyAssignor",
    "CoordinatorFound",
    "CoordinatorLookupFailed",
    "CoordinatorLost",
    "CoordinatorVersions",
    "Fatal",
    "Fenced",
    "FetchCommitted",
    "FindCoordinator",
    "GroupConfig",
    "GroupMachine",
    "GroupWarning",
    "Input",
    "InvalidTransition",
    "Leave",
    "Left",
    "MemberAssignment",
    "MemberState",
    "MemberSubscription",
    "MetadataUpdate",
    "NeedMetadata",
    "NeedTopicNames",
    "OffsetFetchFailed",
    "OffsetsCommitted",
    "OffsetsFetched",
    "Output",
    "Partition",
    "PartitionsAssigned",
    "PartitionsLost",
    "PartitionsRevoked",
    "RangeAssignor",
    "RebalanceProtocol",
    "RequestFailed",
    "RevocationDone",
    "RoundRobinAssignor",
    "SendRequest",
    "Subscribe",
    "SubscribeRegex",
    "Tick",
    "TopicNames",
]
