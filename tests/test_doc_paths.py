"""Every repository path DESIGN.md and README.md name exists.

A candidate path is the text of an inline code span (`...`) or a Markdown link target
that looks like a path in this repository: it holds a ``/``, ends in a known file
extension, or starts with a top-level folder. A code span with spaces counts only in the
form ``path: name`` (DESIGN.md's walk of one record); commands and fenced code blocks
are examples, not claims, and are skipped. A ``:line`` suffix and a ``#anchor`` are cut
off. URLs, globs, home and absolute paths and placeholders (``<...>``, ``{...}``,
``$VAR``) are not repository paths and are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("DESIGN.md", "README.md")

EXTENSIONS = (".py", ".md", ".toml", ".sh", ".c")
TOP_FOLDERS = ("ingest/", "tests/", "scripts/", "docs/", "conf/", "deploy/", ".ci/")

_FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"``(.+?)``|`([^`\n]+)`")
_LINK_TARGET = re.compile(r"\]\(([^)\s]+)\)")
_NAMED = re.compile(r"^(\S+):\s")  # `ingest/worker/loop.py: PartitionWorker.run`
_LINE_SUFFIX = re.compile(r":\d+(-\d+)?$")


def _clean(text: str) -> str | None:
    """The repository path ``text`` names, or None when it names none."""
    text = text.strip().strip(".,;")
    if not text or text.startswith(("http:", "https:", "mailto:", "~", "/", "$")):
        return None
    if "://" in text or any(mark in text for mark in "*<>{}$"):
        return None
    text = _LINE_SUFFIX.sub("", text.split("#", 1)[0])
    if not text:
        return None
    looks_like_path = "/" in text or text.endswith(EXTENSIONS) or text.startswith(TOP_FOLDERS)
    return text if looks_like_path else None


def named_paths(markdown: str) -> list[str]:
    """The repository paths a Markdown document names, in order, repeats kept."""
    prose = _FENCED.sub("", markdown)
    found: list[str] = []
    for match in _CODE_SPAN.finditer(prose):
        span = (match.group(1) or match.group(2)).strip()
        if any(c.isspace() for c in span):
            named = _NAMED.match(span)
            if named is None:
                continue  # a command or a phrase, not a path
            span = named.group(1)
        path = _clean(span)
        if path is not None:
            found.append(path)
    for match in _LINK_TARGET.finditer(prose):
        path = _clean(match.group(1))
        if path is not None:
            found.append(path)
    return found


def missing_paths(markdown: str, root: Path = ROOT) -> list[str]:
    return sorted({p for p in named_paths(markdown) if not (root / p).exists()})


@pytest.mark.parametrize("doc", DOCS)
def test_every_named_path_exists(doc: str) -> None:
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert named_paths(text), f"{doc} names no path: is the extraction broken?"
    missing = missing_paths(text)
    assert missing == [], f"{doc} names paths that do not exist: {missing}"


def test_a_wrong_path_is_caught() -> None:
    text = (
        "See `ingest/worker/nowhere.py: Nothing.run`, [x](docs/none.md#a), `gone.py:12` "
        "and `scripts/missing`; not `ingest run -c conf/x.toml`, `~/.cache/ingest/`, "
        "`/dev/shm`, `ingest_*`, `spark-<key>.jsa`, `s3://lake/t` or [y](https://a.b/c).\n"
        "```\nconf/also_missing.toml\n```\n"
    )
    assert missing_paths(text) == [
        "docs/none.md",
        "gone.py",
        "ingest/worker/nowhere.py",
        "scripts/missing",
    ]


def test_existing_paths_pass() -> None:
    text = "`ingest/worker/loop.py: PartitionWorker.run`, [d](DESIGN.md#file-map), `ingest/`"
    assert named_paths(text) == ["ingest/worker/loop.py", "ingest/", "DESIGN.md"]
    assert missing_paths(text) == []
