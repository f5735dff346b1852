"""A writer's JSON Schema as columns: the ``Node`` tree both routes of ``json_schema.py``
read values by, and its Arrow types.

The mapping (docs/json_schema.md has it as a table) follows Confluent's JSON Schema
converter for Kafka Connect and Spark's ``from_json`` types: an object with
``properties`` is a struct of them in the schema's order, an object with no properties
but an ``additionalProperties`` schema a map from string, an array a list of its
``items``, ``integer`` int64, ``number`` float64, ``boolean``, ``string`` (and an
``enum``/``const`` of strings) a string, a string of ``format`` ``date-time`` a
``timestamp[us, UTC]``, of ``format`` ``date`` a date32. ``"type": ["null", X]`` and a
``oneOf``/``anyOf`` of null and one schema are a nullable X. ``$ref`` is resolved: a JSON
pointer in the same document (``#/definitions/...``, ``#/$defs/...``), or a document the
registered schema's ``references`` name (another subject's version, fetched through the
registry client), and a pointer in it.

Nullability: a top-level property is a non-nullable column when ``required`` names it and
its type does not allow null (the frame's "required" columns), nullable otherwise. Nested
fields, list items and map values are all nullable, as Spark's ``from_json`` makes them
and as a DDL's are: an optional object that is absent is a null struct whose children
are null too, which Arrow refuses to hold under a non-nullable child field, and a table
made from one writer's schema would clash with a later DDL of the same columns. The
values are still checked (``json_schema_values.py``): a nested required property that is
missing, where its object is present, is a dead letter.

What a column cannot hold raises ``IncompatibleSchemaError`` naming where in the schema
(the document and the JSON pointer): a union of several non-null types, an object with
neither properties nor an ``additionalProperties`` schema, an array without one
``items`` schema, a schema with no type, a ``$ref`` to a document no reference names,
recursion (a ``$ref`` back into a schema it is inside), ``allOf`` of several schemas,
``not``, ``if``/``then``/``else``, a type of ``null`` alone.
"""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from ingest.errors import IncompatibleSchemaError
from ingest.registry import RegisteredSchema, RegistryClient

__all__ = [
    "TIMESTAMP",
    "Node",
    "Property",
    "column_type",
    "columns",
    "escape",
    "has_map",
    "parse_type",
    "schema_node",
]

TIMESTAMP = pa.timestamp("us", tz="UTC")

# kinds of Node
OBJECT, MAP, ARRAY = "object", "map", "array"
STRING, INTEGER, NUMBER, BOOLEAN = "string", "integer", "number", "boolean"
DATE, DATE_TIME = "date", "date-time"

_SCALARS: dict[str, pa.DataType] = {
    STRING: pa.string(),
    INTEGER: pa.int64(),
    NUMBER: pa.float64(),
    BOOLEAN: pa.bool_(),
    DATE: pa.date32(),
    DATE_TIME: TIMESTAMP,
}
_UNSUPPORTED = ("not", "if", "then", "else", "prefixItems", "patternProperties")


@dataclass(frozen=True)
class Property:
    """A property of an object: its name, its type and whether ``required`` names it."""

    name: str
    node: Node
    required: bool

    @property
    def nullable(self) -> bool:
        """Whether its column may be null: it may be absent, or its type allows null."""
        return not self.required or self.node.nullable


@dataclass(frozen=True)
class Node:
    """One JSON Schema type a column can hold."""

    kind: str  # OBJECT, MAP, ARRAY or a key of _SCALARS
    nullable: bool = False  # null is one of its values
    properties: tuple[Property, ...] = ()  # OBJECT
    items: Node | None = None  # ARRAY: its items; MAP: its values


def columns(node: Node) -> pa.StructType:
    """The columns of a top-level object: non-nullable where required (see above)."""
    return pa.struct(
        [pa.field(p.name, column_type(p.node), nullable=p.nullable) for p in node.properties]
    )


def column_type(node: Node) -> pa.DataType:
    """A nested value's Arrow type (every field, item and map value nullable)."""
    if node.kind == OBJECT:
        return pa.struct([pa.field(p.name, column_type(p.node)) for p in node.properties])
    if node.kind == ARRAY:
        assert node.items is not None
        return pa.list_(column_type(node.items))
    if node.kind == MAP:
        assert node.items is not None
        return pa.map_(pa.string(), column_type(node.items))
    return _SCALARS[node.kind]


def parse_type(node: Node) -> pa.DataType:
    """The type the values are first read as: the column's, with dates and date-times
    as their strings (checked and converted afterwards) and every field nullable (the
    required ones are checked afterwards: Arrow's JSON reader refuses a null child of a
    null struct, which an absent optional object is)."""
    if node.kind == OBJECT:
        return pa.struct([pa.field(p.name, parse_type(p.node)) for p in node.properties])
    if node.kind == ARRAY:
        assert node.items is not None
        return pa.list_(parse_type(node.items))
    if node.kind == MAP:
        assert node.items is not None
        return pa.map_(pa.string(), parse_type(node.items))
    if node.kind in (DATE, DATE_TIME):
        return pa.string()
    return _SCALARS[node.kind]


def has_map(node: Node) -> bool:
    """Whether a map is anywhere in ``node`` (Arrow's JSON reader makes none)."""
    if node.kind == MAP:
        return True
    if node.kind == OBJECT:
        return any(has_map(p.node) for p in node.properties)
    return node.items is not None and has_map(node.items)


# -- JSON Schema to Node ----------------------------------------------------------------------


# A registered schema is untrusted input: what it may expand to is capped. References are
# resolved once each (a document whose every level refers twice to the one below expands
# exponentially when walked as a tree: depth 18 took 11.8 s), and the columns it makes and
# how deep they nest are bounded.
MAX_FIELDS = 10_000
MAX_DEPTH = 64


def field_count(node: Node, counted: dict[int, int] | None = None) -> int:
    """Every field, item and map value under ``node`` (shared nodes counted at each use,
    each computed once), ``node`` itself included."""
    counted = {} if counted is None else counted
    found = counted.get(id(node))
    if found is None:
        children = [p.node for p in node.properties] + ([node.items] if node.items else [])
        found = 1 + sum(field_count(child, counted) for child in children)
        counted[id(node)] = found
    return found


def schema_node(registered: RegisteredSchema, client: RegistryClient) -> Node:
    """The writer's schema as a ``Node`` (an object with properties, or the error)."""
    root = _loads(registered.text, "the schema")
    walker = _Walker(root, _references(registered.references), client)
    node = walker.node(root, "", "")
    fields = field_count(node)
    if fields > MAX_FIELDS:
        raise IncompatibleSchemaError(
            f"the schema expands to {fields} fields, over the cap of {MAX_FIELDS} "
            "(anyone who may register a schema is untrusted)"
        )
    if node.kind != OBJECT:
        raise IncompatibleSchemaError(
            f"the schema is a{'n' if node.kind[0] in 'aeiou' else ''} {node.kind}, not an "
            "object with properties: its values cannot be columns"
        )
    return node


def _loads(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise IncompatibleSchemaError(f"{what} is not JSON: {exc}") from None


def _references(raw: tuple[dict[str, Any], ...]) -> dict[str, tuple[str, int]]:
    return {str(r["name"]): (str(r["subject"]), int(r["version"])) for r in raw}


def escape(name: str) -> str:
    """A property name as a JSON pointer's reference token (RFC 6901)."""
    return name.replace("~", "~0").replace("/", "~1")


class _Walker:
    """Turns schemas into nodes, resolving ``$ref`` across the documents it loads."""

    def __init__(
        self, root: Any, references: dict[str, tuple[str, int]], client: RegistryClient
    ) -> None:
        self.documents = {"": root}
        # Reference names are global to a schema and the ones it references, as in
        # Confluent's resolver.
        self.references = references
        self.client = client
        self.resolving: list[str] = []  # the $ref targets being resolved, outermost first
        self.resolved: dict[str, Node] = {}  # each $ref target's node, made once
        self.depth = 0

    def _load(self, name: str) -> Any:
        """The document a reference names, fetched from the registry (a registry that
        fails raises ``RegistryError``: the frame's ``on_registry_error`` decides)."""
        root = self.documents[""]
        base = root.get("$id") or root.get("id") if isinstance(root, dict) else None
        names = [name, urllib.parse.urljoin(base, name)] if isinstance(base, str) else [name]
        found_name = next((n for n in names if n in self.references), None)
        if found_name is None:
            known = ", ".join(sorted(self.references)) or "none"
            raise IncompatibleSchemaError(
                f"a $ref to the document {name!r}, which no reference of the registered "
                f"schema names (its references: {known})"
            )
        subject, version = self.references[found_name]
        found = self.client.version(subject, version)
        if found.schema_type != "JSON":
            raise IncompatibleSchemaError(
                f"the reference {name!r} is a {found.schema_type} schema, not JSON"
            )
        for key, value in _references(found.references).items():
            self.references.setdefault(key, value)
        return _loads(found.text, f"the reference {name!r}")

    def node(self, schema: Any, document: str, pointer: str) -> Node:
        where = f"{document}#{pointer}"
        if self.depth >= MAX_DEPTH:
            raise _error(where, f"nested over {MAX_DEPTH} levels deep")
        self.depth += 1
        try:
            return self._node(schema, document, pointer, where)
        finally:
            self.depth -= 1

    def _node(self, schema: Any, document: str, pointer: str, where: str) -> Node:
        if not isinstance(schema, dict):
            raise _error(where, f"a schema of {json.dumps(schema)[:40]}: no type to map")
        if "$ref" in schema:
            return self._ref(str(schema["$ref"]), document, where)
        for key in _UNSUPPORTED:
            if key in schema:
                raise _error(where, f"{key!r} is not supported")
        for key in ("oneOf", "anyOf", "allOf"):
            if key in schema and _shapes(schema[key]):
                return self._union(schema, key, document, pointer)
        types = schema.get("type")
        nullable = False
        if isinstance(types, list):
            nullable = "null" in types
            kinds = [t for t in types if t != "null"]
            if len(kinds) != 1:
                raise _error(
                    where,
                    f"type {json.dumps(types)}: only null and one other type map to a column",
                )
            kind: Any = kinds[0]
        else:
            kind = types if types is not None else _implied(schema, where)
        node = self._typed(kind, schema, document, pointer)
        if isinstance(schema.get("enum"), list) and None in schema["enum"]:
            nullable = True
        return replace(node, nullable=node.nullable or nullable)

    def _typed(self, kind: Any, schema: dict[str, Any], document: str, pointer: str) -> Node:
        where = f"{document}#{pointer}"
        if kind == OBJECT:
            properties = schema.get("properties")
            if isinstance(properties, dict) and properties:
                listed = schema.get("required")
                required = set(listed) if isinstance(listed, list) else set()
                return Node(
                    OBJECT,
                    properties=tuple(
                        Property(
                            str(name),
                            self.node(sub, document, f"{pointer}/properties/{escape(name)}"),
                            name in required,
                        )
                        for name, sub in properties.items()
                    ),
                )
            additional = schema.get("additionalProperties")
            if isinstance(additional, dict):
                values = self.node(additional, document, f"{pointer}/additionalProperties")
                return Node(MAP, items=values)
            raise _error(
                where,
                "an object with neither properties nor an additionalProperties schema: "
                "no columns to make of it",
            )
        if kind == ARRAY:
            items = schema.get("items")
            if not isinstance(items, dict):
                why = "a tuple of items" if isinstance(items, list) else "no items schema"
                raise _error(where, f"an array with {why}: only one items schema maps to a list")
            return Node(ARRAY, items=self.node(items, document, f"{pointer}/items"))
        if kind == STRING:
            form = schema.get("format")
            return Node(DATE_TIME if form == DATE_TIME else DATE if form == DATE else STRING)
        if kind in (INTEGER, NUMBER, BOOLEAN):
            return Node(str(kind))
        if kind == "null":
            raise _error(where, "type null alone: a column that is always null")
        raise _error(where, f"type {json.dumps(kind)} is not a JSON Schema type")

    def _union(self, schema: dict[str, Any], key: str, document: str, pointer: str) -> Node:
        where = f"{document}#{pointer}"
        members = schema[key]
        if not isinstance(members, list) or not members:
            raise _error(where, f"{key} is not a list of schemas")
        if key == "allOf":
            if len(members) != 1:
                raise _error(where, "allOf of several schemas is not supported")
            return self.node(members[0], document, f"{pointer}/allOf/0")
        kept = [(i, m) for i, m in enumerate(members) if not _is_null(m)]
        if len(kept) != 1:
            raise _error(
                where,
                f"{key} of {len(kept)} non-null schemas: only null and one other type map "
                "to a column",
            )
        i, member = kept[0]
        node = self.node(member, document, f"{pointer}/{key}/{i}")
        return replace(node, nullable=node.nullable or len(kept) < len(members))

    def _ref(self, ref: str, document: str, where: str) -> Node:
        target, _, fragment = ref.partition("#")
        target = urllib.parse.unquote(target) or document
        pointer = urllib.parse.unquote(fragment)
        key = f"{target}#{pointer}"
        if key in self.resolving:
            raise _error(where, f"$ref {ref!r} is recursive: a column cannot hold it")
        if key in self.resolved:
            return self.resolved[key]
        if target not in self.documents:
            try:
                self.documents[target] = self._load(target)
            except IncompatibleSchemaError as exc:
                raise _error(where, str(exc)) from None
        schema = _pointed(self.documents[target], pointer, where, ref)
        self.resolving.append(key)
        try:
            node = self.resolved[key] = self.node(schema, target, pointer)
            return node
        finally:
            self.resolving.pop()


def _pointed(root: Any, pointer: str, where: str, ref: str) -> Any:
    """The part of ``root`` a JSON pointer names."""
    found = root
    if not pointer:
        return found
    if not pointer.startswith("/"):
        raise _error(where, f"$ref {ref!r}: only JSON pointers (#/...) are resolved")
    for part in pointer[1:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(found, dict) and part in found:
            found = found[part]
        elif isinstance(found, list) and part.isdigit() and int(part) < len(found):
            found = found[int(part)]
        else:
            raise _error(where, f"$ref {ref!r} names nothing in its document")
    return found


def _implied(schema: dict[str, Any], where: str) -> str:
    """The type a schema without ``type`` implies by its keywords."""
    if "properties" in schema or "additionalProperties" in schema:
        return OBJECT
    if "items" in schema:
        return ARRAY
    values = schema["enum"] if isinstance(schema.get("enum"), list) else None
    if values is None and "const" in schema:
        values = [schema["const"]]
    if values is not None:
        kept = [v for v in values if v is not None]
        if kept and all(isinstance(v, str) for v in kept):
            return STRING
        raise _error(where, "an enum or const of values that are not all strings")
    raise _error(where, "a schema with no type: a column needs one")


_SHAPING = ("type", "$ref", "properties", "additionalProperties", "items", "enum", "const",
            "oneOf", "anyOf", "allOf")  # fmt: skip


def _shapes(members: Any) -> bool:
    """Whether a oneOf/anyOf/allOf gives types (else its members only constrain values,
    e.g. ``"oneOf": [{"required": ["a"]}, {"required": ["b"]}]`` beside ``properties``:
    the schema's own keywords give the type, and those constraints are not checked)."""
    if not isinstance(members, list):
        return True  # malformed: _union says so
    return any(not isinstance(m, dict) or any(k in m for k in _SHAPING) for m in members)


def _is_null(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "null"


def _error(where: str, why: str) -> IncompatibleSchemaError:
    """``where``: the document (empty for the writer's own) and the JSON pointer."""
    return IncompatibleSchemaError(f"{where}: {why}")
