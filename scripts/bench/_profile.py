"""Where a run's CPU goes, by stage, over its whole process tree (e2e.py ``--profile``).

Linux ``perf`` samples every thread of the run and its children (supervisor, fork server,
workers, task processes, Arrow's threads) on the ``cpu-clock`` event with call chains.
Each sample's stage is read from its chain, leaf first, by the table ``STAGES``: the first
frame outside the kernel and libc that a row names decides, so a page fault taken in the
JSON parser or a ``memcpy`` under the Parquet writer counts to that stage; a chain with no
such frame counts by its leaf (the kernel's receive path, page faults, libc). Python has
no perf map before 3.12, so time in the interpreter is one stage ("Python code") but for
the parser and compiler (modules compiled at start when no bytecode is cached) and the
garbage collector, which have their own C functions.

Limit: ``perf record -g`` follows frame pointers, and pyarrow's libraries are built without
them, so a chain through Arrow is often cut short: part of the JSON parse and the Parquet
write then counts as "Arrow, other" or "other (libc, unknown frames)" (a leaf in Arrow's
buffers or in libc's memcpy with no caller). Read those stages as mostly the task
processes' parse and write; ``--call-graph dwarf`` would unwind them, at a far larger cost.

``perf`` is the Debian package ``linux-perf``; it needs ``kernel.perf_event_paranoid`` at
most 2 (the default) for a process's own tree.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

# (stage, substrings of a frame "symbol (dso)"): the first row a frame matches names it.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("JSON parse (Arrow's reader)", ("arrow::json", "rapidjson")),
    ("Parquet write (encode, snappy, statistics)", ("libparquet", "snappy::")),
    ("record-batch decode (ingest's C kernel)", ("_records.cpython",)),
    (
        "compiling modules (no bytecode cache)",
        ("_PyPegen", "_PyParser", "tok_get", "compiler_", "assemble", "_PyAST", "PyAST_"),
    ),
    ("Python garbage collector", ("gc_collect", "visit_decref", "visit_reachable")),
    ("numpy's OpenBLAS threads", ("openblas",)),
    ("loading shared libraries", ("ld-linux",)),
    ("Arrow, other (IPC, buffers, compute)", ("libarrow",)),
    ("numpy", ("_multiarray_umath",)),
    ("Python code (interpreter)", ("libpython",)),
)
# A chain with no frame above: its leaf, by these rows.
KERNEL_STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kernel: network receive", ("tcp_", "sock_", "skb", "_copy_to_iter", "inet_")),
    ("kernel: page faults, fresh pages", ("page_fault", "clear_page", "folio", "do_anonymous")),
    ("kernel: files (handoff, table)", ("ext4", "vfs_", "filemap", "shmem", "copy_folio")),
)
OTHER_KERNEL = "kernel: other (scheduling, syscalls)"
OTHER = "other (libc, unknown frames)"


def perf_argv(perf: str, out: Path) -> list[str]:
    """The command a run goes under (``ingest_until_end(wrap=...)``)."""
    return [perf, "record", "-e", "cpu-clock", "-F", "999", "-g", "-q", "-o", str(out), "--"]


def find_perf() -> str:
    found = shutil.which("perf")
    if found is None:
        raise RuntimeError("--profile needs Linux perf: apt-get install linux-perf")
    return found


def _stage(frames: Sequence[str]) -> str:
    for frame in frames:  # leaf first
        if "[kernel" in frame or "libc.so" in frame:
            continue
        for stage, marks in STAGES:
            if any(mark in frame for mark in marks):
                return stage
    leaf = frames[0] if frames else ""
    if "[kernel" in leaf:
        for stage, marks in KERNEL_STAGES:
            if any(any(mark in frame for mark in marks) for frame in frames):
                return stage
        return OTHER_KERNEL
    return OTHER


def _kind(comm: str) -> str:
    if comm.startswith("ingest-task"):
        return "task processes"
    if comm.startswith("ingest-worker"):
        return "workers"
    return "supervisor, fork server"


def stages(perf: str, data: Path) -> dict[tuple[str, str], float]:
    """CPU seconds by (stage, process kind) from ``perf record``'s ``data``."""
    script = subprocess.run(
        [perf, "script", "-i", str(data), "-F", "comm,period,ip,sym,dso"],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    spent: dict[tuple[str, str], float] = defaultdict(float)
    for block in script.split("\n\n"):
        lines = [line.strip() for line in block.strip().splitlines()]
        if not lines:
            continue
        head = lines[0].split()
        comm, period = " ".join(head[:-1]), int(head[-1])
        frames = [line.split(" ", 1)[1] if " " in line else line for line in lines[1:]]
        spent[(_stage(frames), _kind(comm))] += period / 1e9
    return dict(spent)


def print_stages(spent: dict[tuple[str, str], float]) -> None:
    total = sum(spent.values())
    by_stage: dict[str, float] = defaultdict(float)
    for (stage, _), seconds in spent.items():
        by_stage[stage] += seconds
    print(f"\n{'stage':46} {'CPU s':>7} {'share':>6}  by process")
    for stage, seconds in sorted(by_stage.items(), key=lambda item: -item[1]):
        kinds = sorted(
            ((kind, s) for (st, kind), s in spent.items() if st == stage), key=lambda i: -i[1]
        )
        split = ", ".join(f"{kind} {s:.2f}" for kind, s in kinds)
        print(f"{stage:46} {seconds:7.2f} {seconds / total:6.1%}  {split}")
    print(f"{'total (perf samples)':46} {total:7.2f}")
