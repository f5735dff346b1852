"""Lines of Python modules at git revisions: raw, and logic (docstrings, comments and
blank lines left out), for "the module grew or shrank" claims in closing notes.

    python scripts/lines.py --at 6753eab --at HEAD ingest/config ingest/supervisor/output/metrics.py

prints one row per path (a directory: its .py files summed) and, per revision, the raw and
the logic lines; a path absent at a revision counts 0. Without ``--at``, the work tree.
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import sys
import tokenize
from pathlib import Path

_LAYOUT = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}


def logic_lines(source: str) -> int:
    """Lines that hold a token of code: not blank, not only a comment, not a docstring
    (a string alone as a statement: a module's, a class's, a function's or an attribute's)."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        for statement in body if isinstance(body, list) else ():
            if (
                isinstance(statement, ast.Expr)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            ):
                docstrings.update(range(statement.lineno, (statement.end_lineno or 0) + 1))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in _LAYOUT or token.type == tokenize.ENDMARKER:
            continue
        lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def _sources(path: str, rev: str | None) -> list[str]:
    if rev is None:
        root = Path(path)
        files = sorted(root.rglob("*.py")) if root.is_dir() else [root] if root.exists() else []
        return [f.read_text(encoding="utf-8") for f in files]
    listed = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, "--", path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [
        subprocess.run(
            ["git", "show", f"{rev}:{name}"], capture_output=True, text=True, check=True
        ).stdout
        for name in listed
        if name.endswith(".py")
    ]


def count(path: str, rev: str | None) -> tuple[int, int]:
    sources = _sources(path, rev)
    return sum(s.count("\n") for s in sources), sum(logic_lines(s) for s in sources)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="files or directories")
    parser.add_argument("--at", action="append", help="a git revision (repeatable)")
    args = parser.parse_args(argv)
    revs: list[str | None] = list(args.at or [None])
    width = max(len(p) for p in [*args.paths, "total"])
    print(f"{'':{width}}" + "".join(f"  {rev or 'work tree':>15}" for rev in revs))
    print(f"{'':{width}}" + f"  {'raw/logic':>15}" * len(revs))
    totals = [[0, 0] for _ in revs]
    for path in args.paths:
        cells = []
        for i, rev in enumerate(revs):
            raw, logic = count(path, rev)
            totals[i][0] += raw
            totals[i][1] += logic
            cells.append(f"  {f'{raw}/{logic}':>15}")
        print(f"{path:{width}}" + "".join(cells))
    print(f"{'total':{width}}" + "".join(f"  {f'{r}/{lg}':>15}" for r, lg in totals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
