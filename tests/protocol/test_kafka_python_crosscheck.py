"""Our request frames equal kafka-python 3.0.12's for the same request.

kafka-python builds its messages from its own copy of Kafka's JSON definitions,
so this is an independent encoder. Each of our sample requests is mirrored into
kafka-python's classes field by field and both frames (size prefix, header and
body) must be byte-identical.
"""

from __future__ import annotations

from typing import Any

import pytest

from ingest.protocol import codec
from ingest.protocol.messages import REQUEST_TYPES
from ingest.protocol.schema import ArrayOf, Kind, Request, Struct, struct_fields
from tests.protocol.protocol_samples import sample

kafka = pytest.importorskip("kafka")

from kafka.protocol.admin.groups import DescribeGroupsRequest, ListGroupsRequest  # noqa: E402
from kafka.protocol.consumer.fetch import FetchRequest  # noqa: E402
from kafka.protocol.consumer.group import (  # noqa: E402
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from kafka.protocol.consumer.offsets import ListOffsetsRequest  # noqa: E402
from kafka.protocol.metadata.api_versions import ApiVersionsRequest  # noqa: E402
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest  # noqa: E402
from kafka.protocol.metadata.metadata import MetadataRequest  # noqa: E402
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest  # noqa: E402

KAFKA_PYTHON: dict[str, Any] = {
    cls.__name__: cls
    for cls in (
        ApiVersionsRequest,
        MetadataRequest,
        FindCoordinatorRequest,
        JoinGroupRequest,
        SyncGroupRequest,
        HeartbeatRequest,
        LeaveGroupRequest,
        OffsetFetchRequest,
        OffsetCommitRequest,
        ListOffsetsRequest,
        FetchRequest,
        SaslHandshakeRequest,
        SaslAuthenticateRequest,
        DescribeGroupsRequest,
        ListGroupsRequest,
    )
}
SEEDS = range(3)


def _pairs() -> tuple[list[tuple[type[Request], int]], list[str]]:
    covered, missing = [], []
    for cls in REQUEST_TYPES:
        theirs = KAFKA_PYTHON.get(cls.__name__)
        for version in range(cls.version_range().low, cls.version_range().high + 1):
            if theirs is not None and theirs.min_version <= version <= theirs.max_version:
                covered.append((cls, version))
            else:
                missing.append(f"{cls.__name__} v{version}")
    return covered, missing


COVERED, MISSING = _pairs()


def _mirror(obj: Struct, their_cls: Any, version: int) -> Any:
    """``obj`` as an instance of kafka-python's class for the same struct."""
    values: dict[str, Any] = {}
    for name, spec in struct_fields(type(obj)):
        if version not in spec.versions:
            continue
        value = getattr(obj, name)
        if spec.tag is not None and version in spec.tagged and value == spec.default:
            continue  # both sides omit default tagged fields; kafka-python writes what is set
        kind = spec.kind
        if isinstance(kind, ArrayOf):
            element = kind.element
            if value is not None:
                if isinstance(element, Kind):
                    value = list(value)
                else:
                    nested = getattr(their_cls, element.__name__)
                    value = [_mirror(item, nested, version) for item in value]
        elif not isinstance(kind, Kind):
            value = _mirror(value, getattr(their_cls, kind.__name__), version)
        elif isinstance(value, memoryview):
            value = bytes(value)
        values[name] = value
    return their_cls(version=version, **values)


def test_coverage_report() -> None:
    supported = sum(high - low + 1 for low, high in codec.SUPPORTED_VERSIONS.values())
    assert len(COVERED) + len(MISSING) == supported
    print(f"kafka-python cross-check covers {len(COVERED)} of {supported} (request, version) pairs")
    if MISSING:
        pytest.skip("kafka-python lacks: " + ", ".join(MISSING))


ALL_PAIRS = COVERED + [(None, name) for name in MISSING]


@pytest.mark.parametrize(
    ("cls", "version"),
    ALL_PAIRS,
    ids=[f"{c.__name__}-v{v}" if c else str(v) for c, v in ALL_PAIRS],
)
def test_same_bytes_as_kafka_python(cls: type[Request] | None, version: Any) -> None:
    if cls is None:
        pytest.skip(f"kafka-python lacks {version}")
    for seed in SEEDS:
        request = sample(cls, version, seed, unknown_tags=False)
        theirs = _mirror(request, KAFKA_PYTHON[cls.__name__], version)
        theirs.with_header(correlation_id=1000 + seed, client_id="ingest-xcheck")
        expected = bytes(theirs.encode(header=True, framed=True))
        ours = codec.encode_request(
            request, version=version, correlation_id=1000 + seed, client_id="ingest-xcheck"
        )
        assert ours.hex() == expected.hex(), f"seed {seed}: {request}"
