"""Sizes and durations as the config spells them: "256MiB", "1.5GB" or 1048576 bytes;
"500ms", "30s", "5m", "168h", "30d" or 2.5 seconds.

``Size`` and ``Duration`` are the int and float the code reads; each also tells pydantic
how to parse it (``parse_size``, ``parse_duration``), how to spell it back in JSON (the
schema's defaults) and what JSON Schema describes it (a number, or a string whose pattern
takes the units below). Here too: the strict scalars of the sections and their pydantic
config.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import ConfigDict, GetCoreSchemaHandler, GetJsonSchemaHandler, Strict
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

# The scalars of the sections are strict: TOML's "5" is not an integer, 1 is not true.
Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]

# A section refuses an unknown key, and is validated when built, in Python too.
SECTION = ConfigDict(extra="forbid")

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
    "k": 1024, "m": 1024**2, "g": 1024**3,
}  # fmt: skip
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "": 1.0}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def _pattern(units: dict[str, Any]) -> str:
    """``_NUMBER_UNIT`` restricted to ``units``, case-insensitive, as JSON Schema spells a
    regex (ECMA-262: no flags, so each letter is a class of both cases)."""
    spelled = sorted(
        ("".join(f"[{c.lower()}{c.upper()}]" for c in unit) for unit in units if unit),
        key=len,
        reverse=True,
    )
    return r"^\s*[0-9]+(\.[0-9]+)?\s*(" + "|".join(spelled) + r")?\s*$"


class Size(int):
    """A byte count; TOML may give an integer or a string such as "256MiB"."""

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            parse_size,
            serialization=core_schema.plain_serializer_function_ser_schema(
                spell_size, when_used="json"
            ),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": _pattern(_SIZE_UNITS)},
            ],
            "examples": ["256MiB", "1.5GB", 1048576],
        }


class Duration(float):
    """Seconds; TOML may give a number or a string such as "500ms", "30s", "5m"."""

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            parse_duration,
            serialization=core_schema.plain_serializer_function_ser_schema(
                spell_duration, when_used="json"
            ),
        )

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {
            "anyOf": [
                {"type": "number", "minimum": 0},
                {"type": "string", "pattern": _pattern(_DURATION_UNITS)},
            ],
            "examples": ["500ms", "30s", "5m", 2.5],
        }


def parse_size(value: object) -> Size:
    if isinstance(value, bool):
        raise ValueError('expected a size like "256MiB"')
    if isinstance(value, int) and value >= 0:
        return Size(value)
    if isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        if match and match.group(2).lower() in _SIZE_UNITS:
            return Size(int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]))
    raise ValueError('expected a size like "256MiB"')


def parse_duration(value: object) -> Duration:
    if isinstance(value, bool):
        raise ValueError('expected a duration like "30s" or "500ms"')
    if isinstance(value, int | float) and value >= 0:
        return Duration(float(value))
    if isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        if match and match.group(2).lower() in _DURATION_UNITS:
            return Duration(float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()])
    raise ValueError('expected a duration like "30s" or "500ms"')


def spell_size(value: int) -> str:
    """A byte count as the config spells it: "256MiB", or the bare number."""
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= factor and value % factor == 0:
            return f"{value // factor}{unit}"
    return str(value)


def spell_duration(value: float) -> str:
    """Seconds as the config spells them; whole seconds in full ("2592000s", not
    "2.592e+06s", which does not parse back)."""
    seconds = float(value)
    return f"{int(seconds)}s" if seconds.is_integer() else f"{seconds:g}s"
