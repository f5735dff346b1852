"""The API versions a member uses with its coordinator, negotiated from ApiVersions.

Shared by both protocols: ``CoordinatorFound`` carries them to either machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ingest.errors import UnsupportedVersionError
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

__all__ = ["CoordinatorVersions"]


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
