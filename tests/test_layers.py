"""Lower layers never import higher ones (DESIGN.md's file map), and the pure layers
touch no socket, thread or clock. Every import counts, those inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What each part of the package may import from the others; everything else is a
# higher layer. Shared modules at the top (errors, redaction, faults, logs, processes, jars, ddl) import
# no part but errors; spark_env (Delta's and S3A's session settings) only jars and errors.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "redaction": set(),
    "faults": set(),
    "logs": set(),
    "processes": set(),
    "jars": {"errors"},
    "spark_env": {"errors", "jars"},
    "ddl": {"errors"},
    "registry": {"errors", "client"},
    "protocol": {"errors"},
    "client": {"errors", "redaction", "protocol"},
    "group": {"errors", "protocol"},
    "handoff": {"errors", "redaction", "protocol"},
    "config": {"errors", "redaction", "ddl", "client", "registry"},
    "worker": {"errors", "logs", "processes", "protocol", "client", "handoff"},
    "sink": {"errors", "redaction", "faults", "protocol", "client", "registry", "handoff"},
    "embedded": {"errors", "protocol"},
    "membership": {"errors", "logs", "processes", "protocol", "client", "group"},
    "formats": {"errors", "protocol", "registry", "sink"},
    "engines": {
        "errors",
        "redaction",
        "faults",
        "processes",
        "ddl",
        "spark_env",
        "config",
        "protocol",
        "client",
        "registry",
        "handoff",
        "sink",
        "formats",
    },
    "testing": {
        "errors",
        "embedded",
        "faults",
        "processes",
        "jars",
        "spark_env",
        "config",
        "protocol",
        "client",
    },
    "supervisor": {
        "errors",
        "faults",
        "logs",
        "processes",
        "spark_env",
        "registry",
        "protocol",
        "client",
        "group",
        "handoff",
        "config",
        "worker",
        "membership",
        "sink",
        "formats",
        "engines",
    },
    "cli": {"errors", "logs", "processes", "config", "client", "embedded", "engines", "supervisor"},
    "__init__": set(),
    "__main__": {"cli"},
}
# Pure: bytes and responses in, messages and requests out; time comes as an argument.
PURE = {"protocol", "group"}
IMPURE_MODULES = {"socket", "ssl", "select", "selectors", "threading", "asyncio", "time"}
IMPURE_MODULES |= {"subprocess", "multiprocessing", "concurrent", "_thread", "queue", "datetime"}


def part_of(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("").parts
    return relative[1]  # ingest/<part>/... or ingest/<module>.py


def imports(path: Path) -> set[str]:
    package = list(path.relative_to(ROOT).parent.parts)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            if module == "ingest":  # from ingest import worker
                found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def sources() -> list[Path]:
    return sorted((ROOT / "ingest").rglob("*.py"))


def test_every_part_is_in_the_table() -> None:
    parts = {part_of(path) for path in sources()}
    assert parts <= ALLOWED.keys(), sorted(parts - ALLOWED.keys())


def test_no_part_imports_a_higher_one() -> None:
    wrong = []
    for path in sources():
        source = part_of(path)
        if source not in ALLOWED:
            continue
        for module in imports(path):
            names = module.split(".")
            if names[0] == "ingest" and len(names) > 1:
                target = names[1]
            else:
                continue
            if target != source and target not in ALLOWED[source]:
                wrong.append(f"{path.relative_to(ROOT)}: {source} imports {module}")
    assert wrong == []


def test_the_pure_layers_use_no_socket_thread_or_clock() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in sources()
        if part_of(path) in PURE
        for module in imports(path)
        if module.split(".")[0] in IMPURE_MODULES
    ]
    assert wrong == []


# The consumer group protocol (KIP-848) sits beside the classic machine, in the pure layer.
CONSUMER_PROTOCOL_MODULES = [
    "ingest/group/consumer/consumer_config.py",
    "ingest/group/consumer/consumer_events.py",
    "ingest/group/consumer/consumer_machine.py",
    "ingest/group/consumer/consumer_member.py",
    "ingest/group/consumer/consumer_requests.py",
    "ingest/group/consumer/consumer_transitions.py",
    "ingest/protocol/messages/consumer_group.py",
    "ingest/protocol/messages/consumer_group_describe.py",
]


def test_the_consumer_protocol_modules_are_pure() -> None:
    listed = {name for name in CONSUMER_PROTOCOL_MODULES if name.startswith("ingest/group/")}
    package = ROOT / "ingest" / "group" / "consumer"
    present = {
        str(path.relative_to(ROOT)) for path in package.glob("*.py") if path.name != "__init__.py"
    }
    assert listed == present
    for name in CONSUMER_PROTOCOL_MODULES:
        path = ROOT / name
        assert part_of(path) in PURE, name
        found = {m.split(".")[1] for m in imports(path) if m.startswith("ingest.")}
        assert found <= {"errors", "protocol", "group"}, (name, found)
        assert not {m.split(".")[0] for m in imports(path)} & IMPURE_MODULES, name


# Inside the group package: the shared root modules (engine, events, inflight, commits, ...)
# below the two protocols' sub-packages, which never import each other.
GROUP_PROTOCOLS = ("classic", "consumer")


def group_imports(path: Path) -> set[str]:
    """``imports``, with ``from ingest.group import x`` also counted as ``ingest.group.x``."""
    found = imports(path)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        if node.module.startswith("ingest.group"):
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_the_group_sub_packages_import_downward_only() -> None:
    """``group/classic`` and ``group/consumer`` import the group's root modules,
    ``ingest.protocol`` and ``ingest.errors``, never each other; a root module never
    imports either of them, except ``ingest/group/__init__.py``, which re-exports both."""
    group = ROOT / "ingest" / "group"
    wrong = []
    seen = dict.fromkeys(GROUP_PROTOCOLS, 0)
    for path in sorted(group.rglob("*.py")):
        parts = path.relative_to(group).parts
        own = parts[0] if len(parts) > 1 else None  # its protocol, or None: a root module
        if own is not None:
            assert own in GROUP_PROTOCOLS, path
            seen[own] += 1
        for module in group_imports(path):
            names = module.split(".")
            if names[0] != "ingest":
                continue
            if own is not None and names[1] not in ("group", "protocol", "errors"):
                wrong.append(f"{path.relative_to(ROOT)}: imports {module}")
            target = names[2] if names[:2] == ["ingest", "group"] and len(names) > 2 else None
            if target not in GROUP_PROTOCOLS or target == own:
                continue
            if own is not None or path.name != "__init__.py":
                wrong.append(f"{path.relative_to(ROOT)}: imports {module}")
    assert wrong == []
    assert all(count > 1 for count in seen.values()), seen
