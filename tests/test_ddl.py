"""Spark DDL schemas are checked at load without a JVM (ingest/ddl.py), and agree with
Spark's own parser."""

from __future__ import annotations

from typing import Any

import pytest

from ingest.ddl import arrow_schema, check_ddl, field_names
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


# Field lists whose Arrow form ingest/ddl.py claims, and those it leaves to Spark (None).
ARROW = [
    *(ddl for ddl, _ in ACCEPTED[:4]),
    "`odd name` TIMESTAMP_NTZ NOT NULL, t TIMESTAMP, l TIMESTAMP_LTZ, v VOID",
    "a ARRAY<ARRAY<DECIMAL>>, m MAP<BIGINT, ARRAY<STRUCT<x: DATE NOT NULL>>>",
    "c TINYINT, d SMALLINT, e FLOAT, f DOUBLE, g REAL, h BYTE, i SHORT, j LONG, k INTEGER",
    "a INTERVAL DAY TO SECOND, b INTERVAL HOUR, c BINARY, d BOOLEAN",
]
NOT_CLAIMED = [
    "a VARCHAR(10)",
    "b CHAR(2), c INT",
    "a INT COMMENT 'the key'",
    "s STRUCT<a: INT COMMENT 'x'>",
    "b INTERVAL YEAR TO MONTH",
    "v VARIANT",
]


def test_the_arrow_form_is_claimed_only_where_it_is_known() -> None:
    for ddl in ARROW:
        assert arrow_schema(ddl) is not None, ddl
    for ddl in NOT_CLAIMED:
        assert arrow_schema(ddl) is None, ddl


@pytest.mark.spark
def test_the_arrow_schema_is_the_one_spark_makes(spark: Any) -> None:
    # The local engine decodes JSON into this schema without a JVM; Spark's conversion,
    # as the job's decode_spec runs it, is the reference.
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    for ddl in ARROW:
        expected = to_arrow_schema(StructType.fromDDL(ddl), timezone="UTC")
        assert arrow_schema(ddl) == expected, ddl
