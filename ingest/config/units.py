"""Sizes and durations as the config spells them: "256MiB", "1.5GB" or 1048576 bytes;
"500ms", "30s", "5m", "168h", "30d" or 2.5 seconds.

``Size`` and ``Duration`` are the int and float the code reads; each also tells pydantic
how to parse it (``parse_size``, ``parse_duration``), how to spell it back in JSON (the
schema's defaults) and what JSON Schema describes it (a number, or a string whose pattern
takes the units below): ``_Unit`` does it for both, from their units. Here too: the strict
scalars of the sections, the patterns some strings must match, and their pydantic config.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Self

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    Strict,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

# The scalars of the sections are strict: TOML's "5" is not an integer, 1 is not true.
Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]

# A section refuses an unknown key, and is validated when built, in Python too.
SECTION = ConfigDict(extra="forbid", use_attribute_docstrings=True)

# Strings of a shape, checked by pydantic and offered in the JSON Schema; loader.py's
# ``_MISMATCH`` says what a string that does not match reads as.
_PORT = r"0*([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
HOST_PORT = rf"^.+:{_PORT}$"
# Spark's master URLs (Spark 4: no Mesos). Anything else fails at load, not in the JVM.
_SPARK_HOST_PORT = r"[A-Za-z0-9_.\-]+:\d{1,5}"
SPARK_MASTER = re.compile(
    r"local(\[(\*|[1-9]\d*)(,\s*[1-9]\d*)?\])?"
    r"|local-cluster\[[1-9]\d*,\s*[1-9]\d*,\s*[1-9]\d*\]"
    rf"|spark://{_SPARK_HOST_PORT}(,{_SPARK_HOST_PORT})*"
    r"|yarn"
    r"|k8s://(https?://)?[A-Za-z0-9_.\-\[\]:]+(:\d{1,5})?(/.*)?"
)
SPARK_MASTER_URL = f"^(?:{SPARK_MASTER.pattern})$"
# A Delta table's URI, as a transform may name it: not blank, no backquote.
DELTA_URI = r"^[^`]*[^`\s][^`]*$"
VIEW_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A table's name in Spark's catalog: [catalog.][database.]table, letters, digits and _
# (what a Hive metastore takes), {topic} allowed in the table's own part.
TABLE_NAME = r"^(?:[A-Za-z_][A-Za-z0-9_]*\.){0,2}(?:[A-Za-z0-9_]|\{topic\})+$"


def _view_name(name: str) -> str:
    if not VIEW_NAME.fullmatch(name) or name.lower() == "batch":
        raise ValueError(
            "a view name is letters, digits and _, not starting with a digit, and not `batch`"
        )
    return name


def _regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from None
    return text


HostPort = Annotated[Str, Field(pattern=HOST_PORT)]
SparkMaster = Annotated[Str, Field(pattern=SPARK_MASTER_URL)]
DeltaUri = Annotated[Str, Field(pattern=DELTA_URI)]
TableName = Annotated[Str, Field(pattern=TABLE_NAME)]
# A view name a transform's SQL may read (``batch`` is the batch's own view).
ViewName = Annotated[Str, AfterValidator(_view_name)]
# A regular expression (Python's syntax), compiled at load.
Regex = Annotated[Str, AfterValidator(_regex)]

_SIZE_UNITS: dict[str, float] = {
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


class _Unit:
    """A number TOML may give bare (not negative; a fraction if ``_FRACTIONS``) or as a
    string with one of ``_UNITS`` (their factors); ``spell`` writes it back for JSON."""

    _UNITS: ClassVar[dict[str, float]]
    _FRACTIONS: ClassVar[bool]
    _EXAMPLES: ClassVar[tuple[str | float, ...]]
    _ERROR: ClassVar[str]

    @classmethod
    def parse(cls, value: object) -> Self:
        number: float | None = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = value if isinstance(value, int) or cls._FRACTIONS else None
        elif isinstance(value, str) and (match := _NUMBER_UNIT.match(value)):
            factor = cls._UNITS.get(match.group(2).lower())
            number = None if factor is None else float(match.group(1)) * factor
        if number is None or not number >= 0:  # NaN too
            raise ValueError(cls._ERROR)
        return cls(number)  # type: ignore[call-arg]  # Size or Duration: int or float

    def spell(self) -> str:
        raise NotImplementedError

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        spell = core_schema.plain_serializer_function_ser_schema(cls.spell, when_used="json")
        return core_schema.no_info_plain_validator_function(cls.parse, serialization=spell)

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        number = {"type": "number" if cls._FRACTIONS else "integer", "minimum": 0}
        pattern = {"type": "string", "pattern": _pattern(cls._UNITS)}
        return {"anyOf": [number, pattern], "examples": list(cls._EXAMPLES)}


class Size(_Unit, int):
    """A byte count; TOML may give an integer or a string such as "256MiB"."""

    _UNITS = _SIZE_UNITS
    _FRACTIONS = False
    _EXAMPLES = ("256MiB", "1.5GB", 1048576)
    _ERROR = 'expected a size like "256MiB"'

    def spell(self) -> str:
        """As the config spells it: "256MiB", or the bare number."""
        for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
            if self >= factor and self % factor == 0:
                return f"{self // factor}{unit}"
        return str(int(self))


class Duration(_Unit, float):
    """Seconds; TOML may give a number or a string such as "500ms", "30s", "5m"."""

    _UNITS = _DURATION_UNITS
    _FRACTIONS = True
    _EXAMPLES = ("500ms", "30s", "5m", 2.5)
    _ERROR = 'expected a duration like "30s" or "500ms"'

    def spell(self) -> str:
        """As the config spells it; whole seconds in full ("2592000s", not "2.592e+06s",
        which does not parse back)."""
        return f"{int(self)}s" if self.is_integer() else f"{float(self):g}s"


parse_size = Size.parse
parse_duration = Duration.parse
