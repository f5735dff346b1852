"""Spark DDL schemas (``table.value.schema``), checked without a JVM.

``load_config`` calls :func:`check_ddl` so a misspelled type fails at load, naming the file
and the key, in well under a second, instead of after Spark has started. Spark stays the
final authority (``StructType.fromDDL`` in the job); this is its grammar for a field list::

    fields  := field ("," field)*
    field   := name [":"] type ["NOT" "NULL"] ["COMMENT" 'text']
    name    := identifier | `quoted identifier`
    type    := BOOLEAN | TINYINT | BYTE | SMALLINT | SHORT | INT | INTEGER | BIGINT | LONG
             | FLOAT | REAL | DOUBLE | DATE | TIMESTAMP | TIMESTAMP_NTZ | TIMESTAMP_LTZ
             | STRING | BINARY | VOID | VARIANT
             | (DECIMAL | DEC | NUMERIC) ["(" p ["," s] ")"] | (CHAR | VARCHAR) "(" n ")"
             | INTERVAL unit [TO unit]
             | ARRAY "<" type ">" | MAP "<" type "," type ">"
             | STRUCT "<" [field ("," field)*] ">"

:func:`arrow_schema` gives the Arrow schema Spark's own conversion gives
(``to_arrow_schema(StructType.fromDDL(ddl), timezone="UTC")``, checked equal in
``tests/test_ddl.py``), or None for the types whose Arrow form this module does not claim
to match (CHAR/VARCHAR, VARIANT, year-month intervals, comments): batches of such a schema
run on Spark, whose parser decides.

A whole ``STRUCT<...>`` is accepted too. Keywords are case-insensitive; a name may start with
a digit (``1a``), as in Spark. Like Spark's parser, this one does not refuse repeated field
names. Unlike it, an empty list is refused: the job needs fields.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

from ingest.errors import ConfigError

__all__ = ["arrow_schema", "check_ddl", "field_names"]

SIMPLE_TYPES = frozenset(
    [
        "BOOLEAN",
        "TINYINT",
        "BYTE",
        "SMALLINT",
        "SHORT",
        "INT",
        "INTEGER",
        "BIGINT",
        "LONG",
        "FLOAT",
        "REAL",
        "DOUBLE",
        "DATE",
        "TIMESTAMP",
        "TIMESTAMP_NTZ",
        "TIMESTAMP_LTZ",
        "STRING",
        "BINARY",
        "VOID",
        "VARIANT",
    ]
)
DECIMALS = frozenset({"DECIMAL", "DEC", "NUMERIC"})
INTERVAL_UNITS = frozenset({"YEAR", "MONTH", "DAY", "HOUR", "MINUTE", "SECOND"})
# Spark's Arrow form of each simple type (pyspark.sql.pandas.types.to_arrow_type, UTC);
# absent: no Arrow form claimed here.
_ARROW: dict[str, pa.DataType] = {
    "BOOLEAN": pa.bool_(),
    "TINYINT": pa.int8(),
    "BYTE": pa.int8(),
    "SMALLINT": pa.int16(),
    "SHORT": pa.int16(),
    "INT": pa.int32(),
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "LONG": pa.int64(),
    "FLOAT": pa.float32(),
    "REAL": pa.float32(),
    "DOUBLE": pa.float64(),
    "DATE": pa.date32(),
    "TIMESTAMP": pa.timestamp("us", tz="UTC"),
    "TIMESTAMP_LTZ": pa.timestamp("us", tz="UTC"),
    "TIMESTAMP_NTZ": pa.timestamp("us"),
    "STRING": pa.string(),
    "BINARY": pa.binary(),
    "VOID": pa.null(),
}
_DAY_TIME_UNITS = frozenset({"DAY", "HOUR", "MINUTE", "SECOND"})
KNOWN = sorted(SIMPLE_TYPES | DECIMALS | {"CHAR", "VARCHAR", "INTERVAL", "ARRAY", "MAP", "STRUCT"})

_TOKEN = re.compile(
    r"\s*(?:(?P<quoted>`(?:[^`]|``)*`)|(?P<word>[A-Za-z0-9_]*[A-Za-z_][A-Za-z0-9_]*)|(?P<number>\d+)"
    r"|(?P<string>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")|(?P<punct>[<>(),:]))"
)


@dataclass(frozen=True)
class _Field:
    name: str
    type: pa.DataType | None  # None: no Arrow form claimed
    nullable: bool
    comment: bool


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []
        position = 0
        while position < len(text):
            if text[position:].strip() == "":
                break
            match = _TOKEN.match(text, position)
            if match is None or match.lastgroup is None:
                start = len(text) - len(text[position:].lstrip())
                raise self.error(f"unexpected {text[start]!r}", start)
            start = match.start(match.lastgroup)
            self.tokens.append((match.lastgroup, match.group(match.lastgroup), start))
            position = match.end()
        self.index = 0

    def error(self, message: str, column: int | None = None) -> ConfigError:
        if column is None:
            column = self.tokens[self.index][2] if self.index < len(self.tokens) else len(self.text)
        return ConfigError(f"not a Spark DDL schema: {message} at column {column + 1}")

    def peek(self) -> tuple[str, str] | None:
        if self.index >= len(self.tokens):
            return None
        kind, value, _ = self.tokens[self.index]
        return kind, value

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise self.error("unexpected end")
        self.index += 1
        return token

    def keyword(self, *words: str) -> bool:
        token = self.peek()
        if token is not None and token[0] == "word" and token[1].upper() in words:
            self.index += 1
            return True
        return False

    def expect(self, punct: str) -> None:
        token = self.peek()
        if token != ("punct", punct):
            found = "the end" if token is None else repr(token[1])
            raise self.error(f"expected {punct!r}, found {found}")
        self.index += 1

    def number(self) -> int:
        kind, value = self.take()
        if kind != "number":
            self.index -= 1
            raise self.error(f"expected a number, found {value!r}")
        return int(value)

    def fields(self, closing: str | None) -> list[_Field]:
        found: list[_Field] = []
        if closing is not None and self.peek() == ("punct", closing):
            return found
        while True:
            found.append(self.field())
            if self.peek() == ("punct", ","):
                self.index += 1
                continue
            return found

    def field(self) -> _Field:
        kind, value = self.take()
        if kind == "quoted":
            name = value[1:-1].replace("``", "`")
        elif kind == "word":
            name = value
        else:
            self.index -= 1
            raise self.error(f"expected a field name, found {value!r}")
        if self.peek() == ("punct", ":"):
            self.index += 1
        arrow = self.type()
        nullable = True
        if self.keyword("NOT"):
            if not self.keyword("NULL"):
                raise self.error("expected NULL after NOT")
            nullable = False
        comment = self.keyword("COMMENT")
        if comment:
            kind, value = self.take()
            if kind != "string":
                self.index -= 1
                raise self.error("expected a quoted comment")
        return _Field(name, arrow, nullable, comment)

    def type(self) -> pa.DataType | None:
        kind, value = self.take()
        word = value.upper()
        if kind != "word":
            self.index -= 1
            raise self.error(f"expected a type, found {value!r}")
        if word in SIMPLE_TYPES:
            return _ARROW.get(word)
        if word in DECIMALS:
            precision, scale = 10, 0  # Spark's DECIMAL without arguments
            if self.peek() == ("punct", "("):
                self.index += 1
                precision = self.number()
                scale = 0
                if self.peek() == ("punct", ","):
                    self.index += 1
                    scale = self.number()
                self.expect(")")
                if not 1 <= precision <= 38 or scale > precision:
                    raise self.error(f"DECIMAL({precision}, {scale}) is out of range")
            return pa.decimal128(precision, scale)
        if word in ("CHAR", "VARCHAR"):
            self.expect("(")
            self.number()
            self.expect(")")
            return None
        if word == "INTERVAL":
            units = []
            if not self.keyword(*INTERVAL_UNITS):
                raise self.error("expected an interval unit (YEAR ... SECOND)")
            units.append(self.tokens[self.index - 1][1].upper())
            if self.keyword("TO"):
                if not self.keyword(*INTERVAL_UNITS):
                    raise self.error("expected an interval unit after TO")
                units.append(self.tokens[self.index - 1][1].upper())
            return pa.duration("us") if set(units) <= _DAY_TIME_UNITS else None
        if word == "ARRAY":
            self.expect("<")
            element = self.type()
            self.expect(">")
            return None if element is None else pa.list_(pa.field("element", element))
        if word == "MAP":
            self.expect("<")
            key = self.type()
            self.expect(",")
            item = self.type()
            self.expect(">")
            if key is None or item is None:
                return None
            return pa.map_(pa.field("key", key, nullable=False), pa.field("value", item))
        if word == "STRUCT":
            self.expect("<")
            members = self.fields(">")
            self.expect(">")
            return _struct(members)
        self.index -= 1
        raise self.error(f"unknown type {value!r} (known: {', '.join(KNOWN)})")


def _struct(members: list[_Field]) -> pa.DataType | None:
    if any(m.type is None or m.comment for m in members):
        return None
    return pa.struct([pa.field(m.name, m.type, nullable=m.nullable) for m in members])


def _fields(ddl: str) -> list[_Field]:
    parser = _Parser(ddl)
    if not parser.tokens:
        raise ConfigError("not a Spark DDL schema: it is empty; expected 'name TYPE, ...'")
    kinds = [(kind, value.upper()) for kind, value, _ in parser.tokens[:2]]
    if kinds == [("word", "STRUCT"), ("punct", "<")]:
        parser.index = 2
        names = parser.fields(">")
        parser.expect(">")
    else:
        names = parser.fields(None)
    rest = parser.peek()
    if rest is not None:
        raise parser.error(f"unexpected {rest[1]!r}")
    return names


def field_names(ddl: str) -> list[str]:
    """The top-level field names of a Spark DDL field list; raises ConfigError (no path or
    key: the caller adds them) when Spark would refuse it."""
    return [member.name for member in _fields(ddl)]


def arrow_schema(ddl: str) -> pa.Schema | None:
    """The Arrow schema Spark makes of ``ddl`` (UTC timestamps), or None when the field
    list holds a type whose Arrow form is not claimed here (then Spark must parse it);
    raises ConfigError as ``check_ddl``."""
    members = _fields(ddl)
    if any(m.type is None or m.comment for m in members):
        return None
    return pa.schema([pa.field(m.name, m.type, nullable=m.nullable) for m in members])


def check_ddl(ddl: str) -> None:
    """Raises ConfigError when ``ddl`` is not a field list Spark would accept."""
    field_names(ddl)
