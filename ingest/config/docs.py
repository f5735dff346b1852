"""``docs/configuration.md``, written from the config's JSON Schema (``config_schema.py``).

Regenerate with ``python -m ingest.config.docs > docs/configuration.md``;
``tests/test_config_schema.py`` fails while the file differs from what this writes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

from ingest.config.config_schema import config_schema

REGENERATE = "python -m ingest.config.docs > docs/configuration.md"

_INTRO = f"""\
# Configuration

<!-- Generated from ingest/config/sections.py by `{REGENERATE}`; do not edit. -->

`ingest run | replay | status | maintain -c FILE` read one TOML file. Every key is
validated on load, before anything starts: an unknown key, a wrong type or a bad value is
refused with the file and the dotted key (`conf/x.toml: trigger.max_bytes: expected a size
like "256MiB"`). `--print-config` prints the effective config, defaults included.

- **size**: bytes, as an integer (`1048576`) or a string with a unit: `B`, `KB`, `MB`,
  `GB`, `TB` (powers of 1000), `KiB`, `MiB`, `GiB`, `TiB` or `K`, `M`, `G` (powers of
  1024), e.g. `"256MiB"`, `"1.5GB"`.
- **duration**: seconds, as a number (`2.5`) or a string with a unit: `ms`, `s`, `m`,
  `h`, `d`, e.g. `"500ms"`, `"30s"`, `"168h"`.
- **secrets** are never written in the file: a `*_env` key names the environment variable
  that holds the value, read when the config loads.

`ingest config-schema` prints the JSON Schema this page is written from: with
`ingest config-schema > ingest.schema.json` and a first line `#:schema ./ingest.schema.json`
in a config, a TOML editor (Taplo, Even Better TOML) validates and completes it.
"""


def config_markdown() -> str:
    schema = config_schema()
    parts = [_INTRO]
    for dotted, table, required in _tables(schema, schema, ""):
        parts.append(f"## `[{dotted}]`" + (" (required)" if required else "") + "\n")
        if "description" in table:
            parts.append(table["description"].replace("``", "`") + "\n")
        parts.append("| Key | Type | Default | Description |")
        parts.append("| --- | --- | --- | --- |")
        for name, prop in table["properties"].items():
            if _ref(prop) is not None:
                continue  # a table of its own, below
            default = "required" if name in table.get("required", ()) else _default(prop)
            parts.append(f"| `{name}` | {_type(prop)} | {default} | {_cell(prop['description'])} |")
        parts.append("")
    return "\n".join(parts)


def _tables(
    schema: dict[str, Any], table: dict[str, Any], dotted: str
) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """Every table of the file, depth first: its dotted name, its schema, whether required."""
    for name, prop in table["properties"].items():
        ref = _ref(prop)
        if ref is None:
            continue
        inner = dict(schema["$defs"][ref.rsplit("/", 1)[1]])
        inner.setdefault("description", prop.get("description", ""))
        here = f"{dotted}.{name}" if dotted else name
        shown = f"[{here}]" if prop.get("type") == "array" else here  # [[route]]
        yield shown, inner, name in table.get("required", ())
        yield from _tables(schema, inner, here)


def _ref(prop: dict[str, Any]) -> str | None:
    """The table a key holds: a table, an optional one, or an array of tables."""
    if "$ref" in prop:
        return str(prop["$ref"])
    if prop.get("type") == "array" and "$ref" in prop.get("items", {}):
        return str(prop["items"]["$ref"])
    for option in prop.get("anyOf", ()):
        if "$ref" in option:
            return str(option["$ref"])
    return None


def _type(prop: dict[str, Any]) -> str:
    if "anyOf" in prop:
        kinds = {option.get("type") for option in prop["anyOf"]}
        return "size" if "integer" in kinds else "duration"
    if "enum" in prop:
        return " \\| ".join(f'`"{v}"`' for v in prop["enum"])
    kind = prop.get("type")
    if kind == "array":
        return f"list of {_type(prop['items'])}"
    if kind == "object":
        return f"table of {_type(prop['additionalProperties'])}"
    return {"string": "string", "integer": "integer", "boolean": "boolean"}.get(str(kind), "?")


def _default(prop: dict[str, Any]) -> str:
    if "default" not in prop:
        return "unset"
    return f"`{json.dumps(prop['default'])}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def main() -> int:
    sys.stdout.write(config_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
