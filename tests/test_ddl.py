"""Spark DDL schemas are checked at load without a JVM (ingest/ddl.py), and agree with
Spark's own parser."""

from __future__ import annotations

from typing import Any

import pytest

from ingest.ddl import check_ddl, field_names
from ingest.errors import ConfigError

ACCEPTED = [
    ("a BIGINT, b STRING", ["a", "b"]),
    ("id long, ts timestamp, day date, price decimal(10, 2), ok boolean", None),
    ("a: INT, b: ARRAY<STRING>, c: MAP<STRING, DOUBLE>", ["a", "b", "c"]),
    ("STRUCT<a: INT, b: STRUCT<c: BINARY, d: ARRAY<DECIMAL(38,0)>>>", ["a", "b"]),
    ("a INT NOT NULL COMMENT 'the key', `odd name` TIMESTAMP_NTZ", ["a", "odd name"]),
    ("`we``ird` STRING", ["we`ird"]),
    ("1a INT", ["1a"]),
    ("a VARCHAR(10), b CHAR(2), c TINYINT, d SMALLINT, e FLOAT, f DOUBLE", None),
    ("a INTERVAL DAY TO SECOND, b INTERVAL YEAR", None),
]
REFUSED = [
    ("id BIGINTT, v STRING", "unknown type 'BIGINTT'", "column 4"),
    ("a INT,", "unexpected end", "column 7"),
    ("a ARRAY<INT", "expected '>'", ""),
    ("a MAP<STRING>", "expected ','", ""),
    ("a DECIMAL(40, 2)", "out of range", ""),
    ("a VARCHAR", "expected '('", ""),
    ("a INT b INT", "unexpected 'b'", ""),
    ("a INT; DROP TABLE x", "unexpected ';'", ""),
    ("a INT, , b INT", "expected a field name", ""),
]


@pytest.mark.parametrize(("ddl", "names"), ACCEPTED)
def test_spark_ddl_field_lists_are_accepted(ddl: str, names: list[str] | None) -> None:
    got = field_names(ddl)
    if names is not None:
        assert got == names


@pytest.mark.parametrize(("ddl", "says", "where"), REFUSED)
def test_a_bad_schema_says_what_and_where(ddl: str, says: str, where: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_ddl(ddl)
    assert says in str(info.value) and where in str(info.value)


def test_an_empty_schema_is_refused_although_spark_parses_it() -> None:
    # StructType.fromDDL("") is an empty struct; the job needs fields.
    with pytest.raises(ConfigError, match="empty"):
        check_ddl("  ")


@pytest.mark.spark
def test_the_verdicts_agree_with_sparks_parser(spark: Any) -> None:
    from pyspark.sql.types import StructType

    for ddl, _ in ACCEPTED:
        assert isinstance(StructType.fromDDL(ddl), StructType), ddl
    for ddl, _, _ in REFUSED:
        with pytest.raises(Exception):  # noqa: B017 - Spark raises its own parse errors
            StructType.fromDDL(ddl)
