"""Group membership settings and the API versions used with the coordinator."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ingest.errors import ConfigError, UnsupportedVersionError
from ingest.group.assignors import Assignor, CooperativeStickyAssignor
from ingest.group.types import RebalanceProtocol
from ingest.protocol.codec import API_NAMES, SUPPORTED_VERSIONS
from ingest.protocol.messages import (
    ConsumerGroupHeartbeatRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from ingest.protocol.schema import Request

__all__ = ["CoordinatorVersions", "GroupConfig"]


def _highest(request: type[Request]) -> int:
    return SUPPORTED_VERSIONS[request.api_key][1]


@dataclass(frozen=True, kw_only=True)
class CoordinatorVersions:
    """The version of each group API to use with the current coordinator.

    The driver negotiates them (``negotiate``) from the coordinator's ApiVersions
    answer; the defaults are the highest versions our codec implements.
    ``consumer_group_heartbeat`` (KIP-848, the consumer protocol's one group API) is
    None when the coordinator does not offer it: only ``ConsumerMachine`` needs it.
    """

    join_group: int = _highest(JoinGroupRequest)
    sync_group: int = _highest(SyncGroupRequest)
    heartbeat: int = _highest(HeartbeatRequest)
    leave_group: int = _highest(LeaveGroupRequest)
    offset_commit: int = _highest(OffsetCommitRequest)
    offset_fetch: int = _highest(OffsetFetchRequest)
    consumer_group_heartbeat: int | None = _highest(ConsumerGroupHeartbeatRequest)

    @classmethod
    def negotiate(cls, broker: Mapping[int, tuple[int, int]]) -> CoordinatorVersions:
        """Highest common version per API; ``broker`` maps api key -> (min, max)."""

        def pick(request: type[Request]) -> int:
            api_key = request.api_key
            ours = SUPPORTED_VERSIONS[api_key]
            theirs = broker.get(api_key)
            if theirs is None:
                raise UnsupportedVersionError(f"the coordinator lacks {API_NAMES[api_key]}")
            low, high = max(ours[0], theirs[0]), min(ours[1], theirs[1])
            if low > high:
                raise UnsupportedVersionError(
                    f"{API_NAMES[api_key]}: we do {ours[0]}-{ours[1]}, "
                    f"the coordinator {theirs[0]}-{theirs[1]}"
                )
            return high

        heartbeat_key = ConsumerGroupHeartbeatRequest.api_key
        return cls(
            consumer_group_heartbeat=(
                pick(ConsumerGroupHeartbeatRequest) if heartbeat_key in broker else None
            ),
            join_group=pick(JoinGroupRequest),
            sync_group=pick(SyncGroupRequest),
            heartbeat=pick(HeartbeatRequest),
            leave_group=pick(LeaveGroupRequest),
            offset_commit=pick(OffsetCommitRequest),
            offset_fetch=pick(OffsetFetchRequest),
        )


@dataclass(frozen=True, kw_only=True)
class GroupConfig:
    """Consumer-group settings (Kafka's names in the comments).

    ``assignors`` are advertised in order of preference; the rebalance protocol
    is cooperative only when every assignor supports it (as in Kafka).
    ``leave_on_close`` None means: dynamic members send LeaveGroup when they
    leave, static members (with ``group_instance_id``) do not, so that a
    restart within the session timeout causes no rebalance.
    """

    group_id: str
    group_instance_id: str | None = None  # group.instance.id
    session_timeout_ms: int = 45_000  # session.timeout.ms
    rebalance_timeout_ms: int = 300_000  # max.poll.interval.ms
    heartbeat_interval_ms: int = 3_000  # heartbeat.interval.ms
    retry_backoff_ms: int = 100  # retry.backoff.ms
    assignors: tuple[Assignor, ...] = field(default_factory=lambda: (CooperativeStickyAssignor(),))
    leave_on_close: bool | None = None
    # How often the leader looks again at its topics' partition counts while stable, so
    # that partitions added to a topic are assigned (metadata.max.age.ms).
    metadata_refresh_ms: int = 300_000

    def __post_init__(self) -> None:
        if not self.group_id:
            raise ConfigError("must not be empty", key="group_id")
        if self.group_instance_id == "":
            raise ConfigError(
                "must not be empty (use None for a dynamic member)", key="group_instance_id"
            )
        for key in (
            "session_timeout_ms",
            "rebalance_timeout_ms",
            "heartbeat_interval_ms",
            "metadata_refresh_ms",
        ):
            if getattr(self, key) <= 0:
                raise ConfigError("must be positive", key=key)
        if self.retry_backoff_ms < 0:
            raise ConfigError("must not be negative", key="retry_backoff_ms")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ConfigError(
                f"must be lower than session_timeout_ms ({self.session_timeout_ms})",
                key="heartbeat_interval_ms",
            )
        if not self.assignors:
            raise ConfigError("needs at least one assignor", key="assignors")
        names = [a.name for a in self.assignors]
        if len(set(names)) != len(names):
            raise ConfigError(f"names must be unique, got {names}", key="assignors")

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    @property
    def sends_leave_group(self) -> bool:
        return self.leave_on_close if self.leave_on_close is not None else not self.is_static

    @property
    def rebalance_protocol(self) -> RebalanceProtocol:
        if all(RebalanceProtocol.COOPERATIVE in a.supported_protocols for a in self.assignors):
            return RebalanceProtocol.COOPERATIVE
        return RebalanceProtocol.EAGER

    def assignor(self, name: str) -> Assignor | None:
        return next((a for a in self.assignors if a.name == name), None)
