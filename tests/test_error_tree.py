"""Every exception ingest raises on purpose is drawn in ``ingest/errors.py``'s docstring."""

from __future__ import annotations

import importlib
import pkgutil

import ingest
import ingest.errors
from ingest.errors import IngestError


def _subclasses(cls: type) -> set[type]:
    found: set[type] = set()
    for sub in cls.__subclasses__():
        found |= {sub} | _subclasses(sub)
    return found


def test_the_drawn_tree_names_every_error_class() -> None:
    for package in (ingest,):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if ".testing" in info.name or info.name.endswith("__main__"):
                continue
            importlib.import_module(info.name)
    drawing = ingest.errors.__doc__ or ""
    missing = sorted(
        f"{cls.__module__}.{cls.__name__}"
        for cls in _subclasses(IngestError)
        if cls.__module__.startswith("ingest.")
        and not cls.__module__.startswith("ingest.testing")
        and f" {cls.__name__} " not in drawing.replace("\n", " ")
    )
    assert missing == [], f"not drawn in ingest/errors.py: {missing}"
