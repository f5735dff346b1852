"""The TOML config: every bad input gets an error naming the file and the key."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.config import (
    load_config,
    offsets_topic_partition,
    parse_config,
    parse_duration,
    parse_size,
    render_config,
)
from ingest.errors import ConfigError
from ingest.redaction import secret_looking
from ingest.supervisor.wiring import client_config

MINIMAL = """
[kafka]
bootstrap_servers = ["127.0.0.1:9092"]

[source]
topics = ["events"]
group_id = "ingest-events"

[table]
uri = "/tmp/events"
"""

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def _parse(text: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return parse_config(text, path="conf/x.toml", env=env or {})


def test_a_minimal_config_takes_the_defaults() -> None:
    config = _parse(MINIMAL)
    assert config.trigger.max_bytes == 1024**3
    assert config.handoff.mode == "shm"
    assert config.dead_letter_uri() == "/tmp/events_dead_letters"
    assert client_config(config).bootstrap_servers == ("127.0.0.1:9092",)


def test_the_issue_example_message() -> None:
    with pytest.raises(ConfigError) as excinfo:
        _parse(MINIMAL + '\n[trigger]\nmax_bytes = "abc"\n')
    assert str(excinfo.value) == 'conf/x.toml: trigger.max_bytes: expected a size like "256MiB"'


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("[trigger]\nmax_bytse = 1", "conf/x.toml: trigger.max_bytse: unknown key"),
        ('[trigger]\nmax_records = "many"', "trigger.max_records: expected an integer"),
        ('[trigger]\nmax_age = "soon"', 'trigger.max_age: expected a duration like "30s"'),
        ('[handoff]\nmode = "tape"', "handoff.mode: expected one of 'shm', 'files'"),
        ('[fetch]\ncheck_crc = "yes"', "fetch.check_crc: expected true or false"),
        ("[surprise]\nx = 1", "conf/x.toml: surprise: unknown key"),
        (
            '[[route]]\ntopics = "e.*"\nbogus = 1',
            "conf/x.toml: route[0].bogus: unknown key (known here: field, header, key, "
            "matches, merge_keys, mode, name, partition_by, properties, tombstones, topics, uri, value)",
        ),
        ('[handoff]\nmode = "files"', 'handoff.root: mode "files" needs a root'),
        (
            '[table.transform_tables]\ncustomers = "/lake/customers"',
            "conf/x.toml: table.transform_tables: names tables for a transform, but "
            "table.transform is not set",
        ),
        (
            '[table.transform_tables]\n"1st" = "/lake/customers"',
            "conf/x.toml: table.transform_tables.1st: a view name is letters",
        ),
        (
            '[table.transform_tables]\nbatch = "/lake/customers"',
            "table.transform_tables.batch: a view name is letters, digits and _, not "
            "starting with a digit, and not `batch`",
        ),
        (
            '[table.transform_tables]\nc = "/lake/`x`"',
            "table.transform_tables.c: must be a Delta table's URI (no backquote)",
        ),
        ('[table.transform_tables]\nBatch = "/lake/x"', "table.transform_tables.Batch: a view"),
        ('[table.transform_tables]\nc = " "', "table.transform_tables.c: must be a Delta table"),
        (
            '[spark]\nmaster = "mesos://m:5050"',
            "conf/x.toml: spark.master: expected a Spark master URL (local, local[N], local[*], "
            "local[N,F], local-cluster[N,C,M], spark://host:port, yarn, k8s://...), got "
            "'mesos://m:5050'",
        ),
    ],
)
def test_bad_values_name_the_file_and_the_key(extra: str, message: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        _parse(MINIMAL + "\n" + extra + "\n")
    assert message in str(excinfo.value)


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ('[dead_letter]\nuri = "gs:/lake/dead"', "dead_letter.uri"),
        ('[handoff]\nmode = "files"\nroot = "s3a:/handoff"', "handoff.root"),
        ('[[route]]\ntopics = "x"\nuri = "abfss:/c@a/t"', "route[0].uri"),
    ],
)
def test_a_uri_with_one_slash_after_its_scheme_is_refused(extra: str, key: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        _parse(MINIMAL + extra + "\n")
    assert str(excinfo.value).startswith(f"conf/x.toml: {key}: ")
    assert "has one slash after" in str(excinfo.value)
    with pytest.raises(ConfigError, match="write s3://"):
        _parse(MINIMAL.replace('"/tmp/events"', '"s3:/lake/events"'))
    assert _parse(MINIMAL.replace('"/tmp/events"', '"file:/tmp/events"')).table.uri


def test_missing_keys_and_sections_are_named() -> None:
    with pytest.raises(ConfigError, match=r"conf/x.toml: table: missing required key"):
        _parse(MINIMAL.split("[table]")[0])
    with pytest.raises(ConfigError, match=r"source.group_id: missing required key"):
        _parse(MINIMAL.replace('group_id = "ingest-events"', ""))


def test_inconsistent_settings_are_refused() -> None:
    with pytest.raises(
        ConfigError, match=re.escape('table.merge_keys: mode "upsert" needs merge_keys')
    ):
        _parse(MINIMAL.replace('uri = "/tmp/events"', 'uri = "/tmp/e"\nmode = "upsert"'))
    with pytest.raises(ConfigError, match=r"kafka.bootstrap_servers\[0\]: expected host:port"):
        _parse(MINIMAL.replace('"127.0.0.1:9092"', '"nohost"'))
    with pytest.raises(ConfigError, match=r"servers\[1\]: expected host:port, got 'h:65536'"):
        _parse(MINIMAL.replace('"127.0.0.1:9092"', '"h:65535", "h:65536"'))
    with pytest.raises(ConfigError, match=r"kafka.bootstrap_servers: needs at least one host:port"):
        _parse(MINIMAL.replace('["127.0.0.1:9092"]', "[]"))
    with pytest.raises(ConfigError, match=r"conf/x.toml: source.topics: set topics \(a list"):
        _parse(MINIMAL.replace('["events"]', "[]"))
    both = MINIMAL.replace('topics = ["events"]', 'topics = ["events"]\ntopic_pattern = "e.*"')
    with pytest.raises(ConfigError, match=r"source.topic_pattern: set topics .* not both"):
        _parse(both)
    bad = MINIMAL.replace('topics = ["events"]', 'topic_pattern = "events-("')
    with pytest.raises(ConfigError, match=r"source.topic_pattern: not a regular expression"):
        _parse(bad)
    assert (
        _parse(MINIMAL.replace('topics = ["events"]', 'topic_pattern = "ev.*"')).source.topics == []
    )
    with pytest.raises(ConfigError, match=re.escape("source.heartbeat_interval: must be shorter")):
        _parse(
            MINIMAL.replace(
                'group_id = "ingest-events"',
                'group_id = "g"\nsession_timeout = "3s"\nheartbeat_interval = "3s"',
            )
        )


UPSERT = MINIMAL.replace(
    'uri = "/tmp/events"', 'uri = "/tmp/e"\nmode = "upsert"\nmerge_keys = ["id"]'
)


def test_tombstones_and_the_debezium_envelope_fit_the_mode() -> None:
    assert _parse(UPSERT).table.tombstones is None  # the mode's default: delete
    for mode in ("delete", "ignore", "dead_letter"):
        text = UPSERT.replace("[table]", "[table]\ntombstones = " + repr(mode).replace("'", '"'))
        assert _parse(text).table.tombstones == mode
    cases = [
        (
            MINIMAL + 'tombstones = "delete"\n',
            'conf/x.toml: table.tombstones: needs mode "upsert": an append table has no row '
            'of a key to delete (use "keep", "ignore" or "dead_letter")',
        ),
        (
            UPSERT + 'tombstones = "keep"\n',
            "conf/x.toml: table.tombstones: applies to append mode: in upsert mode a "
            'tombstone is "delete", "ignore" or "dead_letter"',
        ),
        (
            MINIMAL + 'tombstones = "drop"\n',
            "conf/x.toml: table.tombstones: expected one of 'delete', 'ignore', "
            "'dead_letter', 'keep', got 'drop'",
        ),
        (
            UPSERT + '[table.value]\nenvelope = "debezium"\n',
            'conf/x.toml: table.value.envelope: needs format "json" (the schema describes '
            "the rows in before/after)",
        ),
        (
            MINIMAL + '[table.value]\nformat = "json"\nschema = "id INT"\nenvelope = "debezium"\n',
            'conf/x.toml: table.value.envelope: needs mode "upsert": change events update '
            "and delete rows by key",
        ),
        (
            UPSERT + '[table.value]\nenvelope = "maxwell"\n',
            "conf/x.toml: table.value.envelope: expected one of 'none', 'debezium', got 'maxwell'",
        ),
    ]
    for text, message in cases:
        with pytest.raises(ConfigError) as excinfo:
            _parse(text)
        assert str(excinfo.value) == message


def test_invalid_toml_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape("conf/x.toml: not valid TOML")):
        _parse("[kafka\n")
    with pytest.raises(ConfigError, match="cannot read the config"):
        load_config(tmp_path / "absent.toml")


SASL = MINIMAL.replace(
    "[source]",
    '[kafka.sasl]\nmechanism = "SCRAM-SHA-512"\nusername = "ingest"\npassword_env = "KAFKA_PW"\n\n[source]',
).replace(
    'bootstrap_servers = ["127.0.0.1:9092"]',
    'bootstrap_servers = ["127.0.0.1:9092"]\nsecurity_protocol = "SASL_SSL"',
)


def test_secrets_come_from_the_environment_and_are_masked() -> None:
    config = _parse(SASL, env={"KAFKA_PW": "hunter2-very-secret"})

    client = client_config(config)
    assert client.sasl is not None and client.sasl.password.reveal() == "hunter2-very-secret"
    shown = render_config(config) + repr(config) + repr(client)
    assert "hunter2" not in shown
    assert 'password_env = "KAFKA_PW"  # value: ***' in render_config(config)


@pytest.mark.parametrize(
    ("protocol", "table", "key"),
    [
        ("PLAINTEXT", '[kafka.tls]\nca_file = "/ca.pem"', "kafka.tls"),
        (
            "SASL_PLAINTEXT",
            '[kafka.sasl]\nmechanism = "PLAIN"\nusername = "u"\npassword_env = "PW"\n\n'
            "[kafka.tls]\ncheck_hostname = false",
            "kafka.tls",
        ),
        (
            "PLAINTEXT",
            '[kafka.sasl]\nmechanism = "PLAIN"\nusername = "u"\npassword_env = "PW"',
            "kafka.sasl",
        ),
        (
            "SSL",
            '[kafka.sasl]\nmechanism = "PLAIN"\nusername = "u"\npassword_env = "PW"',
            "kafka.sasl",
        ),
    ],
)
def test_tls_or_sasl_that_the_protocol_would_not_use_is_a_config_error(
    protocol: str, table: str, key: str
) -> None:
    """A [kafka.tls] or [kafka.sasl] table was silently ignored under a protocol that does
    not use it: the operator believed the connection encrypted or authenticated."""
    text = MINIMAL.replace(
        'bootstrap_servers = ["127.0.0.1:9092"]',
        f'bootstrap_servers = ["127.0.0.1:9092"]\nsecurity_protocol = "{protocol}"',
    ).replace("[source]", f"{table}\n\n[source]")
    with pytest.raises(ConfigError) as info:
        _parse(text, env={"PW": "x"})
    assert key in str(info.value) and protocol in str(info.value)


@pytest.mark.parametrize(
    ("protocol", "table", "warning"),
    [
        ("SSL", "[kafka.tls]\ncheck_hostname = false", "check_hostname = false"),
        (
            "SASL_PLAINTEXT",
            '[kafka.sasl]\nmechanism = "PLAIN"\nusername = "u"\npassword_env = "PW"',
            "sends the password in clear",
        ),
    ],
)
def test_weakened_security_is_warned_at_load(
    protocol: str, table: str, warning: str, caplog: pytest.LogCaptureFixture
) -> None:
    text = MINIMAL.replace(
        'bootstrap_servers = ["127.0.0.1:9092"]',
        f'bootstrap_servers = ["127.0.0.1:9092"]\nsecurity_protocol = "{protocol}"',
    ).replace("[source]", f"{table}\n\n[source]")
    with caplog.at_level("WARNING", logger="ingest.config"):
        _parse(text, env={"PW": "x"})
    assert [r for r in caplog.records if warning in r.getMessage()], caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="ingest.config"):
        _parse(SASL, env={"KAFKA_PW": "x"})  # SCRAM over SASL_SSL: nothing to warn of
    assert caplog.records == []


def test_print_config_masks_secret_looking_options() -> None:
    text = MINIMAL.replace(
        '[table]\nuri = "/tmp/events"',
        '[table]\nuri = "/tmp/events"\n'
        'storage_options = { aws_secret_access_key = "S3CR3T-1", AWS_REGION = "eu-west-1" }\n\n'
        "[spark]\n"
        'conf = { "spark.hadoop.fs.s3a.secret.key" = "S3CR3T-2", '
        '"spark.sql.shuffle.partitions" = "4" }',
    )
    shown = render_config(_parse(text))
    assert "S3CR3T" not in shown
    assert (
        '"aws_secret_access_key" = "***"' in shown
        and '"spark.hadoop.fs.s3a.secret.key" = "***"' in shown
    )
    assert '"AWS_REGION" = "eu-west-1"' in shown and '"spark.sql.shuffle.partitions" = "4"' in shown


def test_a_missing_secret_names_the_variable() -> None:
    with pytest.raises(
        ConfigError, match=re.escape("kafka.sasl.password_env: environment variable KAFKA_PW")
    ):
        _parse(SASL)


def test_printed_config_loads_back_to_the_same_config() -> None:
    config = _parse(SASL, env={"KAFKA_PW": "x"})
    again = _parse(render_config(config), env={"KAFKA_PW": "x"})
    assert again == config


@given(
    name=st.text(),
    # A secret-looking key's value prints masked, so it cannot load back the same.
    options=st.dictionaries(
        st.text().filter(lambda k: not secret_looking(k)), st.text(), max_size=3
    ),
    keys=st.lists(st.text(min_size=1), min_size=1, max_size=3),
)
def test_any_string_prints_as_toml_that_loads_back(
    name: str, options: dict[str, str], keys: list[str]
) -> None:
    """Quotes, backslashes and control characters (DEL too) in any string value or table
    key: ``--print-config`` stays TOML that loads back to the same config."""
    config = _parse(MINIMAL)
    config = dataclasses.replace(
        config,
        spark=dataclasses.replace(config.spark, app_name=name),
        table=dataclasses.replace(
            config.table, storage_options=options, mode="upsert", merge_keys=keys
        ),
    )
    assert _parse(render_config(config)) == config


@pytest.mark.parametrize(
    ("text", "value"),
    [("256MiB", 256 * 1024**2), ("1.5GB", 1_500_000_000), ("64k", 65536), (1024, 1024), ("0", 0)],
)
def test_sizes(text: object, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize(("text", "value"), [("500ms", 0.5), ("30s", 30), ("5m", 300), (2.5, 2.5)])
def test_durations(text: object, value: float) -> None:
    assert parse_duration(text) == value


@pytest.mark.parametrize("text", ["abc", "-1", "12 parsecs", True, -5])
def test_bad_sizes(text: object) -> None:
    with pytest.raises(ValueError, match="expected a size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("group", "partition"),
    [
        ("hello", 22),  # Java: "hello".hashCode() == 99162322
        ("", 0),
        ("polygenelubricants", 0),  # hashCode() == Integer.MIN_VALUE; Kafka's Utils.abs -> 0
        ("\U0001f600", 49),  # UTF-16 surrogate pair: 0xD83D * 31 + 0xDE00 == 1772899
    ],
)
def test_offsets_topic_partition_follows_java(group: str, partition: int) -> None:
    assert offsets_topic_partition(group) == partition


def test_offsets_topic_partition_count_is_configurable() -> None:
    assert offsets_topic_partition("hello", 7) == 99162322 % 7


@pytest.mark.parametrize("example", sorted(p.name for p in CONF_DIR.glob("*.toml")))
def test_every_example_in_conf_loads(example: str) -> None:
    env = {
        "KAFKA_PASSWORD": "x",
        "S3_ACCESS_KEY_ID": "x",
        "S3_SECRET_ACCESS_KEY": "x",
        "TLS_KEY_PASSWORD": "x",
    }
    load_config(CONF_DIR / example, env=env)


def test_maintenance_defaults_and_what_they_become() -> None:
    from ingest.sink.maintenance.maintain import LOG_RETENTION_FLOOR_SECONDS, VACUUM_FLOOR_HOURS
    from ingest.supervisor.wiring import maintenance_settings

    maintenance = _parse(MINIMAL).maintenance
    assert (
        maintenance.enabled and maintenance.interval == 600 and maintenance.checkpoint_every == 10
    )
    assert maintenance.log_retention == 30 * 86400 and maintenance.vacuum_retention == 168 * 3600
    settings = maintenance_settings(_parse(MINIMAL + '\n[maintenance]\nlog_retention = "2d"\n'))
    assert settings.log_retention_seconds == 2 * 86400 and settings.vacuum_retention_hours == 168
    # The config's floors are the sink's.
    assert type(maintenance).VACUUM_FLOOR_HOURS == VACUUM_FLOOR_HOURS
    assert type(maintenance).LOG_RETENTION_FLOOR_SECONDS == LOG_RETENTION_FLOOR_SECONDS


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            'vacuum_retention = "23h"',
            "conf/x.toml: maintenance.vacuum_retention: 23h is below the floor of 24h: VACUUM "
            "deletes removed files a running query, a time-travel read or a lagging streaming "
            "reader may still need, and (vacuum_full) files a batch in flight wrote but has not "
            "committed yet; Delta's own check is 168h",
        ),
        ('log_retention = "30m"', "conf/x.toml: maintenance.log_retention: 1800s is below"),
        ("checkpoint_every = 0", "conf/x.toml: maintenance.checkpoint_every: must be at least 1"),
        ('target_file_size = "1KiB"', "maintenance.target_file_size: must be at least 1MiB"),
        ("interval = 0", "conf/x.toml: maintenance.interval: must be above 0"),
        ('interval = "often"', 'maintenance.interval: expected a duration like "30s"'),
        ("vacuum = 1", "conf/x.toml: maintenance.vacuum: expected true or false"),
        ("vaccum = true", "conf/x.toml: maintenance.vaccum: unknown key"),
    ],
)
def test_bad_maintenance_values_name_the_file_and_the_key(extra: str, message: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        _parse(MINIMAL + "\n[maintenance]\n" + extra + "\n")
    assert message in str(excinfo.value)


def test_a_full_vacuum_refuses_a_dead_letter_table_inside_the_table() -> None:
    inside = MINIMAL + '\n[dead_letter]\nuri = "/tmp/events/dead"\n'
    with pytest.raises(ConfigError, match=r"conf/x.toml: dead_letter.uri: a full VACUUM"):
        _parse(inside)
    assert _parse(inside + "\n[maintenance]\nvacuum_full = false\n").maintenance.vacuum


@pytest.mark.parametrize(
    ("table", "extra", "message"),
    [
        ("", "", "table.uri: set the Delta table's uri, or its name in Spark's catalog"),
        ('name = "lake.events"', '[spark]\nengine = "local"', "spark.engine: a table by name"),
        (
            'name = "lake.events"',
            '[[route]]\ntopics = "x"',
            "route[0].uri: with table.name a route names its own table: set its uri or its name",
        ),
        (
            'uri = "/lake/t"',
            '[[route]]\ntopics = "x"\nname = "lake.x"\n[spark]\nengine = "local"',
            "spark.engine: a table by name (table.name, or a route's name)",
        ),
        (
            'uri = "/lake/t"',
            '[[route]]\ntopics = "x"\nname = "lake.{topic}"\nuri = "/lake/x"',
            "route[0].name: {topic} in route[0].name needs it in route[0].uri too",
        ),
        ('uri = "/lake/t"', '[[route]]\ntopics = "x"\nname = "a-b"', "route[0].name: expected"),
        ('name = "lake.{topic}"\nuri = "/lake/t"', "", "{topic} in table.name needs it"),
        ('name = "{topic}.t"', "", "table.name: expected a table name"),
        ('name = "lake.{topic}.t"', "", "table.name: expected a table name"),
        ('name = "lake.ev-ents"', "", "table.name: expected a table name"),
        ('name = "a.b.c.d"', "", "table.name: expected a table name"),
    ],
)
def test_a_table_by_name_is_checked_at_load(table: str, extra: str, message: str) -> None:
    text = MINIMAL.replace('uri = "/tmp/events"', table) + extra + "\n"
    with pytest.raises(ConfigError) as excinfo:
        _parse(text)
    assert message in str(excinfo.value)


def test_a_table_by_name_loads_without_a_uri_and_resolves_later() -> None:
    for name in ("events_{topic}", "{topic}", "spark_catalog.lake.t"):
        assert _parse(MINIMAL.replace('uri = "/tmp/events"', f'name = "{name}"')).table.name
    config = _parse(MINIMAL.replace('uri = "/tmp/events"', 'name = "lake.{topic}"'))
    assert (config.table.name, config.table.uri) == ("lake.{topic}", None)
    with pytest.raises(ConfigError, match="not resolved through the catalog yet"):
        config.table_uri()


def test_a_route_by_name_loads_without_a_uri_and_resolves_later() -> None:
    from ingest.supervisor.wiring import table_router

    text = MINIMAL + '\n[[route]]\ntopics = "orders"\nname = "lake.orders"\n'
    config = _parse(text)
    assert config.names_tables() and not _parse(MINIMAL).names_tables()
    assert (config.route[0].name, config.route[0].uri) == ("lake.orders", None)
    with pytest.raises(ConfigError, match=r"route 'lake\.orders' is not resolved"):
        table_router(config)
    resolved = dataclasses.replace(
        config, route=[dataclasses.replace(config.route[0], uri="/lake/orders")]
    )
    table = table_router(resolved).for_topic("orders")
    assert (table.uri, table.name) == ("/lake/orders", "lake.orders")
    assert (table.dead_letters, table.dead_letter_name) == (
        "/lake/orders_dead_letters",
        "lake.orders_dead_letters",
    )
