"""What a Delta table written by ingest looks like: ``TableConfig``.

One frozen, picklable value says where the table is (``uri`` and delta-rs
``storage_options``), which consumer group feeds it (part of every txn app id),
how rows land (``append`` or ``upsert`` on ``merge_keys``), what a tombstone
(a null value) does (``tombstones``), how values decode (``binary``, ``string``,
``json`` with a Spark DDL schema, optionally inside a Debezium change
envelope: ``value_envelope``, or a ``REGISTRY_FORMATS`` format in the Confluent wire
format, its writers' schemas from ``registry`` and its columns from the DDL schema or
the subject's latest schema ``value_registered``), an optional SQL
transform over the view ``batch``, the partition columns, and where dead letters
go (by default a sibling table ``<uri>_dead_letters``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from ingest.errors import ConfigError
from ingest.protocol.partition import topic_name_problem
from ingest.redaction import masked
from ingest.registry import REGISTRY_FORMATS, RegisteredSchema, RegistrySettings, subject_for
from ingest.sink.storage import normalize_uri

__all__ = [
    "BASE_COLUMNS",
    "DEAD_LETTER_COLUMN",
    "DELETE_COLUMN",
    "FIELD_FORMATS",
    "REGISTRY_FORMATS",
    "TOPIC_PLACEHOLDER",
    "Condition",
    "Router",
    "RowSelect",
    "TableConfig",
]

WriteMode = Literal["append", "upsert"]
ValueFormat = Literal["binary", "string", "json", "avro", "protobuf", "json_schema"]
VALUE_FORMATS = ("binary", "string", "json", "avro", "protobuf", "json_schema")
# With json, the formats in a registry (Confluent-framed): their fields become columns.
FIELD_FORMATS = ("json", *REGISTRY_FORMATS)
# What a record with a null value does: "delete" its key's row (upsert), "ignore" it,
# make it a "dead_letter", or "keep" it as a row with a null value (append).
Tombstones = Literal["delete", "ignore", "dead_letter", "keep"]
TOMBSTONES = ("delete", "ignore", "dead_letter", "keep")
# "debezium": each value is a Debezium change event (before/after/op), the schema its rows.
Envelope = Literal["none", "debezium"]

# In ``uri`` (and ``dead_letter_uri``): each topic lands in a table of its own, named by it.
TOPIC_PLACEHOLDER = "{topic}"

# A topic whose name can be a table's in a catalog (with a ``{topic}`` ``name``).
CATALOG_TOPIC = re.compile(r"[a-z0-9_]+")

# The Kafka columns every batch starts with (``value`` is replaced by the JSON
# fields in json format).
BASE_COLUMNS = ("topic", "partition", "offset", "timestamp", "timestamp_type", "key", "headers")
# A transform marks rows it rejects by a non-null string in this column.
DEAD_LETTER_COLUMN = "_dead_letter"
# In upsert mode, a true value in this column deletes the row's key (a tombstone, a
# Debezium delete, or a transform's choice); it never lands as a column.
DELETE_COLUMN = "_delete"


@dataclass(frozen=True)
class Condition:
    """A [[route]]'s test of one record: the value of the header ``header`` (UTF-8), or
    of the top-level field ``field`` of the value read as JSON (a string as it is, a
    number or boolean as its JSON text), matched whole by the regular expression
    ``matches``. A record without that header or field (or not JSON) fails it."""

    header: str | None
    field: str | None
    matches: str

    def __post_init__(self) -> None:
        if (self.header is None) == (self.field is None):
            raise ConfigError("a route goes by a header or by a value field", key="route")

    def __str__(self) -> str:
        what = f"header {self.header!r}" if self.header is not None else f"field {self.field!r}"
        return f"{what} matching {self.matches!r}"


@dataclass(frozen=True)
class RowSelect:
    """Which of a topic's records a table takes when routes go by header or field:
    those that pass ``take`` (every record when None) and none of ``skip`` (the
    conditions of the routes before it that the topic also matches)."""

    take: Condition | None
    skip: tuple[Condition, ...] = ()


@dataclass(frozen=True, kw_only=True)
class TableConfig:
    """One target table.

    ``date_column`` adds a DATE column (UTC day of the Kafka timestamp) under
    that name, so tables can be partitioned by day without a transform.
    ``dead_letter_storage_options`` default to ``storage_options``.
    ``tombstones`` defaults to "delete" in upsert mode and "keep" in append mode.
    """

    uri: str
    group: str
    storage_options: Mapping[str, str] = field(default_factory=dict)
    mode: WriteMode = "append"
    merge_keys: tuple[str, ...] = ()
    value_format: ValueFormat = "binary"
    value_schema: str | None = None
    value_envelope: Envelope = "none"
    # REGISTRY_FORMATS: where the writers' schemas are, what a registry failure costs
    # ("fail" the batch or "dead_letter" its records), what a writer's schema that does
    # not fit the table costs (ingest/formats/framed.py), the subject's latest schema,
    # giving the columns when value_schema (DDL) does not, and the record name: the
    # type of a writer's schema whose fields are the columns (protobuf: the message;
    # None: the file's first).
    registry: RegistrySettings | None = None
    on_registry_error: Literal["fail", "dead_letter"] = "fail"
    on_incompatible: Literal["fail", "dead_letter"] = "dead_letter"
    value_registered: RegisteredSchema | None = None
    # A ``{topic}`` table whose columns come from each topic's own subject (the topic
    # strategies, no DDL): the strategy; ``for_topic`` names the topic's subject, whose
    # latest schema the engine reads at the table's first batch.
    value_strategy: str | None = None
    value_subject: str | None = None
    # Keys: "binary", "string" or a REGISTRY_FORMATS one, and its subject's latest schema.
    key_format: str = "binary"
    key_registered: RegisteredSchema | None = None
    key_record_name: str | None = None
    # The record name of the registry's record strategies (Protobuf: the message).
    record_name: str | None = None
    tombstones: Tombstones | None = None
    transform: str | None = None
    transform_tables: Mapping[str, str] = field(default_factory=dict)
    partition_by: tuple[str, ...] = ()
    # Delta table properties of a table ingest creates (an existing table keeps its own).
    properties: Mapping[str, str] = field(default_factory=dict)
    date_column: str | None = None
    dead_letter_uri: str | None = None
    dead_letter_storage_options: Mapping[str, str] | None = None
    # The table's and its dead letters' names in Spark's catalog ({topic} allowed), when
    # the config names the table (``uri`` is then the catalog's location of it): a new one
    # is created, and one found unregistered is registered, through the catalog
    # (``ingest/engines/spark/catalog.py``).
    name: str | None = None
    dead_letter_name: str | None = None
    # [[route]]: which route the table is (its index; None without routes), and, for a
    # topic no route matches, why its records are all dead letters.
    route: int | None = None
    refuse: str | None = None
    # With routes by header or field: which of its topic's records the table takes
    # (None: all of them).
    select: RowSelect | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.uri, str) or not self.uri.strip():
            raise ConfigError("must name the Delta table", key="table.uri")
        if not isinstance(self.group, str) or not self.group:
            raise ConfigError("must name the consumer group", key="table.group")
        if self.mode not in ("append", "upsert"):
            raise ConfigError(f"must be append or upsert, got {self.mode!r}", key="table.mode")
        object.__setattr__(self, "merge_keys", tuple(self.merge_keys))
        object.__setattr__(self, "partition_by", tuple(self.partition_by))
        object.__setattr__(self, "storage_options", dict(self.storage_options))
        object.__setattr__(self, "properties", dict(self.properties))
        if self.mode == "upsert" and not self.merge_keys:
            raise ConfigError("upsert mode needs merge_keys", key="table.merge_keys")
        if self.mode == "append" and self.merge_keys:
            raise ConfigError("merge_keys only apply to upsert mode", key="table.merge_keys")
        if self.value_format not in VALUE_FORMATS:
            raise ConfigError(
                f"must be one of {', '.join(VALUE_FORMATS)}, got {self.value_format!r}",
                key="table.value.format",
            )
        if self.value_format == "json" and not self.value_schema:
            raise ConfigError("json values need a Spark DDL schema", key="table.value.schema")
        if self.value_format not in FIELD_FORMATS and self.value_schema:
            raise ConfigError(
                f"a value schema only applies to {', '.join(FIELD_FORMATS)}",
                key="table.value.schema",
            )
        if self.value_format in REGISTRY_FORMATS and self.registry is None:
            raise ConfigError(
                f"{self.value_format} values need a schema registry", key="schema_registry"
            )
        if self.key_format not in ("binary", "string", *REGISTRY_FORMATS):
            raise ConfigError(f"no key format {self.key_format!r}", key="table.key.format")
        if self.key_format in REGISTRY_FORMATS and self.registry is None:
            raise ConfigError(
                f"{self.key_format} keys need a schema registry", key="schema_registry"
            )
        if self.tombstones is None:
            object.__setattr__(self, "tombstones", "delete" if self.mode == "upsert" else "keep")
        check_changes(self.mode, self.value_format, self.value_envelope, self.tombstones)
        if self.transform is not None and not self.transform.strip():
            raise ConfigError("an empty transform; leave it unset", key="table.transform")
        # Relative paths are the config's, not the Spark driver's working directory's.
        tables = {name: normalize_uri(uri) for name, uri in self.transform_tables.items()}
        object.__setattr__(self, "transform_tables", tables)
        if self.date_column is not None and self.date_column in (*BASE_COLUMNS, "value"):
            raise ConfigError(
                f"{self.date_column!r} is a Kafka column name", key="table.date_column"
            )
        if len(set(self.partition_by)) != len(self.partition_by):
            raise ConfigError("a column is named twice", key="table.partition_by")
        if self.dead_letter_uri is None:
            object.__setattr__(self, "dead_letter_uri", self.uri.rstrip("/") + "_dead_letters")
        if self.dead_letter_uri == self.uri:
            raise ConfigError("must differ from the table uri", key="table.dead_letter_uri")
        for key, uri in (("table.uri", self.uri), ("table.dead_letter_uri", self.dead_letters)):
            if uri.replace(TOPIC_PLACEHOLDER, "").count("{") or uri.count("}") != uri.count(
                TOPIC_PLACEHOLDER
            ):
                raise ConfigError(f"{uri!r}: the only placeholder is {TOPIC_PLACEHOLDER}", key=key)
        if TOPIC_PLACEHOLDER in self.dead_letters and not self.per_topic:
            raise ConfigError(
                f"{TOPIC_PLACEHOLDER} in the dead-letter table needs it in table.uri too",
                key="table.dead_letter_uri",
            )
        options = self.dead_letter_storage_options
        object.__setattr__(
            self,
            "dead_letter_storage_options",
            dict(self.storage_options if options is None else options),
        )

    @property
    def per_topic(self) -> bool:
        """Whether each topic lands in a table of its own (``uri`` names ``{topic}``)."""
        return TOPIC_PLACEHOLDER in self.uri

    def for_topic(self, topic: str) -> TableConfig:
        """The table ``topic`` lands in: ``{topic}`` filled in (the table itself when the
        uri has no placeholder). A topic name is data from the cluster: one Kafka would
        refuse ("..", "a/b"), or one whose table would be another topic's dead-letter
        table, is refused before anything is written."""
        if not self.per_topic:
            return self
        problem = topic_name_problem(topic)
        if problem is not None:
            raise ConfigError(f"topic cannot name a table: {problem}", key="table.uri")
        if self.name is not None and not CATALOG_TOPIC.fullmatch(topic):
            raise ConfigError(
                f"topic {topic!r} cannot name a table in the catalog ({self.name}): a "
                "catalog's table names are lowercase letters, digits and _ (a Hive "
                "metastore folds case); land it with an earlier [[route]] of its own, with "
                "a uri or a fixed name",
                key="table.name" if self.route is None else f"route[{self.route}].name",
            )
        uri = self.uri.replace(TOPIC_PLACEHOLDER, topic)
        other = _template_match(self.dead_letters, uri)
        if other is not None:
            raise ConfigError(
                f"topic {topic!r} would land in {uri}, the dead-letter table of topic "
                f"{other!r}; set table.dead_letter_uri to a template no topic's table can "
                "render to",
                key="table.uri",
            )
        subject = None
        if self.value_strategy is not None:
            subject = subject_for(self.value_strategy, topic, self.record_name)
        return replace(
            self,
            uri=uri,
            dead_letter_uri=self.dead_letters.replace(TOPIC_PLACEHOLDER, topic),
            value_subject=subject,
            name=_rendered(self.name, topic),
            dead_letter_name=_rendered(self.dead_letter_name, topic),
        )

    @property
    def deletes(self) -> bool:
        """Whether rows may delete their key (``DELETE_COLUMN``)."""
        return self.mode == "upsert" and (
            self.tombstones == "delete" or self.value_envelope == "debezium"
        )

    @property
    def dead_letters(self) -> str:
        assert self.dead_letter_uri is not None
        return self.dead_letter_uri

    @property
    def dead_letter_options(self) -> dict[str, str]:
        return dict(self.dead_letter_storage_options or {})

    def __repr__(self) -> str:
        return (
            f"TableConfig(uri={self.uri!r}, name={self.name!r}, group={self.group!r}, "
            f"mode={self.mode!r}, "
            f"merge_keys={self.merge_keys!r}, value_format={self.value_format!r}, "
            f"value_schema={self.value_schema!r}, value_envelope={self.value_envelope!r}, "
            f"tombstones={self.tombstones!r}, transform={self.transform!r}, "
            f"partition_by={self.partition_by!r}, date_column={self.date_column!r}, "
            f"dead_letter_uri={self.dead_letter_uri!r}, "
            f"storage_options={masked(dict(self.storage_options))!r}"
        )


@dataclass(frozen=True)
class Router:
    """Which table each record lands in: the first of ``routes`` (a regular expression of
    the whole topic name, the route's table, and a ``Condition`` on the record or None)
    that matches, its ``{topic}`` filled in; without routes, ``default``. With routes, a
    record none matches lands nowhere: it is a dead letter (``refuse``), and its
    partition's txn versions are kept in ``default``."""

    default: TableConfig
    routes: tuple[tuple[str, TableConfig, Condition | None], ...] = ()

    @property
    def per_topic(self) -> bool:
        return bool(self.routes) or self.default.per_topic

    def tables_for(self, topic: str) -> tuple[TableConfig, ...]:
        """The tables ``topic``'s records land in. One, taking every record, unless
        routes go by header or field: then each route that matches the topic, up to
        the first without a condition, takes its records (``select``), and when every
        such route has a condition, ``default`` takes the rest as dead letters. Two of
        them naming one table is refused (one table holds one txn version per
        partition)."""
        taken: list[TableConfig] = []
        skip: list[Condition] = []
        for pattern, table, condition in self.routes:
            if not re.fullmatch(pattern, topic):
                continue
            chosen = table.for_topic(topic)
            if condition is None and not skip:
                return (chosen,)
            taken.append(replace(chosen, select=RowSelect(condition, tuple(skip))))
            if condition is None:
                break
            skip.append(condition)
        else:
            if not self.routes:
                return (self.default.for_topic(topic),)
            why = f"no [[route]] matches topic {topic!r}"
            if skip:
                why = f"no [[route]] matches this record of topic {topic!r}"
            refused = replace(self.default.for_topic(topic), refuse=why)
            if skip:
                refused = replace(refused, select=RowSelect(None, tuple(skip)))
            taken.append(refused)
        uris = [normalize_uri(t.uri) for t in taken]
        for uri in uris:
            if uris.count(uri) > 1:
                raise ConfigError(
                    f"two [[route]]s send records of topic {topic!r} to the table {uri}: "
                    "routes by header or field that share a topic need tables of their own",
                    key="route",
                )
        return tuple(taken)

    def for_topic(self, topic: str) -> TableConfig:
        """The first of ``tables_for(topic)``: its only table, unless routes go by
        header or field."""
        return self.tables_for(topic)[0]

    def tables(self) -> tuple[TableConfig, ...]:
        """The default table and each route's (templates unfilled)."""
        return (self.default, *(table for _, table, _ in self.routes))


def _rendered(name: str | None, topic: str) -> str | None:
    return None if name is None else name.replace(TOPIC_PLACEHOLDER, topic)


def _template_match(template: str, uri: str) -> str | None:
    """The topic whose rendering of ``template`` is ``uri``, if a legal one is."""
    if TOPIC_PLACEHOLDER not in template:
        return None
    pattern = "(.+)".join(re.escape(part) for part in template.split(TOPIC_PLACEHOLDER))
    found = re.fullmatch(pattern, uri)
    if found is None or len(set(found.groups())) != 1:
        return None
    topic = found.group(1)
    return topic if topic_name_problem(topic) is None else None


def check_changes(mode: str, value_format: str, envelope: str, tombstones: object) -> None:
    """The rules tying ``table.tombstones`` and ``table.value.envelope`` to the mode
    (``ConfigError`` naming the key; the loader adds the file)."""
    if tombstones not in TOMBSTONES:
        choices = ", ".join(repr(t) for t in TOMBSTONES)
        raise ConfigError(f"expected one of {choices}, got {tombstones!r}", key="table.tombstones")
    if mode == "append" and tombstones == "delete":
        raise ConfigError(
            'needs mode "upsert": an append table has no row of a key to delete '
            '(use "keep", "ignore" or "dead_letter")',
            key="table.tombstones",
        )
    if mode == "upsert" and tombstones == "keep":
        raise ConfigError(
            'applies to append mode: in upsert mode a tombstone is "delete", "ignore" '
            'or "dead_letter"',
            key="table.tombstones",
        )
    if envelope not in ("none", "debezium"):
        raise ConfigError(
            f"expected 'none' or 'debezium', got {envelope!r}", key="table.value.envelope"
        )
    if envelope == "debezium" and value_format != "json":
        raise ConfigError(
            'needs format "json" (the schema describes the rows in before/after)',
            key="table.value.envelope",
        )
    if envelope == "debezium" and mode != "upsert":
        raise ConfigError(
            'needs mode "upsert": change events update and delete rows by key',
            key="table.value.envelope",
        )
