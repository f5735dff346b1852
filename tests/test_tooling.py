"""The tooling gates are part of the suite, so CI enforces them: ruff, and mypy --strict
on the pure layers (configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LINTED = ["ingest", "tests", "scripts"]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_check_is_clean() -> None:
    result = _run(str(BIN / "ruff"), "check", *LINTED)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    result = _run(str(BIN / "ruff"), "format", "--check", *LINTED)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_strict_on_every_layer() -> None:
    result = _run(str(BIN / "mypy"), "ingest")
    assert result.returncode == 0, result.stdout + result.stderr
