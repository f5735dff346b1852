"""The config declared once: its JSON Schema (``ingest config-schema``), the generated
``docs/configuration.md``, ``conf/*.toml`` against the schema, and pydantic's errors
turned into the loader's messages (file and dotted key)."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from ingest.cli import main
from ingest.config import TriggerSection, config_schema, parse_config, parse_duration, parse_size
from ingest.config.docs import REGENERATE, config_markdown
from ingest.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
MINIMAL = """
[kafka]
bootstrap_servers = ["127.0.0.1:9092"]

[source]
topics = ["events"]
group_id = "ingest-events"

[table]
uri = "/tmp/events"
"""
VALIDATOR = jsonschema.Draft202012Validator(config_schema())


def test_config_schema_prints_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config-schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == config_schema()
    jsonschema.Draft202012Validator.check_schema(printed)
    assert printed["required"] == ["kafka", "source", "table"]
    assert "path" not in printed["properties"] and "secrets" not in printed["properties"]


def _table_ref(prop: dict[str, Any]) -> str | None:
    """A table's $ref: a table, an optional one or an array of them ([[route]])."""
    options = [prop, prop.get("items", {}), *prop.get("anyOf", ())]
    return next((str(o["$ref"]) for o in options if "$ref" in o), None)


def _keys(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every key of every table, by dotted name (tables included)."""
    found: dict[str, dict[str, Any]] = {}

    def walk(table: dict[str, Any], prefix: str) -> None:
        for name, prop in table["properties"].items():
            found[prefix + name] = prop
            ref = _table_ref(prop)
            if ref is not None:
                walk(schema["$defs"][ref.rsplit("/", 1)[1]], f"{prefix}{name}.")

    walk(schema, "")
    return found


def test_every_key_has_a_description() -> None:
    keys = _keys(config_schema())
    assert len(keys) > 90  # every table and key of the file, nested ones included
    assert {"kafka.sasl.password_env", "table.value.envelope", "maintenance.vacuum_full"} <= set(
        keys
    )
    missing = [key for key, prop in keys.items() if not prop.get("description", "").strip()]
    assert missing == []


def _errors(document: dict[str, Any]) -> list[str]:
    return [error.message for error in VALIDATOR.iter_errors(document)]


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "conf").glob("*.toml")))
def test_every_example_in_conf_validates_against_the_schema(example: str) -> None:
    document = tomllib.loads((ROOT / "conf" / example).read_text())
    assert _errors(document) == []


def _with(section: str, key: str, value: object) -> dict[str, Any]:
    document = tomllib.loads(MINIMAL)
    document.setdefault(section, {})[key] = value
    return document


@pytest.mark.parametrize("value", ["256MiB", "1.5GB", "64k", "1 kib", " 2TB ", 1024, 0, "0", "17"])
def test_the_schema_takes_the_sizes_the_loader_takes(value: object) -> None:
    parse_size(value)
    assert _errors(_with("trigger", "max_bytes", value)) == []


@pytest.mark.parametrize("value", ["abc", "-1", "12 parsecs", "5 MiBs", True, -5, 1.5])
def test_the_schema_refuses_the_sizes_the_loader_refuses(value: object) -> None:
    with pytest.raises(ValueError):
        parse_size(value)
    assert _errors(_with("trigger", "max_bytes", value)) != []


@pytest.mark.parametrize("value", ["500ms", "30s", "5m", "168h", "30d", "2.5", 2.5, 0, "1 H"])
def test_the_schema_takes_the_durations_the_loader_takes(value: object) -> None:
    parse_duration(value)
    assert _errors(_with("trigger", "max_age", value)) == []


@pytest.mark.parametrize("value", ["soon", "-1s", "5 weeks", "1w", True, -0.5])
def test_the_schema_refuses_the_durations_the_loader_refuses(value: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)
    assert _errors(_with("trigger", "max_age", value)) != []


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("trigger", "max_bytse", 1),  # unknown key
        ("handoff", "mode", "tape"),  # not one of the choices
        ("fetch", "check_crc", "yes"),  # not a boolean
        ("trigger", "max_records", "many"),  # not an integer
        ("spark", "conf", {"a": 1}),  # a table of strings
    ],
)
def test_the_schema_refuses_what_the_loader_refuses(section: str, key: str, value: object) -> None:
    document = _with(section, key, value)
    with pytest.raises(ConfigError):
        parse_config(_toml(document), path="x.toml", env={})
    assert _errors(document) != []
    assert _errors({"kafka": {"bootstrap_servers": ["h:1"]}}) != []  # source, table missing


def _toml(document: dict[str, Any]) -> str:
    lines = []
    for section, table in document.items():
        lines.append(f"[{section}]")
        lines += [
            f"{key} = {json.dumps(value)}"
            for key, value in table.items()
            if not isinstance(value, dict)
        ]
        lines += [
            f"{key} = {{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items()) + " }"
            for key, value in table.items()
            if isinstance(value, dict)
        ]
    return "\n".join(lines) + "\n"


def test_docs_configuration_md_is_generated_from_the_schema() -> None:
    written = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert written == config_markdown(), f"docs/configuration.md is stale: run `{REGENERATE}`"


def test_the_doc_names_every_key() -> None:
    doc = config_markdown()
    for dotted, prop in _keys(config_schema()).items():
        table, _, key = dotted.rpartition(".")
        if _table_ref(prop) is not None:
            assert f"## `[{dotted}]`" in doc or f"## `[[{dotted}]]`" in doc, dotted
        else:
            header = f"## `[{table}]`" if f"## `[{table}]`" in doc else f"## `[[{table}]]`"
            section = doc.split(header, 1)[1].split("\n## ", 1)[0]
            assert f"| `{key}` |" in section, dotted


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('[kafka.sasl]\nmechanism = "PLAIN"', "kafka.sasl.username: missing required key"),
        ("[kafka.tls]\nca_file = 1", "kafka.tls.ca_file: expected a string, got 1"),
        (
            "[kafka.tls]\nbogus = 1",
            "kafka.tls.bogus: unknown key (known here: ca_file, cert_file, check_hostname, "
            "key_file, key_password_env)",
        ),
        (
            'path = "elsewhere"',
            "path: unknown key (known here: dead_letter, fetch, handoff, kafka, logging, "
            "maintenance, metrics, route, schema_registry, source, spark, table, trigger, worker)",
        ),
        ("secrets = 1", "secrets: unknown key"),
        ("[spark.conf]\na = 1", "spark.conf.a: expected a string, got 1"),
        ("[spark]\nconf = 1", "spark.conf: expected a table"),
        ("[trigger]\nmax_records = 1.5", "trigger.max_records: expected an integer, got 1.5"),
        ("[trigger]\nmax_records = true", "trigger.max_records: expected an integer, got True"),
        (
            '[source2]\nx = 1\n[trigger]\nmax_records = "x"',  # the unknown key first
            "source2: unknown key",
        ),
        (
            "[logging]\nlevel = 'trace'",
            "logging.level: expected one of 'debug', 'info', 'warning', 'error', got 'trace'",
        ),
        ("[fetch]\nmax_bytes = -1", 'fetch.max_bytes: expected a size like "256MiB"'),
        ("[handoff]\nroot = [1]", "handoff.root: expected a string, got [1]"),
        ("[spark]\nmaster = 1", "spark.master: expected a string, got 1"),
        ("[metrics]\nlisten = 2026-01-01", "metrics.listen: expected a string, got datetime"),
    ],
)
def test_pydantic_errors_read_as_the_loader_s(extra: str, message: str) -> None:
    head, _, body = extra.partition("\n")
    text = extra + "\n" + MINIMAL if not head.startswith("[") else MINIMAL + "\n" + extra + "\n"
    if head in ("[kafka.sasl]", "[kafka.tls]"):
        text = MINIMAL.replace("[source]", f"{head}\n{body}\n\n[source]")
    with pytest.raises(ConfigError) as excinfo:
        parse_config(text, path="x.toml", env={})
    assert str(excinfo.value).startswith("x.toml: " + message)


def test_a_section_built_in_python_is_validated_too() -> None:
    with pytest.raises(ValidationError):
        TriggerSection(max_records="many")  # type: ignore[arg-type]
    trigger = TriggerSection(max_bytes="256MiB")  # type: ignore[arg-type]
    assert trigger.max_bytes == 256 * 1024**2
    assert dataclasses.replace(trigger, max_records=7).max_records == 7
    with pytest.raises(ValidationError):
        dataclasses.replace(trigger, max_age="soon")  # type: ignore[arg-type]
