"""Routes by header or value field, without a broker: which records a table takes
(``ingest.formats.routes.selected``), which tables a topic's records land in
(``Router.tables_for``), and the config's errors."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from ingest.config import parse_config
from ingest.errors import ConfigError
from ingest.formats.routes import route_values, selected
from ingest.sink.deadletter import HEADERS_TYPE
from ingest.sink.table_config import Condition, Router, RowSelect, TableConfig
from ingest.supervisor.wiring import table_router

Header = list[tuple[str, bytes | None]]


def _records(rows: list[tuple[bytes | None, Header | None]]) -> pa.Table:
    headers = [None if h is None else [{"key": k, "value": v} for k, v in h] for _, h in rows]
    return pa.table(
        {
            "value": pa.array([v for v, _ in rows], pa.binary()),
            "headers": pa.array(headers, HEADERS_TYPE),
        }
    )


def test_a_header_condition_reads_the_last_header_of_its_name() -> None:
    records = _records(
        [
            (b"{}", [("type", b"a"), ("type", b"order")]),  # the last one counts
            (b"{}", [("type", b"order"), ("type", b"a")]),
            (b"{}", [("other", b"order")]),
            (b"{}", None),
            (b"{}", []),
            (b"{}", [("type", None)]),
            (b"{}", [("type", b"\xff\xfe")]),  # not UTF-8
            (b"{}", [("type", b"ordered"), ("x", b"y")]),
        ]
    )
    condition = Condition(header="type", field=None, matches="order(ed)?")
    assert route_values(records, condition).to_pylist() == [
        b"order", b"a", None, None, None, None, b"\xff\xfe", b"ordered"
    ]  # fmt: skip
    mask = selected(records, RowSelect(condition)).to_pylist()
    assert mask == [True, False, False, False, False, False, False, True]


def test_a_field_condition_reads_the_value_as_json() -> None:
    values = [
        {"kind": "click"},
        {"kind": 3},
        {"kind": True},
        {"kind": 2.5},
        {"kind": None},
        {"kind": {"nested": "click"}},
        {"other": "click"},
        ["kind", "click"],
    ]
    rows: list[tuple[bytes | None, Header | None]] = [
        (json.dumps(v).encode(), None) for v in values
    ]
    rows += [(b"not json", None), (None, None), (b'{"kind": "clickx"}', None)]
    condition = Condition(header=None, field="kind", matches="click|3|true|2.5")
    assert route_values(_records(rows), condition).to_pylist() == [
        b"click", b"3", b"true", b"2.5", None, None, None, None, None, None, b"clickx"
    ]  # fmt: skip
    mask = selected(_records(rows), RowSelect(condition)).to_pylist()
    assert mask == [True, True, True, True] + [False] * 7


def test_a_table_takes_what_its_condition_passes_and_no_earlier_route_took() -> None:
    records = _records(
        [
            (b'{"kind": "a"}', [("type", b"order")]),
            (b'{"kind": "a"}', None),
            (b'{"kind": "b"}', None),
        ]
    )
    orders = Condition(header="type", field=None, matches="order")
    kind_a = Condition(header=None, field="kind", matches="a")
    assert selected(records, RowSelect(orders)).to_pylist() == [True, False, False]
    assert selected(records, RowSelect(kind_a, (orders,))).to_pylist() == [False, True, False]
    rest = RowSelect(None, (orders, kind_a))
    assert selected(records, rest).to_pylist() == [False, False, True]
    assert selected(records.slice(0, 0), rest).to_pylist() == []


def _table(uri: str) -> TableConfig:
    return TableConfig(uri=uri, group="g")


def test_the_tables_of_a_topic() -> None:
    orders = Condition(header="type", field=None, matches="order")
    kind = Condition(header=None, field="kind", matches="a")
    router = Router(
        _table("/lake/default"),
        (
            ("shop", _table("/lake/orders"), orders),
            ("shop|misc", _table("/lake/{topic}_a"), kind),
            ("misc", _table("/lake/misc"), None),
        ),
    )
    shop = router.tables_for("shop")
    assert [t.uri for t in shop] == ["/lake/orders", "/lake/shop_a", "/lake/default"]
    assert [t.select for t in shop] == [
        RowSelect(orders),
        RowSelect(kind, (orders,)),
        RowSelect(None, (orders, kind)),
    ]
    assert shop[2].refuse == "no [[route]] matches this record of topic 'shop'"
    assert [t.refuse for t in shop[:2]] == [None, None]
    # An unconditional route ends the list: no dead letters for the rest.
    misc = router.tables_for("misc")
    assert [(t.uri, t.select, t.refuse) for t in misc] == [
        ("/lake/misc_a", RowSelect(kind), None),
        ("/lake/misc", RowSelect(None, (kind,)), None),
    ]
    # A topic no route names: every record a dead letter, as with routes by topic.
    (other,) = router.tables_for("other")
    assert (other.uri, other.select, other.refuse) == (
        "/lake/default",
        None,
        "no [[route]] matches topic 'other'",
    )
    assert router.for_topic("shop").uri == "/lake/orders"


def test_two_routes_of_one_topic_to_one_table_are_refused() -> None:
    orders = Condition(header="type", field=None, matches="order")
    router = Router(
        _table("/lake/default"),
        (("shop", _table("/lake/t"), orders), ("shop", _table("/lake/t/"), None)),
    )
    with pytest.raises(ConfigError, match="two \\[\\[route\\]\\]s send records of topic 'shop'"):
        router.tables_for("shop")
    clash = Router(_table("/lake/default"), (("shop", _table("/lake/default"), orders),))
    with pytest.raises(ConfigError, match="to the table /lake/default"):
        clash.tables_for("shop")


BASE = """
[kafka]
bootstrap_servers = ["127.0.0.1:9092"]

[source]
topics = ["events"]
group_id = "g"

[table]
uri = "/lake/default"

[[route]]
topics = "events"
uri = "/lake/orders"
"""


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            'header = "type"\nfield = "kind"\nmatches = "a"',
            "conf/x.toml: route[0].field: a route goes by a header or by a value field, not both",
        ),
        (
            'header = "type"',
            "conf/x.toml: route[0].matches: a route by header needs the regular expression "
            "its value matches",
        ),
        (
            'matches = "a"',
            "conf/x.toml: route[0].matches: applies to a route by header or field (set one of "
            "them)",
        ),
        (
            'field = "kind"\nmatches = "("',
            "conf/x.toml: route[0].matches: not a regular expression: missing ), unterminated "
            "subpattern at position 0",
        ),
    ],
)
def test_route_conditions_are_checked(extra: str, message: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_config(BASE + extra + "\n", path="conf/x.toml", env={})
    assert str(excinfo.value) == message


def test_a_route_by_field_in_the_config() -> None:
    config = parse_config(BASE + 'field = "kind"\nmatches = "a|b"\n', path="conf/x.toml", env={})
    (_, table, condition) = table_router(config).routes[0]
    assert condition == Condition(header=None, field="kind", matches="a|b")
    assert table.uri == "/lake/orders"
