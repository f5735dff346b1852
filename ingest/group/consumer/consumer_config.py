"""Settings of a member of a KIP-848 (consumer protocol) group.

The coordinator assigns, so there are no client assignors: ``server_assignor`` names
the coordinator's (``uniform`` or ``range``), or None for the group's default.
The session timeout is the coordinator's too (``group.consumer.session.timeout.ms``,
45 s by default); ``session_timeout_ms`` here is only how long the member goes on
owning its partitions without a heartbeat answer before it counts them lost, so it
should not exceed the coordinator's. It is never shorter than two of the coordinator's
heartbeat intervals (``group.consumer.heartbeat.interval.ms``, 5 s by default), which the
coordinator sets: a shorter one would expire between two answered heartbeats.
"""

from __future__ import annotations

from dataclasses import dataclass

from ingest.errors import ConfigError

__all__ = ["SERVER_ASSIGNORS", "ConsumerGroupConfig"]

#: The coordinator's assignors in Apache Kafka (``group.consumer.assignors``).
SERVER_ASSIGNORS = ("uniform", "range")


@dataclass(frozen=True, kw_only=True)
class ConsumerGroupConfig:
    """Consumer-protocol group settings (Kafka's names in the comments).

    ``leave_on_close``: a Leave sends the leaving heartbeat (epoch -1, or -2 for a
    static member, which keeps its assignment for a restart within the session);
    False ends the session without leaving (the coordinator expires it).
    """

    group_id: str
    group_instance_id: str | None = None  # group.instance.id
    rack_id: str | None = None  # client.rack
    server_assignor: str | None = None  # group.remote.assignor
    rebalance_timeout_ms: int = 300_000  # max.poll.interval.ms
    session_timeout_ms: int = 45_000  # the coordinator's group.consumer.session.timeout.ms
    heartbeat_interval_ms: int = 5_000  # until the coordinator gives its own
    retry_backoff_ms: int = 100  # retry.backoff.ms
    leave_on_close: bool = True

    def __post_init__(self) -> None:
        if not self.group_id:
            raise ConfigError("must not be empty", key="group_id")
        for key in ("group_instance_id", "rack_id"):
            if getattr(self, key) == "":
                raise ConfigError("must not be empty (use None to leave it out)", key=key)
        if self.server_assignor is not None and self.server_assignor not in SERVER_ASSIGNORS:
            raise ConfigError(
                f"{self.server_assignor!r} is not one of {', '.join(SERVER_ASSIGNORS)} "
                "(or None for the group's default)",
                key="server_assignor",
            )
        for key in ("rebalance_timeout_ms", "session_timeout_ms", "heartbeat_interval_ms"):
            if getattr(self, key) <= 0:
                raise ConfigError("must be positive", key=key)
        if self.retry_backoff_ms < 0:
            raise ConfigError("must not be negative", key="retry_backoff_ms")

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None
