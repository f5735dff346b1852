"""The shape a newcomer can find their way in (DESIGN.md's rules, checked): small packages
and modules, one name per module, no import circles, layers inside the supervisor and the
engines, and one place that starts threads. ``test_layers.py`` holds the table of layers
between packages."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ROOT / "ingest"
# ingest.testing is test-only code (a documented API for tests), not product.
TEST_ONLY = PRODUCT / "testing"

MAX_MODULES = 12
MAX_LINES = 500


def product_modules() -> list[Path]:
    return sorted(p for p in PRODUCT.rglob("*.py") if TEST_ONLY not in p.parents)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside |= {id(n) for n in ast.walk(node)}
    return inside


def imported(path: Path, known: set[str]) -> set[str]:
    """The product modules ``path`` imports (at any depth, those for type checking only
    left out), each resolved to the module or package that exists."""

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_nodes(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # ``from package import module`` imports that module; any other name is the
            # package's (or module's) own.
            names = [f"{node.module}.{a.name}" for a in node.names]
            targets = [n for n in names if n in known]
            if len(targets) < len(names):
                targets.append(node.module)
        else:
            continue
        for target in targets:
            if target.startswith("ingest"):
                resolved = resolve(target)
                if resolved is not None:
                    found.add(resolved)
    found.discard(module_name(path))
    return found


def test_no_package_has_more_than_12_modules() -> None:
    counts = Counter(
        p.parent.relative_to(ROOT).as_posix() for p in product_modules() if p.name != "__init__.py"
    )
    assert {d: n for d, n in counts.items() if n > MAX_MODULES} == {}


def test_no_module_is_over_500_lines() -> None:
    long = {}
    for path in product_modules():
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            long[path.relative_to(ROOT).as_posix()] = lines
    assert long == {}


def test_no_two_product_modules_share_a_file_name() -> None:
    names = Counter(p.name for p in product_modules() if p.name != "__init__.py")
    shared = {
        name: sorted(p.relative_to(ROOT).as_posix() for p in product_modules() if p.name == name)
        for name, count in names.items()
        if count > 1
    }
    assert shared == {}


def test_no_modules_import_each_other_directly_or_in_a_circle() -> None:
    modules = {module_name(p): p for p in product_modules()}
    known = set(modules)
    graph = {name: imported(path, known) for name, path in modules.items()}
    # A package's __init__ re-exporting its modules is not a circle with them unless one of
    # them imports the package back: the edge package -> module stays in the graph.
    circles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                circles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert circles == []


# Inside a package, sub-packages and modules import downward only: each may import those
# listed for it (and anything outside the package); the rest are above it.
INSIDE: dict[str, dict[str, set[str]]] = {
    "ingest.supervisor": {
        "wiring": set(),
        "output": {"wiring"},
        "engine": {"wiring", "output"},
        "modes": {"wiring", "output", "engine"},
    },
    "ingest.engines": {
        "drive": set(),
        "plan": set(),
        "tasks": {"plan"},
        "local": {"drive", "plan", "tasks"},
        "spark": {"drive", "plan", "tasks"},
        "landing": {"local", "spark"},
    },
}


def test_inside_the_supervisor_and_the_engines_imports_go_downward() -> None:
    modules = {module_name(p): p for p in product_modules()}
    known = set(modules)
    wrong = []
    for package, rooms in INSIDE.items():
        prefix = package + "."
        for name, path in modules.items():
            if not name.startswith(prefix):
                continue
            room = name[len(prefix) :].split(".")[0]
            assert room in rooms, f"{name}: {room!r} is not in the table for {package}"
            for target in imported(path, known):
                if not target.startswith(prefix):
                    continue
                other = target[len(prefix) :].split(".")[0]
                if other != room and other not in rooms[room]:
                    wrong.append(f"{name} imports {target}")
    assert wrong == []


def test_threads_are_started_in_one_place() -> None:
    """``ingest.processes.start_thread`` starts and names every thread of the product."""
    starters = []
    for path in product_modules():
        if path == PRODUCT / "processes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in (
                "threading.Thread",
                "Thread",
            ):
                starters.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert starters == []
