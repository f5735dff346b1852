"""A topic name is data from the cluster: a ``{topic}`` table never renders outside its
template's place, onto the place itself, or onto another topic's dead-letter table."""

from __future__ import annotations

import pytest

from ingest.errors import ConfigError
from ingest.protocol.partition import topic_name_problem
from ingest.sink.table_config import TableConfig

TEMPLATE = "/lake/raw/{topic}"


@pytest.mark.parametrize(
    "topic",
    [
        "..",  # /lake/raw/.. is /lake: outside the template's place
        ".",  # /lake/raw/. is the place itself, which would hold every other table
        "a/b",
        "",
        "x" * 250,
        "caf\u00e9",
        "orders\n",
    ],
)
def test_a_name_kafka_would_refuse_names_no_table(topic: str) -> None:
    assert topic_name_problem(topic) is not None
    with pytest.raises(ConfigError) as info:
        TableConfig(uri=TEMPLATE, group="g").for_topic(topic)
    assert "not a topic name Kafka allows" in str(info.value)


def test_a_topic_whose_table_is_another_topics_dead_letters_is_refused() -> None:
    table = TableConfig(uri=TEMPLATE, group="g")
    with pytest.raises(ConfigError) as info:
        table.for_topic("orders_dead_letters")
    assert "dead-letter table of topic 'orders'" in str(info.value)
    # Kafka's own names, including dots and dashes, render as before.
    for topic in ("orders", "v1.orders-eu", "x" * 249):
        rendered = table.for_topic(topic)
        assert rendered.uri == f"/lake/raw/{topic}"
        assert rendered.dead_letters == f"/lake/raw/{topic}_dead_letters"


def test_dead_letters_in_a_place_of_their_own_let_any_kafka_name_through() -> None:
    table = TableConfig(uri=TEMPLATE, group="g", dead_letter_uri="/lake/dlq/{topic}")
    rendered = table.for_topic("orders_dead_letters")
    assert rendered.uri == "/lake/raw/orders_dead_letters"
    assert rendered.dead_letters == "/lake/dlq/orders_dead_letters"


def test_a_table_by_name_takes_topics_a_catalog_names_a_table_by() -> None:
    table = TableConfig(
        uri=TEMPLATE, group="g", name="raw.{topic}", dead_letter_name="raw.{topic}_dead_letters"
    )
    rendered = table.for_topic("orders_v2")
    assert (rendered.name, rendered.dead_letter_name) == (
        "raw.orders_v2",
        "raw.orders_v2_dead_letters",
    )
    assert rendered.uri == "/lake/raw/orders_v2"
    # A Hive metastore folds case and takes letters, digits and _ only.
    for topic in ("Orders", "orders-eu", "v1.orders"):
        with pytest.raises(ConfigError, match="cannot name a table in the catalog"):
            table.for_topic(topic)
