"""Config files for test and benchmark runs: sections of values written as TOML."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ingest.config import toml_value

__all__ = ["write_toml"]


def write_toml(path: Path, sections: Mapping[str, Mapping[str, Any]]) -> Path:
    """Writes ``{"section": {"key": value}}`` (dotted names for subtables, e.g.
    ``"table.value"``) with the value spelling of ``--print-config``."""
    lines: list[str] = []
    for section, entries in sections.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {toml_value(value)}" for key, value in entries.items())
        lines.append("")
    path.write_text("\n".join(lines))
    return path
