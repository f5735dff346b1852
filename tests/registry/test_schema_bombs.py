"""A registered schema is untrusted: one that expands exponentially (every level refers to
the one below twice) is resolved in linear time and refused by the field cap as an
incompatible schema; ordinary shared references still give their columns."""

from __future__ import annotations

import json
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool

from ingest.errors import IncompatibleSchemaError
from ingest.formats.json_schema import json_schema_types
from ingest.formats.json_schema.json_schema_types import MAX_FIELDS, columns, schema_node
from ingest.formats.protobuf import protobuf_schema
from ingest.formats.protobuf.protobuf_schema import message_columns
from ingest.registry import RegisteredSchema, RegistryClient, RegistrySettings

# Never asked: every $ref here points inside the writer's own document.
NO_REGISTRY = RegistryClient(RegistrySettings(urls=("http://127.0.0.1:9",)))


def _json_bomb(depth: int) -> dict[str, Any]:
    """Level i is an object of two properties, both ``$ref`` level i+1: 2^depth leaves."""
    defs: dict[str, Any] = {f"L{depth}": {"type": "string"}}
    for level in range(depth - 1, -1, -1):
        below = {"$ref": f"#/$defs/L{level + 1}"}
        defs[f"L{level}"] = {"type": "object", "properties": {"a": below, "b": below}}
    return {"$defs": defs, "type": "object", "properties": {"root": {"$ref": "#/$defs/L0"}}}


def test_an_exponential_json_schema_is_refused_by_the_field_cap() -> None:
    schema = RegisteredSchema(1, "JSON", json.dumps(_json_bomb(20)))  # 2^20 leaves as a tree
    with pytest.raises(IncompatibleSchemaError) as info:
        schema_node(schema, NO_REGISTRY)
    assert f"over the cap of {MAX_FIELDS}" in str(info.value)


def test_shared_references_under_the_cap_are_resolved_once_and_give_every_column(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    walked: list[str] = []
    real = json_schema_types._pointed

    def counting(root: Any, pointer: str, where: str, ref: str) -> Any:
        walked.append(pointer)
        return real(root, pointer, where, ref)

    monkeypatch.setattr(json_schema_types, "_pointed", counting)
    node = schema_node(RegisteredSchema(1, "JSON", json.dumps(_json_bomb(6))), NO_REGISTRY)
    assert sorted(walked) == sorted(f"/$defs/L{level}" for level in range(7))  # once each
    leaf = columns(node).field("root").type
    for _ in range(6):  # a struct of two structs of ... of two strings
        assert [leaf.field(i).name for i in range(leaf.num_fields)] == ["a", "b"]
        leaf = leaf.field(0).type
    assert str(leaf) == "string"


def test_a_json_schema_nested_past_the_depth_cap_is_refused() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(json_schema_types.MAX_DEPTH + 5):
        schema = {"type": "object", "properties": {"x": schema}}
    with pytest.raises(IncompatibleSchemaError) as info:
        schema_node(RegisteredSchema(1, "JSON", json.dumps(schema)), NO_REGISTRY)
    assert "levels deep" in str(info.value)


def _proto_bomb(depth: int, name: str) -> Any:
    """Message Mi has two fields of type M(i+1); M<depth> holds one string."""
    file = descriptor_pb2.FileDescriptorProto(name=f"{name}.proto", package=name, syntax="proto3")
    last = file.message_type.add(name=f"M{depth}")
    last.field.add(name="s", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING)
    for level in range(depth - 1, -1, -1):
        message = file.message_type.add(name=f"M{level}")
        for number, field in enumerate(("a", "b"), start=1):
            message.field.add(
                name=field,
                number=number,
                type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                type_name=f".{name}.M{level + 1}",
            )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return pool.FindMessageTypeByName(f"{name}.M0")


def test_an_exponential_protobuf_message_is_refused_by_the_field_cap() -> None:
    with pytest.raises(IncompatibleSchemaError) as info:
        message_columns(_proto_bomb(20, "bomb"))
    assert f"over the cap of {protobuf_schema.MAX_FIELDS}" in str(info.value)


def test_a_protobuf_message_under_the_cap_keeps_its_columns() -> None:
    struct = message_columns(_proto_bomb(5, "small"))
    assert [struct.field(i).name for i in range(struct.num_fields)] == ["a", "b"]
