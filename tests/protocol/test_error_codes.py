"""The error-code table and raise_for_error."""

from __future__ import annotations

import pytest

from ingest.errors import BrokerError
from ingest.protocol.error_codes import ErrorCode, error_for, raise_for_error


def test_table_is_complete_and_consistent() -> None:
    codes = [member.value for member in ErrorCode]
    assert codes == sorted(codes)
    assert set(range(-1, 129)) <= set(codes)  # Kafka's codes are contiguous from -1
    for member in ErrorCode:
        info = error_for(member.value)
        assert (info.code, info.name, info.retriable) == (
            member.value,
            member.name,
            member.retriable,
        )
        assert member.description


@pytest.mark.parametrize(
    ("code", "name", "retriable"),
    [
        (0, "NONE", False),
        (-1, "UNKNOWN_SERVER_ERROR", False),
        (1, "OFFSET_OUT_OF_RANGE", False),
        (3, "UNKNOWN_TOPIC_OR_PARTITION", True),
        (6, "NOT_LEADER_OR_FOLLOWER", True),
        (7, "REQUEST_TIMED_OUT", True),
        (14, "COORDINATOR_LOAD_IN_PROGRESS", True),
        (15, "COORDINATOR_NOT_AVAILABLE", True),
        (16, "NOT_COORDINATOR", True),
        (22, "ILLEGAL_GENERATION", False),
        (25, "UNKNOWN_MEMBER_ID", False),
        (27, "REBALANCE_IN_PROGRESS", False),
        (35, "UNSUPPORTED_VERSION", False),
        (70, "FETCH_SESSION_ID_NOT_FOUND", True),
        (71, "INVALID_FETCH_SESSION_EPOCH", True),
        (74, "FENCED_LEADER_EPOCH", True),
        (79, "MEMBER_ID_REQUIRED", False),
        (82, "FENCED_INSTANCE_ID", False),
        (88, "UNSTABLE_OFFSET_COMMIT", True),
        (100, "UNKNOWN_TOPIC_ID", True),
    ],
)
def test_rows_consumers_rely_on(code: int, name: str, retriable: bool) -> None:
    info = error_for(code)
    assert (info.name, info.retriable) == (name, retriable)
    assert ErrorCode[name] == code


def test_raise_for_error() -> None:
    raise_for_error(0, context="Fetch t-0")  # no error, no exception
    with pytest.raises(BrokerError) as excinfo:
        raise_for_error(16, context="OffsetCommit group g")
    error = excinfo.value
    assert (error.code, error.name, error.retriable, error.context) == (
        16, "NOT_COORDINATOR", True, "OffsetCommit group g",
    )  # fmt: skip
    assert str(error).startswith("OffsetCommit group g: NOT_COORDINATOR (16)")
    with pytest.raises(BrokerError, match="broker says no"):
        raise_for_error(29, context="Metadata", message="broker says no")


def test_unknown_codes_are_clear_and_not_retriable() -> None:
    info = error_for(4242)
    assert info.name == "UNKNOWN_ERROR_CODE_4242"
    assert not info.retriable
    with pytest.raises(BrokerError) as excinfo:
        raise_for_error(4242, context="Fetch t-0")
    assert excinfo.value.retriable is False
    assert "4242" in str(excinfo.value)
