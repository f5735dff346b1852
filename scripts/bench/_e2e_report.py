"""What e2e.py prints at its end: the table of every pipeline at every size, the floor of
each size, and the one ``RESULT`` line."""

from __future__ import annotations

from typing import Any

from _floor import Floor
from _pipeline import Measured, gib

LABELS = {
    "ours": "(a) ingest",
    "classic": "(a') ingest, classic group",
    "naive": "(b) naive",
    "read_write": "(c) read + write",
    "ss": "(d) Structured Streaming",
    "kdi": "(e) kafka-delta-ingest",
}
READ_WRITE_PROCESS = "(c') read + write, process"
FLOOR = "(f) floor"

Results = dict[str, dict[str, Any]]


def _rows(label: str) -> int:
    return int(label.split()[0 if not label.startswith("upsert") else 1].replace(",", ""))


def print_table(runs: list[tuple[str, Results]], floors: dict[str, Floor]) -> None:
    print()
    header = f"{'size':26} {'pipeline':26} {'seconds':>8} {'rows/s':>11} {'CPU s':>7}"
    print(f"{header} {'RSS GiB':>8} {'PSS GiB':>8} {'exact':6} lag visible")
    for label, results in runs:
        rows = _rows(label)
        for name, result in results.items():
            m: Measured = result["m"]
            rate = rows / result["seconds"]
            exact = "yes" if result["problem"] is None else "NO"
            print(
                f"{label:26} {LABELS[name]:26} {result['seconds']:8.1f} {rate:11,.0f} "
                f"{m.cpu_seconds:7.1f} {gib(m.peak_rss):8.2f} {gib(m.peak_pss):8.2f} "
                f"{exact:6} {result['lag']}"
            )
            if result["problem"] is not None:
                print(f"{'':26} ^ not exact: {result['problem']}")
            if "process_seconds" in result:
                seconds = result["process_seconds"]
                print(
                    f"{label:26} {READ_WRITE_PROCESS:26} {seconds:8.1f} {rows / seconds:11,.0f} "
                    f"{'':7} {'':8} {'':8} {'':6} n/a"
                )
        floor = floors.get(label)
        if floor is not None:
            print(
                f"{label:26} {FLOOR:26} {floor.seconds:8.2f} {rows / floor.seconds:11,.0f} "
                f"{floor.cpu:7.1f} {'':8} {'':8} {'':6} n/a"
            )
    print("(c: read + write seconds; its memory and CPU include building the Arrow data)")
    print(f"({READ_WRITE_PROCESS}: the same run's wall clock from its process start to its")
    print(" exit, less its untimed Arrow building: Python start, imports, read and write, as (a))")
    print("(f: the CPU seconds of the broker serving the topic to Kafka's consumer performance")
    print(" tool, of pyarrow's JSON parse and of the Parquet write, over the cores: _floor.py)")
    for label, floor in floors.items():
        print(f"({label} floor: {floor.describe()})")
    print("(Structured Streaming keeps its offsets in its checkpoint, kafka-delta-ingest in")
    print(" the Delta log's txn actions; the lag column shows what Kafka's tools can see)")
    if any("kdi" in results for _, results in runs):
        print("(kafka-delta-ingest: seconds and CPU to the commit that completed its table; its")
        print(" -e stops only on a record produced after its start: scripts/bench/_kdi.py)")


def _ratio(results: Results, peer: str) -> float | None:
    if "ours" in results and peer in results:
        return float(results[peer]["seconds"] / results["ours"]["seconds"])
    return None


def result_line(
    runs: list[tuple[str, Results]],
    sizes: list[tuple[int, int]],
    floors: dict[str, Floor],
    upsert: Results | None,
    avro: Results | None = None,
    latencies: list[dict[str, Any]] | None = None,
) -> str:
    """``RESULT key=value ...``: wall time ratios, theirs over ours (above 1: ingest is
    faster), at the largest 100-byte size unless the key says otherwise."""
    by_size = {size: (label, results) for size, (label, results) in zip(sizes, runs, strict=False)}
    small = [s for s in sizes if s[1] == 100]
    parts: list[str] = []
    if small:
        label, largest = by_size[max(small)]
        for key, peer in (("vs_ss", "ss"), ("vs_kdi", "kdi"), ("vs_naive", "naive")):
            value = _ratio(largest, peer)
            if value is not None:
                parts.append(f"{key}={value:.2f}")
        if label in floors and "ours" in largest:
            parts.append(f"vs_floor={floors[label].seconds / largest['ours']['seconds']:.2f}")
        value = _ratio(largest, "read_write")
        if value is not None:
            parts.append(f"vs_read_write={value:.2f}")
    if upsert:
        value = _ratio(upsert, "ss")
        if value is not None:
            parts.append(f"upsert_vs_ss={value:.2f}")
        if "ours" in upsert:
            parts.append(f"upsert_rss_gib={gib(upsert['ours']['m'].peak_rss):.2f}")
    if avro:
        value = _ratio(avro, "ss")
        if value is not None:
            parts.append(f"avro_vs_ss={value:.2f}")
    for key, size, peer in (
        ("small_vs_naive", (500_000, 100), "naive"),
        ("small_vs_read_write", (100_000, 100), "read_write"),
    ):
        value = _ratio(by_size.get(size, ("", {}))[1], peer)
        if value is not None:
            parts.append(f"{key}={value:.2f}")
    at_100k = by_size.get((100_000, 100), ("", {}))[1]
    if "ours" in at_100k and "process_seconds" in at_100k.get("read_write", {}):
        # Beside small_vs_read_write: (c) timed as a process, as ours is.
        whole = at_100k["read_write"]["process_seconds"] / at_100k["ours"]["seconds"]
        parts.append(f"small_vs_read_write_process={whole:.2f}")
    for r in latencies or []:
        prefix = "" if r["pipeline"] == "ours" else "ss_"
        parts.append(f"{prefix}p99_{r['trigger']:g}s={r['p99']:.2f}")
    every = [r for _, results in runs for r in results.values()] + list(latencies or [])
    exact = all(r["problem"] is None for r in every)
    parts.append(f"exact={str(exact).lower()}")
    if small and "ours" in by_size[max(small)][1]:
        parts.append(f"peak_rss_gib={gib(by_size[max(small)][1]['ours']['m'].peak_rss):.2f}")
    return "RESULT " + " ".join(parts)
