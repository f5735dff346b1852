"""Deterministic, schema-driven sample messages for the protocol tests.

``sample(cls, version, seed)`` fills every field the version carries with a
random but valid value (nulls where the version allows them, non-default
tagged fields, unknown tagged fields in flexible versions), and leaves the
fields the version cannot carry at their defaults, so the sample must survive
an encode/decode round trip unchanged.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from ingest.protocol.messages import REQUEST_TYPES
from ingest.protocol.schema import ArrayOf, Kind, Message, Struct, struct_fields

MESSAGE_TYPES: list[type[Message]] = []
for _request in REQUEST_TYPES:
    MESSAGE_TYPES += [_request, _request.response_type]

# Every (message class, version) we implement.
MESSAGE_VERSIONS: list[tuple[type[Message], int]] = [
    (cls, version)
    for cls in MESSAGE_TYPES
    for version in range(cls.version_range().low, cls.version_range().high + 1)
]

_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
}
_TEXT = "abcxyz-._é✓日本"


def _primitive(kind: Kind, rng: random.Random) -> Any:
    if kind.name in _INT_RANGES:
        low, high = _INT_RANGES[kind.name]
        # Mix extremes with small values: both kinds of bugs hide at the edges.
        return rng.choice(
            [low, high, -1, 0, rng.randint(low, high), rng.randint(max(low, -5), min(high, 100))]
        )
    if kind.name == "bool":
        return rng.random() < 0.5
    if kind.name == "float64":
        return rng.uniform(-1e9, 1e9)
    if kind.name == "uuid":
        return uuid.UUID(int=rng.getrandbits(128))
    if kind.name == "string":
        return "".join(rng.choice(_TEXT) for _ in range(rng.randint(0, 12)))
    if kind.name in ("bytes", "records"):
        return rng.randbytes(rng.randint(0, 40))
    raise AssertionError(f"no sample for {kind}")


def _value(
    kind: Any, version: int, flexible: bool, nullable: bool, rng: random.Random, unknown: bool
) -> Any:
    if nullable and rng.random() < 0.25:
        return None
    if isinstance(kind, Kind):
        return _primitive(kind, rng)
    if isinstance(kind, ArrayOf):
        return tuple(
            _value(kind.element, version, flexible, False, rng, unknown)
            for _ in range(rng.randint(0, 3))
        )
    return build(kind, version, flexible, rng, unknown)


def build(
    cls: type[Struct], version: int, flexible: bool, rng: random.Random, unknown: bool = True
) -> Any:
    values: dict[str, Any] = {}
    for name, spec in struct_fields(cls):
        if version in spec.versions:
            nullable = version in spec.nullable
            values[name] = _value(spec.kind, version, flexible, nullable, rng, unknown)
    if unknown and flexible and rng.random() < 0.3:
        # Tags far above any Kafka assigns, so they stay unknown to the schema.
        tags = sorted(rng.sample(range(60, 90), rng.randint(1, 2)))
        values["unknown_tagged_fields"] = tuple(
            (tag, rng.randbytes(rng.randint(0, 5))) for tag in tags
        )
    return cls(**values)


def sample(cls: type[Message], version: int, seed: int, *, unknown_tags: bool = True) -> Any:
    """A sample of ``cls`` at ``version``; ``unknown_tags=False`` adds no unknown tagged fields."""
    rng = random.Random(f"{cls.__name__}/{version}/{seed}")
    return build(cls, version, cls.is_flexible(version), rng, unknown_tags)
