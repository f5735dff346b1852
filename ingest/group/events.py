"""Inputs the group machine accepts and outputs it returns.

Inputs are local commands (Subscribe, Leave, Commit, FetchCommitted,
RevocationDone), clock ticks (Tick; ``now`` goes with every input), driver
reports (CoordinatorFound, CoordinatorLookupFailed, CoordinatorLost,
RequestFailed, MetadataUpdate) and the codec's decoded coordinator responses.

Outputs are instructions for the driver (SendRequest, FindCoordinator,
NeedMetadata) and events for the application (the rest).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ingest.errors import GroupError, GroupProtocolError, LocalProtocolError, RemoteProtocolError
from ingest.group.coordinator_versions import CoordinatorVersions
from ingest.protocol.messages import (
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
    SyncGroupResponse,
)
from ingest.protocol.partition import Partition
from ingest.protocol.schema import Request

__all__ = [
    "INPUT_TYPES",
    "OUTPUT_TYPES",
    "Commit",
    "CommitFailed",
    "CommittedOffset",
    "CoordinatorFound",
    "CoordinatorLookupFailed",
    "CoordinatorLost",
    "Fatal",
    "Fenced",
    "FetchCommitted",
    "FindCoordinator",
    "Input",
    "Leave",
    "Left",
    "MetadataUpdate",
    "NeedMetadata",
    "OffsetFetchFailed",
    "OffsetsCommitted",
    "OffsetsFetched",
    "Output",
    "PartitionsAssigned",
    "PartitionsLost",
    "PartitionsRevoked",
    "RequestFailed",
    "RevocationDone",
    "SendRequest",
    "Subscribe",
    "Tick",
]


# -- inputs: local commands ---------------------------------------------------------


@dataclass(frozen=True)
class Subscribe:
    """Join (or change the subscription to) these topics."""

    topics: frozenset[str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", frozenset(self.topics))
        if not self.topics:
            raise ValueError("Subscribe needs at least one topic (use Leave to stop)")


@dataclass(frozen=True)
class Leave:
    """Leave the group. Static members send LeaveGroup only with ``force`` or by config."""

    force: bool = False
    reason: str = "the consumer is closing"


@dataclass(frozen=True)
class Commit:
    """Commit ``offsets`` (the next offset to read per partition) with ``metadata``.

    ``leader_epochs``: per partition, the leader epoch of the last record consumed
    (KIP-320), sent as ``committed_leader_epoch`` (OffsetCommit v6+); -1 or absent:
    unknown.

    ``generation``: the generation the caller owns the partitions in, as the last
    PartitionsAssigned it handled says (classic protocol). When the member has moved to
    another one meanwhile (its session expired and it joined again while the caller was
    held), the commit is refused (ILLEGAL_GENERATION) without being sent: it was made
    from the caller's books of the old generation, and the new one would carry it past
    the coordinator's fence. With the consumer protocol (KIP-848) it is the member epoch
    of that PartitionsAssigned; the epoch moves on within a membership, so only a commit
    made before the member's current membership began is refused (FENCED_MEMBER_EPOCH).
    None: not checked."""

    offsets: Mapping[Partition, int]
    metadata: str | None = None
    leader_epochs: Mapping[Partition, int] = field(default_factory=dict)
    generation: int | None = None

    def __post_init__(self) -> None:
        offsets = MappingProxyType(dict(self.offsets))
        for partition, offset in offsets.items():
            if offset < 0:
                raise ValueError(f"offset {offset} for {partition} is negative")
        object.__setattr__(self, "offsets", offsets)
        epochs = MappingProxyType(dict(self.leader_epochs))
        if not epochs.keys() <= offsets.keys():
            raise ValueError(
                f"leader epochs for partitions not committed: {set(epochs) - set(offsets)}"
            )
        object.__setattr__(self, "leader_epochs", epochs)

    def __deepcopy__(self, memo: dict[int, object]) -> Commit:
        return self  # immutable (a read-only mapping, which cannot be pickled)


@dataclass(frozen=True)
class FetchCommitted:
    """Read the group's committed offsets for ``partitions``."""

    partitions: frozenset[Partition]

    def __post_init__(self) -> None:
        object.__setattr__(self, "partitions", frozenset(self.partitions))


@dataclass(frozen=True)
class RevocationDone:
    """The driver finished with the partitions of one PartitionsRevoked event."""


@dataclass(frozen=True)
class Tick:
    """Time passed (``now`` goes with every input); sends due heartbeats, detects expiry."""


# -- inputs: driver reports ----------------------------------------------------------


@dataclass(frozen=True)
class MetadataUpdate:
    """Partition counts per topic; 0 means the topic does not exist."""

    partitions_per_topic: Mapping[str, int]

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "partitions_per_topic", MappingProxyType(dict(self.partitions_per_topic))
        )

    def __deepcopy__(self, memo: dict[int, object]) -> MetadataUpdate:
        return self  # immutable


@dataclass(frozen=True)
class CoordinatorFound:
    """The group coordinator, connected, with the API versions to use with it."""

    node_id: int
    host: str
    port: int
    versions: CoordinatorVersions = field(default_factory=CoordinatorVersions)


@dataclass(frozen=True)
class CoordinatorLookupFailed:
    """FindCoordinator failed: ``error_code`` from the broker, or None for a transport error."""

    error_code: int | None
    message: str = ""


@dataclass(frozen=True)
class CoordinatorLost:
    """The connection to the coordinator is gone; every request in flight on it failed."""

    reason: str = ""


@dataclass(frozen=True)
class RequestFailed:
    """One request of this API got no response (timeout or disconnect)."""

    api_key: int
    reason: str = ""


Input = (
    Subscribe
    | Leave
    | Commit
    | FetchCommitted
    | RevocationDone
    | Tick
    | MetadataUpdate
    | CoordinatorFound
    | CoordinatorLookupFailed
    | CoordinatorLost
    | RequestFailed
    | JoinGroupResponse
    | SyncGroupResponse
    | HeartbeatResponse
    | LeaveGroupResponse
    | OffsetCommitResponse
    | OffsetFetchResponse
)

INPUT_TYPES: tuple[type, ...] = (
    Subscribe,
    Leave,
    Commit,
    FetchCommitted,
    RevocationDone,
    Tick,
    MetadataUpdate,
    CoordinatorFound,
    CoordinatorLookupFailed,
    CoordinatorLost,
    RequestFailed,
    JoinGroupResponse,
    SyncGroupResponse,
    HeartbeatResponse,
    LeaveGroupResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
)

# -- outputs: instructions for the driver ---------------------------------------------


@dataclass(frozen=True)
class SendRequest:
    """Send ``request`` at ``version`` to the group coordinator; feed back its response.

    Responses (or RequestFailed) of one API must come back in the order sent.
    """

    request: Request
    version: int


@dataclass(frozen=True)
class FindCoordinator:
    """Look up (again) the group coordinator; answer CoordinatorFound or CoordinatorLookupFailed."""

    reason: str


@dataclass(frozen=True)
class NeedMetadata:
    """The leader needs partition counts for these topics (answer with MetadataUpdate)."""

    topics: frozenset[str]


# -- outputs: events ------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionsAssigned:
    """A rebalance completed. ``added`` are new to this member; ``assignment`` is all it owns."""

    added: frozenset[Partition]
    assignment: frozenset[Partition]
    generation_id: int
    member_id: str


@dataclass(frozen=True)
class PartitionsRevoked:
    """Stop these partitions (commit first if needed), then send RevocationDone.

    The partitions stay committable until RevocationDone.
    """

    partitions: frozenset[Partition]


@dataclass(frozen=True)
class PartitionsLost:
    """These partitions may already belong to another member: stop at once, commit nothing."""

    partitions: frozenset[Partition]
    reason: str


@dataclass(frozen=True)
class Fenced:
    """Terminal: another instance with our group.instance.id took over."""

    reason: str


@dataclass(frozen=True)
class Fatal:
    """Terminal: the member cannot continue.

    ``error_code`` is the coordinator's error code, or None when the group protocol
    itself was broken: then ``error_name`` says by which side, ``REMOTE_PROTOCOL_ERROR``
    (the coordinator's answer or another member's bytes) or ``LOCAL_PROTOCOL_ERROR``
    (this process's own assignor), and ``exception()`` is of the matching class.
    """

    error_code: int | None
    error_name: str
    message: str

    @classmethod
    def protocol_broken(cls, error: GroupProtocolError) -> Fatal:
        return cls(None, error.error_name, str(error))

    def exception(self) -> GroupError:
        """The error to raise for this event."""
        if self.error_code is None:
            for kind in (RemoteProtocolError, LocalProtocolError):
                if self.error_name == kind.error_name:
                    return kind(self.message)
        return GroupError(f"{self.error_name}: {self.message}")


@dataclass(frozen=True)
class Left:
    """The member left the group (``error_name`` is the LeaveGroup error, if any)."""

    error_name: str | None = None


@dataclass(frozen=True)
class OffsetsCommitted:
    offsets: Mapping[Partition, int]
    metadata: str | None


@dataclass(frozen=True)
class CommitFailed:
    """A commit failed. ``retriable``: the same commit may be sent again as it is.

    Non-retriable failures (the generation moved on, the member was fenced, a
    rebalance is in progress) must not be resent blindly: commit again only
    for partitions still owned after the next PartitionsAssigned.
    ``error_code`` is None when the machine refused the commit itself.
    """

    offsets: Mapping[Partition, int]
    metadata: str | None
    error_code: int | None
    error_name: str
    retriable: bool
    message: str


@dataclass(frozen=True)
class CommittedOffset:
    offset: int
    metadata: str | None
    leader_epoch: int = -1


@dataclass(frozen=True)
class OffsetsFetched:
    """Committed offsets; None for a partition with no committed offset."""

    offsets: Mapping[Partition, CommittedOffset | None]


@dataclass(frozen=True)
class OffsetFetchFailed:
    partitions: frozenset[Partition]
    error_code: int | None
    error_name: str
    retriable: bool
    message: str


Output = (
    SendRequest
    | FindCoordinator
    | NeedMetadata
    | PartitionsAssigned
    | PartitionsRevoked
    | PartitionsLost
    | Fenced
    | Fatal
    | Left
    | OffsetsCommitted
    | CommitFailed
    | OffsetsFetched
    | OffsetFetchFailed
)

OUTPUT_TYPES: tuple[type, ...] = (
    SendRequest,
    FindCoordinator,
    NeedMetadata,
    PartitionsAssigned,
    PartitionsRevoked,
    PartitionsLost,
    Fenced,
    Fatal,
    Left,
    OffsetsCommitted,
    CommitFailed,
    OffsetsFetched,
    OffsetFetchFailed,
)
