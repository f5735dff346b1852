"""Tables by name (``table.name``) through a real Hive metastore (``ingest.testing.metastore``):
``ingest`` resolves the name through Spark's catalog, creates a new table as Spark registers
one (managed, or external at ``table.uri``), registers its dead letters beside it, and
appends to a table the catalog already holds; Spark then reads and writes it by name.

Every ``ingest`` command runs as the CLI in its own process (its own JVM, the metastore's
client), and Spark reads back from another (``catalog_probe``): the suite's shared session
has an in-memory catalog.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from ingest.testing import HiveMetastore, KafkaCluster, ProducedRecord, create_topic, produce
from tests.runtime.support import ROOT, Cli, status_json, write_config

pytestmark = pytest.mark.spark

SCHEMA = "id BIGINT, v STRING"
RUN_TIMEOUT = 240.0


def _name(prefix: str) -> str:
    """A name a Hive metastore takes for a database, table or (here) topic."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def _records(start: int, count: int, *, bad: int = 0) -> list[ProducedRecord]:
    """JSON rows ``{"id": n, "v": "v<n>"}`` on partitions n % 2, then ``bad`` values that
    are not JSON (dead letters)."""
    good = [
        ProducedRecord(json.dumps({"id": n, "v": f"v{n}"}).encode(), partition=n % 2)
        for n in range(start, start + count)
    ]
    return good + [ProducedRecord(b"not json", partition=n % 2) for n in range(bad)]


def _topic(broker: KafkaCluster, records: list[ProducedRecord], name: str | None = None) -> str:
    topic = name or _name("t")
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(broker.bootstrap, topic, records)
    return topic


def _probe(metastore: HiveMetastore, *statements: str) -> list[list[dict[str, Any]]]:
    """Each statement's rows, from a Spark session whose catalog is ``metastore``."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.delta.catalog_probe",
            metastore.uri,
            str(metastore.warehouse),
            *statements,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    answers: list[list[dict[str, Any]]] = json.loads(lines[-1].removeprefix("PROBE "))
    return answers


def _described(rows: list[dict[str, Any]]) -> dict[str, str]:
    """DESCRIBE TABLE EXTENDED's detail rows (Type, Location, Provider...)."""
    return {str(r["col_name"]): str(r["data_type"]) for r in rows}


def _config(
    tmp_path: Path,
    broker: KafkaCluster,
    metastore: HiveMetastore,
    topics: list[str],
    table: Mapping[str, Any],
    label: str,
    group: str | None = None,
) -> Path:
    path = write_config(
        tmp_path / f"{label}.toml",
        bootstrap=broker.bootstrap,
        topic=topics[0],
        group=group or _name("g"),
        table=None,
        sections={
            "source": {"topics": topics},
            "table": dict(table),
            "table.value": {"format": "json", "schema": SCHEMA},
            # No class-data archive: each session's conf (the metastore's port) is new, and
            # recording one costs its JVM ~13 s at exit.
            "spark": {"conf": metastore.spark_conf, "class_data_sharing": False},
            "maintenance": {"enabled": False},
        },
    )
    return path


def _ingest(path: Path, tmp_path: Path, label: str, *args: str) -> tuple[int, str]:
    cli = Cli([*args, "--config", str(path)], tmp_path / f"{label}.log")
    code = cli.wait(RUN_TIMEOUT)
    return code, cli.text()


def _offsets(uri: Path) -> list[tuple[int, int]]:
    table = DeltaTable(str(uri)).to_pyarrow_table(columns=["partition", "offset"])
    return list(
        zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True)
    )


def _assert_once(table: Path, dead: Path, ends: Mapping[int, int], *, dead_letters: int) -> None:
    """Each offset below ``ends`` is a row of the table or a dead letter, exactly once."""
    rows, letters = _offsets(table), _offsets(dead)
    assert len(letters) == dead_letters, letters
    expected = [(p, o) for p, end in ends.items() for o in range(end)]
    assert sorted(rows + letters) == sorted(expected)


def _location(described: Mapping[str, str]) -> str:
    return described["Location"].removeprefix("file:")


@pytest.fixture(scope="module")
def database(hive_metastore: HiveMetastore) -> Iterator[str]:
    """One database for the module (each test names tables of its own in it)."""
    name = _name("lake")
    _probe(hive_metastore, f"CREATE DATABASE {name}")
    yield name


def test_a_new_table_by_name_is_created_managed_and_written_by_both(
    broker: KafkaCluster, hive_metastore: HiveMetastore, database: str, tmp_path: Path
) -> None:
    topic = _topic(broker, _records(0, 200, bad=3))
    name = f"{database}.events"
    path = _config(tmp_path, broker, hive_metastore, [topic], {"name": name}, "managed")

    # (A later run finding a table by name and appending only the new records is
    # test_an_external_table_by_name_and_a_table_per_topic's "by-name" run.)
    code, log = _ingest(path, tmp_path, "first", "run", "--until-end")
    assert code == 0, log[-4000:]
    expected = hive_metastore.warehouse / f"{database}.db" / "events"
    dead_path = expected.with_name("events_dead_letters")
    _assert_once(expected, dead_path, {0: 102, 1: 101}, dead_letters=3)
    status = status_json(path)
    assert status["table"]["uri"] == str(expected), status["table"]

    # Registered as Spark registers a table it creates: managed, in its database's place,
    # the dead letters beside it; Spark writes by name after ingest, and reads every row.
    detail, dead, history, _, counted = _probe(
        hive_metastore,
        f"DESCRIBE TABLE EXTENDED {name}",
        f"DESCRIBE TABLE EXTENDED {name}_dead_letters",
        f"DESCRIBE HISTORY {name}",
        f"INSERT INTO {name} SELECT * FROM {name} WHERE `partition` = 0 AND `offset` = 0",
        f"SELECT count(*) AS n, count(DISTINCT id) AS ids FROM {name}",
    )
    table, dead_letters = _described(detail), _described(dead)
    assert (table["Type"], table["Provider"]) == ("MANAGED", "delta"), table
    assert Path(_location(table)) == expected
    assert (dead_letters["Type"], Path(_location(dead_letters))) == ("MANAGED", dead_path)
    operations = [h["operation"] for h in sorted(history, key=lambda h: int(h["version"]))]
    assert operations[0] == "CREATE TABLE" and len(operations) >= 2, operations
    assert set(operations[1:]) == {"WRITE"}, operations
    assert counted == [{"n": 201, "ids": 200}]


def test_an_external_table_by_name_and_a_table_per_topic(
    broker: KafkaCluster, hive_metastore: HiveMetastore, database: str, tmp_path: Path
) -> None:
    topic, group = _topic(broker, _records(0, 60)), _name("g")
    name, external = f"{database}.ext", tmp_path / "ext"
    # Hadoop's spelling of the location (a catalog's): one table, one set of txn app ids.
    by_uri = {"name": name, "uri": f"file:{external}/"}
    path = _config(tmp_path, broker, hive_metastore, [topic], by_uri, "external", group)
    code, log = _ingest(path, tmp_path, "external", "run", "--until-end")
    assert code == 0, log[-4000:]

    # The name now holds that table: another uri for it is refused before anything is written.
    elsewhere = {"name": name, "uri": str(tmp_path / "elsewhere")}
    path = _config(tmp_path, broker, hive_metastore, [topic], elsewhere, "elsewhere")
    code, log = _ingest(path, tmp_path, "elsewhere", "run", "--until-end")
    assert code == 2, log[-4000:]
    assert f"{name} is the table at {external}, not {tmp_path / 'elsewhere'}" in log
    assert not (tmp_path / "elsewhere").exists()

    # By name alone, the group's next run appends to it.
    produce(broker.bootstrap, topic, _records(60, 40))
    path = _config(tmp_path, broker, hive_metastore, [topic], {"name": name}, "by-name", group)
    code, log = _ingest(path, tmp_path, "by-name", "run", "--until-end")
    assert code == 0, log[-4000:]
    _assert_once(external, Path(f"{external}_dead_letters"), {0: 50, 1: 50}, dead_letters=0)

    # "{topic}": each topic's own table, managed in the database.
    counts = {_name("orders"): 30, _name("payments"): 20}
    topics = [_topic(broker, _records(0, n), t) for t, n in counts.items()]
    per_topic = {"name": f"{database}.{{topic}}"}
    path = _config(tmp_path, broker, hive_metastore, topics, per_topic, "per-topic")
    code, log = _ingest(path, tmp_path, "per-topic", "run", "--until-end")
    assert code == 0, log[-4000:]
    names = [name, *(f"{database}.{t}" for t in topics)]
    described = _probe(hive_metastore, *(f"DESCRIBE TABLE EXTENDED {n}" for n in names))
    ext, *mine = (_described(rows) for rows in described)
    assert (ext["Type"], Path(_location(ext))) == ("EXTERNAL", external)
    for t, detail in zip(topics, mine, strict=True):
        place = hive_metastore.warehouse / f"{database}.db" / t
        assert (detail["Type"], Path(_location(detail))) == ("MANAGED", place)
        ends = {0: (counts[t] + 1) // 2, 1: counts[t] // 2}
        _assert_once(place, Path(f"{place}_dead_letters"), ends, dead_letters=0)


def test_routes_by_name(
    broker: KafkaCluster, hive_metastore: HiveMetastore, database: str, tmp_path: Path
) -> None:
    """[[route]]s name their tables: a fixed name (created managed, its dead letters named
    beside it), ``{topic}`` (a managed table per topic) and a name with a uri (external
    there). The default table, unnamed, takes none: every topic has its route."""
    from ingest.testing.configs import toml_value

    orders, pay, refunds = _name("orders"), _name("pay"), _name("refunds")
    counts = {orders: 40, pay: 30, refunds: 20}
    for topic, count in counts.items():
        _topic(broker, _records(0, count, bad=2 if topic == orders else 0), topic)
    external = tmp_path / "refunds"
    routes = [
        {"topics": orders, "name": f"{database}.orders_routed"},
        {"topics": "pay_.*", "name": f"{database}.{{topic}}"},
        {"topics": refunds, "name": f"{database}.refunds_routed", "uri": str(external)},
    ]
    default = tmp_path / "default"
    path = _config(tmp_path, broker, hive_metastore, list(counts), {"uri": str(default)}, "routes")
    with path.open("a") as toml:
        for route in routes:
            toml.write("\n[[route]]\n")
            toml.writelines(f"{key} = {toml_value(value)}\n" for key, value in route.items())
    code, log = _ingest(path, tmp_path, "routes", "run", "--until-end")
    assert code == 0, log[-4000:]

    warehouse = hive_metastore.warehouse / f"{database}.db"
    places = {
        orders: (f"{database}.orders_routed", warehouse / "orders_routed", "MANAGED"),
        pay: (f"{database}.{pay}", warehouse / pay, "MANAGED"),
        refunds: (f"{database}.refunds_routed", external, "EXTERNAL"),
    }
    names = [name for name, _, _ in places.values()] + [f"{database}.orders_routed_dead_letters"]
    described = _probe(hive_metastore, *(f"DESCRIBE TABLE EXTENDED {n}" for n in names))
    *tables, dead = (_described(rows) for rows in described)
    for (topic, (_, place, kind)), detail in zip(places.items(), tables, strict=True):
        assert (detail["Type"], Path(_location(detail))) == (kind, place), topic
        count, bad = counts[topic], 2 if topic == orders else 0
        ends = {0: (count + 1) // 2 + bad // 2, 1: count // 2 + bad // 2}
        _assert_once(place, Path(f"{place}_dead_letters"), ends, dead_letters=bad)
    dead_place = warehouse / "orders_routed_dead_letters"
    assert (dead["Type"], Path(_location(dead))) == ("MANAGED", dead_place)
    assert not default.exists(), "the default table took a routed topic"
