"""The effective config as TOML, secrets masked (``--print-config``), and the TOML
spelling of one value (also used by ``ingest.testing.configs``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from ingest.client.client_config import Secret
from ingest.config.sections import IngestConfig
from ingest.config.units import Duration, Size
from ingest.redaction import masked


def render_config(config: IngestConfig) -> str:
    """The effective config as TOML, secrets masked (for ``--print-config``)."""
    lines: list[str] = []
    for section in dataclasses.fields(config):
        value = getattr(config, section.name)
        if section.name in ("path", "secrets") or value is None:
            continue  # not keys, or an optional table left out
        if isinstance(value, list):  # an array of tables: [[route]]
            for item in value:
                _render_table(section.name, item, config.secrets, lines, array=True)
            continue
        _render_table(section.name, value, config.secrets, lines)
    return "\n".join(lines) + "\n"


def _render_table(
    name: str,
    value: Any,
    secrets: Mapping[str, Secret],
    lines: list[str],
    *,
    array: bool = False,
) -> None:
    scalars: list[str] = []
    nested: list[tuple[str, Any]] = []
    for spec in dataclasses.fields(value):
        item = getattr(value, spec.name)
        dotted = f"{name}.{spec.name}"
        if dataclasses.is_dataclass(item):
            nested.append((dotted, item))
        elif item is None:
            continue
        elif spec.name.endswith("_env") and isinstance(item, str):
            shown = "***" if dotted in secrets else "(unset)"
            scalars.append(f"{spec.name} = {toml_value(item)}  # value: {shown}")
        elif isinstance(item, dict) and spec.name == "storage_options_env":
            scalars.append(f"{spec.name} = {toml_value(item)}  # values: ***")
        elif isinstance(item, dict):  # storage options, Spark conf, table properties
            shown_items = masked(dict(item))
            scalars.append(f"{spec.name} = {toml_value(shown_items)}")
        else:
            scalars.append(f"{spec.name} = {toml_value(item)}")
    lines.append(f"[[{name}]]" if array else f"[{name}]")
    lines.extend(scalars)
    lines.append("")
    for dotted, item in nested:
        _render_table(dotted, item, secrets, lines)


def toml_value(value: Any) -> str:
    """One value as TOML (sizes and durations in their config spelling)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Size | Duration):
        return f'"{value.spell()}"'
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        # JSON's escapes are TOML's; DEL, which JSON leaves as it is, TOML refuses raw.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{toml_value(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
        )
    return repr(value)
