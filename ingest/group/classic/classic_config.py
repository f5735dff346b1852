"""The classic protocol's group membership settings (``GroupConfig``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ingest.errors import ConfigError
from ingest.group.assignors import Assignor, CooperativeStickyAssignor
from ingest.group.types import RebalanceProtocol

__all__ = ["GroupConfig"]


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
