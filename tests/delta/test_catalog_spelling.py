"""How ``ingest/engines/spark/catalog.py`` spells what it hands Spark SQL and compares: no
JVM needed (the catalog itself is tested against a real metastore in
``test_tables_by_name.py``)."""

from __future__ import annotations

import pytest

from ingest.engines.spark.catalog import _literal, _quoted, _session_catalog, same_location

pytestmark = pytest.mark.quick


def test_a_catalog_location_and_a_configured_uri_of_one_table_are_the_same_location() -> None:
    assert same_location("file:/lake/db.db/events", "/lake/db.db/events/")
    assert same_location("file:///lake/t", "/lake/t")
    assert same_location("s3a://bucket/lake/t/", "s3://bucket/lake/t")
    assert not same_location("/lake/t", "/lake/t2")
    assert not same_location("s3://bucket/t", "s3://other/t")


def test_names_and_uris_reach_spark_sql_quoted() -> None:
    assert _quoted("lake.events") == "`lake`.`events`"
    assert _quoted("a`b.c") == "`a``b`.`c`"
    # A uri is free text: a quote or backslash in it stays inside the literal.
    assert _literal("/lake/o'clock") == r"'/lake/o\'clock'"
    assert _literal("/lake/a\\' OR 1=1") == r"'/lake/a\\\' OR 1=1'"


@pytest.mark.parametrize(
    ("name", "session"),
    [
        ("events", True),
        ("lake.events", True),
        ("spark_catalog.lake.events", True),
        ("SPARK_CATALOG.lake.events", True),
        ("unity.lake.events", False),
    ],
)
def test_three_part_names_outside_the_session_catalog_are_told_apart(
    name: str, session: bool
) -> None:
    assert _session_catalog(name) is session
