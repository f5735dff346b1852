"""``scripts/lines.py``, the line counter closing notes quote: what counts as a logic line."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SOURCE = textwrap.dedent(
    '''\
    """A module docstring,
    on two lines."""

    # a comment
    import os  # a comment after code


    class Section:
        """A class docstring."""

        size: int = 1
        """An attribute's docstring."""
        text = """a string assigned:
    code, not a docstring"""

        def f(self) -> str:
            return (lambda: f"{os.sep}")()
    '''
)


def test_logic_lines_leave_out_docstrings_comments_and_blanks(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(SOURCE)
    (tmp_path / "pkg" / "b.py").write_text("x = 1\n\ny = 2\n")
    (tmp_path / "pkg" / "notes.txt").write_text("not python\n")
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "lines.py"), "pkg", "pkg/b.py", "gone.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    rows = {line.split()[0]: line.split()[1] for line in result.stdout.splitlines()[2:]}
    # a.py: 17 lines; logic: import, class, size, text (2 lines), def, return.
    assert rows == {"pkg": "20/9", "pkg/b.py": "3/2", "gone.py": "0/0", "total": "23/11"}
