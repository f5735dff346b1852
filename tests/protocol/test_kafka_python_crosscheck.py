"""Our request frames equal kafka-python 3.0.12's for the same request (issue 16, item 7).

kafka-python builds its messages from its own copy of Kafka's JSON definitions,
so this is an independent encoder. For every request we send and every version
we speak of it, Hypothesis draws the field values from our schema; the request
is mirrored into kafka-python's class field by field and both frames (size
prefix, header and body) must be byte-identical.

``KAFKA_PYTHON_TABLE`` says, for each request, which of our versions kafka-python
has; a test checks it against the request classes kafka-python really ships, so
every (request, version) we speak is either cross-checked here or listed with the
reason it is not.

Outside this check: unknown tagged fields (kafka-python keeps them on decode but
never encodes them; the round-trip tests cover them).
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.protocol import codec
from ingest.protocol.messages import REQUEST_TYPES
from ingest.protocol.schema import (
    ArrayOf,
    FieldKind,
    Kind,
    Request,
    Struct,
    VersionRange,
    struct_fields,
)

with warnings.catch_warnings():
    # kafka-python loads its JSON schemas with importlib.resources.read_text (deprecated).
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka.protocol
    from kafka.protocol.api_message import ApiMessage

# ~4,500 frames in all: the module runs in a few seconds. No deadline: a loaded
# machine must not turn a slow example into a failure.
CROSSCHECK = settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)


class Row(NamedTuple):
    """What kafka-python offers for one of our requests (by our class name)."""

    # The versions kafka-python's JSON schema declares valid; "none": it has no class.
    kafka_python: str
    # Why kafka-python lacks any version we speak outside that range ("" if it lacks none).
    absent_because: str = ""
    # Versions kafka-python has but encodes wrongly, with the reason: not cross-checked
    # (our golden vectors must cover them instead). None known.
    kafka_python_bugs: tuple[tuple[int, str], ...] = ()


_NO_KIP_848 = (
    "kafka-python 3.0.12 has no {} schema or request class (only an ApiKey entry): "
    "its consumer speaks the classic group protocol, not KIP-848's"
)

KAFKA_PYTHON_TABLE: dict[str, Row] = {
    "ApiVersionsRequest": Row("0-4"),
    "MetadataRequest": Row("0-13"),
    "FetchRequest": Row("4-18"),
    "ListOffsetsRequest": Row("1-11"),
    "FindCoordinatorRequest": Row("0-6"),
    "JoinGroupRequest": Row("0-9"),
    "SyncGroupRequest": Row("0-5"),
    "HeartbeatRequest": Row("0-4"),
    "LeaveGroupRequest": Row("0-5"),
    "DescribeGroupsRequest": Row("0-6"),
    "ListGroupsRequest": Row("0-5"),
    "OffsetFetchRequest": Row("1-10"),
    "OffsetCommitRequest": Row("2-10"),
    "SaslHandshakeRequest": Row("0-1"),
    "SaslAuthenticateRequest": Row("0-2"),
    "OffsetForLeaderEpochRequest": Row("2-4"),
    "ConsumerGroupHeartbeatRequest": Row("none", _NO_KIP_848.format("ConsumerGroupHeartbeat")),
    "ConsumerGroupDescribeRequest": Row("none", _NO_KIP_848.format("ConsumerGroupDescribe")),
}


def _kafka_python_requests() -> dict[str, type[ApiMessage]]:
    """Class name -> kafka-python's request class, found by walking ``kafka.protocol``
    (its legacy ``kafka.protocol.old`` classes excepted)."""
    found: dict[str, type[ApiMessage]] = {}
    for module_info in pkgutil.walk_packages(kafka.protocol.__path__, "kafka.protocol."):
        if module_info.name.startswith("kafka.protocol.old") or module_info.name.endswith(
            "generate_stubs"
        ):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # as above
            module = importlib.import_module(module_info.name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, ApiMessage)
                and value.__dict__.get("_json") is not None
                and value.is_request()
            ):
                assert found.setdefault(value.__name__, value) is value, f"two {value.__name__}"
    return found


KAFKA_PYTHON = _kafka_python_requests()
KAFKA_PYTHON_KEYS = {their_cls.API_KEY for their_cls in KAFKA_PYTHON.values()}


def _versions(versions: VersionRange) -> range:
    return range(versions.low, versions.high + 1)


def _theirs(name: str) -> VersionRange:
    """The versions kafka-python has of request ``name`` (an empty range if none)."""
    their_cls = KAFKA_PYTHON.get(name)
    if their_cls is None:
        return VersionRange(1, 0)
    low, high = their_cls.valid_versions
    return VersionRange(low, high)


def _crosschecked() -> list[tuple[type[Request], int]]:
    """Every (request, version) we speak that kafka-python has, its known bugs excepted.
    Derived from kafka-python itself, not from the table, so nothing it has goes unchecked."""
    pairs = []
    for cls in REQUEST_TYPES:
        row = KAFKA_PYTHON_TABLE.get(cls.__name__, Row("?"))
        bugs = {version for version, _ in row.kafka_python_bugs}
        for version in _versions(cls.version_range()):
            if version in _theirs(cls.__name__) and version not in bugs:
                pairs.append((cls, version))
    return pairs


CROSSCHECKED = _crosschecked()


def test_table_matches_what_kafka_python_offers() -> None:
    # Rows for requests we do not send are allowed (what they say of kafka-python
    # is still checked); every request we send needs one.
    for name, row in KAFKA_PYTHON_TABLE.items():
        assert row.kafka_python == str(_theirs(name)), f"{name}: kafka-python has {_theirs(name)}"
        for version, reason in row.kafka_python_bugs:
            assert version in _theirs(name) and reason.strip(), (name, version)
    for cls in REQUEST_TYPES:
        name = cls.__name__
        assert name in KAFKA_PYTHON_TABLE, f"{name} needs a row in KAFKA_PYTHON_TABLE"
        row = KAFKA_PYTHON_TABLE[name]
        if name in KAFKA_PYTHON:
            assert cls.api_key == KAFKA_PYTHON[name].API_KEY, name
        else:  # not under another name either
            assert cls.api_key not in KAFKA_PYTHON_KEYS, name
        lacking = [v for v in _versions(cls.version_range()) if v not in _theirs(name)]
        assert bool(row.absent_because.strip()) == bool(lacking), (
            f"{name}: kafka-python lacks versions {lacking}; the row must say why, and only then"
        )


def test_every_version_we_speak_is_crosschecked_or_listed() -> None:
    spoken = {
        (api_key, version)
        for api_key, (low, high) in codec.SUPPORTED_VERSIONS.items()
        for version in range(low, high + 1)
    }
    listed = [(cls.api_key, v) for cls, v in CROSSCHECKED]
    absent = []
    for cls in REQUEST_TYPES:
        row = KAFKA_PYTHON_TABLE.get(cls.__name__, Row("?"))
        for version in _versions(cls.version_range()):
            if version not in _theirs(cls.__name__) and row.absent_because.strip():
                absent.append(f"{cls.__name__} v{version}")
                listed.append((cls.api_key, version))
        listed += [(cls.api_key, v) for v, reason in row.kafka_python_bugs if reason.strip()]
    assert sorted(listed) == sorted(spoken)  # each pair exactly once
    print(
        f"kafka-python cross-check: {len(CROSSCHECKED)} of {len(spoken)} (request, version) "
        f"pairs; absent in kafka-python: {', '.join(absent) or 'none'}"
    )


# -- strategies drawn from our schema ----------------------------------------------

_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
}
_CHARS = st.characters(codec="utf-8")  # any encodable code point, non-ASCII included
_SHORT_TEXT = st.text(_CHARS, max_size=12)
_SHORT_BINARY = st.binary(max_size=24)


def _sometimes(
    usual: st.SearchStrategy[Any], rare: st.SearchStrategy[Any]
) -> st.SearchStrategy[Any]:
    """``usual``, and ``rare`` about one time in four (shrinking towards ``usual``)."""
    return st.integers(0, 3).flatmap(lambda n: rare if n == 3 else usual)


# Now and then, a length whose compact form (n + 1) crosses the one-byte varint limit.
_TEXT = _sometimes(_SHORT_TEXT, st.text(_CHARS, min_size=120, max_size=130))
_BINARY = _sometimes(_SHORT_BINARY, st.binary(min_size=125, max_size=129))


def _primitive(kind: Kind, short: bool = False) -> st.SearchStrategy[Any]:
    if kind.name in _INT_RANGES:
        low, high = _INT_RANGES[kind.name]
        return st.integers(low, high)
    if kind.name == "bool":
        return st.booleans()
    if kind.name == "float64":
        return st.floats()
    if kind.name == "uuid":
        return st.uuids(allow_nil=True)
    if kind.name == "string":
        return _SHORT_TEXT if short else _TEXT
    if kind.name in ("bytes", "records"):
        return _SHORT_BINARY if short else _BINARY
    raise AssertionError(f"no strategy for {kind}")


def _kind(kind: FieldKind, version: int, flexible: bool) -> st.SearchStrategy[Any]:
    if isinstance(kind, Kind):
        return _primitive(kind)
    if isinstance(kind, ArrayOf):
        element = kind.element
        if isinstance(element, Kind):
            # 0-3 items, and now and then 126-128 (the array length's varint limit).
            many = st.lists(_primitive(element, short=True), min_size=126, max_size=128)
            return _sometimes(st.lists(_primitive(element), max_size=3), many).map(tuple)
        return st.lists(_struct(element, version, flexible), max_size=3).map(tuple)
    return _struct(kind, version, flexible)


_STRUCTS: dict[tuple[type[Struct], int, bool], st.SearchStrategy[Any]] = {}


def _struct(cls: type[Struct], version: int, flexible: bool) -> st.SearchStrategy[Any]:
    key = (cls, version, flexible)
    if key not in _STRUCTS:
        _STRUCTS[key] = _struct_uncached(cls, version, flexible)
    return _STRUCTS[key]


def _struct_uncached(cls: type[Struct], version: int, flexible: bool) -> st.SearchStrategy[Any]:
    """Every field the version carries drawn over its whole range (None too where the
    version allows null, tagged fields default or not), and the ignorable fields the
    version lacks drawn as well: the encoder must drop them, so the frame stays
    kafka-python's, which never sees them."""
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for name, spec in struct_fields(cls):
        if version in spec.versions:
            strategy = _kind(spec.kind, version, flexible)
            if version in spec.nullable:
                strategy = st.none() | strategy
            fields[name] = strategy
        elif spec.ignorable and not isinstance(spec.kind, type):
            fields[name] = st.just(spec.default) | _kind(spec.kind, version, flexible)
    return st.fixed_dictionaries(fields).map(lambda values: cls(**values))


def _request(cls: type[Request], version: int) -> st.SearchStrategy[Any]:
    return _struct(cls, version, cls.is_flexible(version))


# -- mirroring into kafka-python -------------------------------------------------------


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
        if value is None:
            pass  # a null string, bytes, array or struct stays null
        elif isinstance(kind, ArrayOf):
            element = kind.element
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


def _first_difference(ours: bytes, theirs: bytes) -> int:
    return next(
        (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
        min(len(ours), len(theirs)),
    )


@pytest.mark.parametrize(
    ("cls", "version"), CROSSCHECKED, ids=[f"{c.__name__}-v{v}" for c, v in CROSSCHECKED]
)
@CROSSCHECK
@given(data=st.data())
def test_same_frame_as_kafka_python(cls: type[Request], version: int, data: st.DataObject) -> None:
    request = data.draw(_request(cls, version), label="request")
    correlation_id = data.draw(st.integers(-(2**31), 2**31 - 1), label="correlation_id")
    client_id = data.draw(st.none() | _TEXT, label="client_id")

    theirs = _mirror(request, KAFKA_PYTHON[cls.__name__], version)
    theirs.with_header(correlation_id=correlation_id, client_id=client_id)
    expected = bytes(theirs.encode(header=True, framed=True))
    ours = bytes(
        codec.encode_request(
            request, version=version, correlation_id=correlation_id, client_id=client_id
        )
    )
    at = _first_difference(ours, expected)
    assert ours == expected, (
        f"{cls.__name__} v{version}: frames differ at byte {at} "
        f"(ours {ours[at : at + 8].hex()}, kafka-python {expected[at : at + 8].hex()})"
    )
