"""Sizes and durations as the config spells them: "256MiB", "1.5GB" or 1048576 bytes;
"500ms", "30s", "5m", "168h", "30d" or 2.5 seconds."""

from __future__ import annotations

import re


class Size(int):
    """A byte count; TOML may give an integer or a string such as "256MiB"."""


class Duration(float):
    """Seconds; TOML may give a number or a string such as "500ms", "30s", "5m"."""


_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
    "k": 1024, "m": 1024**2, "g": 1024**3,
}  # fmt: skip
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "": 1.0}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


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
