"""GroupConfig validation, the rebalance protocol it implies, and version negotiation."""

from __future__ import annotations

import pytest

from ingest.errors import ConfigError, UnsupportedVersionError
from ingest.group import (
    CooperativeStickyAssignor,
    CoordinatorVersions,
    GroupConfig,
    RangeAssignor,
    RebalanceProtocol,
    RoundRobinAssignor,
)
from ingest.protocol.messages import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"group_id": ""}, "group_id"),
        ({"group_id": "g", "group_instance_id": ""}, "group_instance_id"),
        ({"group_id": "g", "session_timeout_ms": 0}, "session_timeout_ms"),
        ({"group_id": "g", "heartbeat_interval_ms": 45_000}, "heartbeat_interval_ms"),
        ({"group_id": "g", "retry_backoff_ms": -1}, "retry_backoff_ms"),
        ({"group_id": "g", "assignors": ()}, "assignors"),
        ({"group_id": "g", "assignors": (RangeAssignor(), RangeAssignor())}, "assignors"),
    ],
)
def test_bad_settings_name_their_key(settings: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        GroupConfig(**settings)  # type: ignore[arg-type]
    assert raised.value.key == key


def test_protocol_is_cooperative_only_if_every_assignor_is() -> None:
    assert GroupConfig(group_id="g").rebalance_protocol is RebalanceProtocol.COOPERATIVE
    mixed = GroupConfig(group_id="g", assignors=(CooperativeStickyAssignor(), RoundRobinAssignor()))
    assert mixed.rebalance_protocol is RebalanceProtocol.EAGER


def test_static_members_keep_their_membership_on_close_by_default() -> None:
    assert GroupConfig(group_id="g").sends_leave_group
    assert not GroupConfig(group_id="g", group_instance_id="h").sends_leave_group
    assert GroupConfig(group_id="g", group_instance_id="h", leave_on_close=True).sends_leave_group


def test_versions_negotiate_to_the_highest_common_version() -> None:
    broker = {
        JoinGroupRequest.api_key: (0, 6),
        SyncGroupRequest.api_key: (0, 9),
        HeartbeatRequest.api_key: (0, 4),
        LeaveGroupRequest.api_key: (0, 2),
        OffsetCommitRequest.api_key: (0, 9),
        OffsetFetchRequest.api_key: (0, 9),
    }
    assert CoordinatorVersions.negotiate(broker) == CoordinatorVersions(
        join_group=6,
        sync_group=5,
        heartbeat=4,
        leave_group=2,
        offset_commit=9,
        offset_fetch=8,
        consumer_group_heartbeat=None,  # not offered: only the consumer protocol needs it
    )
    offered = CoordinatorVersions.negotiate({**broker, 68: (0, 2)})
    assert offered.consumer_group_heartbeat == 1
    with pytest.raises(UnsupportedVersionError, match="lacks JoinGroup"):
        CoordinatorVersions.negotiate(
            {k: v for k, v in broker.items() if k != JoinGroupRequest.api_key}
        )
    with pytest.raises(UnsupportedVersionError, match="JoinGroup: we do 2-9, the coordinator 0-1"):
        CoordinatorVersions.negotiate({**broker, JoinGroupRequest.api_key: (0, 1)})
