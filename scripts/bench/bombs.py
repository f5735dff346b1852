"""Compression bombs end to end: memory stays bounded whatever the ratio (issue 37).

One Apache Kafka node and a one-partition topic holding ``--bombs`` records that are each a
``--bomb-mib`` MiB value of zeros, zstd-compressed (about 2 KB each on the wire, one batch
each), among ``--ordinary`` ordinary 100-byte records before, between and after them. Then
``ingest run --until-end`` with the product's defaults (binary values, the local engine
where it applies, ``[fetch] max_decode_bytes`` and ``max_record_bytes`` at 64 MiB), its
process tree sampled every 0.25 s.

The run must exit 0 and every offset must end in exactly one table: a bomb within
``max_record_bytes`` lands as a row whose value is all zeros of the right length, one over it
is a dead letter naming its size. The target is a peak RSS of the tree (summed, and PSS, which
counts the memory-mapped handoff pages once) under 2 GiB.

    .venv/bin/python scripts/bench/bombs.py [--bombs 100] [--bomb-mib 60] [--ordinary 2000]

The last line is ``RESULT bombs=.. bomb_mib=.. wire_kib=.. seconds=.. peak_rss_gib=..
peak_pss_gib=.. landed=.. dead_letters=.. exact=.. met=..``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _pipeline import gib, ingest_argv, load_average, machine, run_measured

from ingest.testing import KafkaCluster, create_topic, unique_name
from ingest.testing.configs import write_toml

LIMIT_GIB = 2.0


def produce(bootstrap: str, topic: str, bombs: int, bomb_bytes: int, ordinary: int) -> list[str]:
    """Produces the topic in offset order; returns each offset's kind ("bomb"/"ordinary")."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": "zstd",
            "message.max.bytes": bomb_bytes + 1_000_000,
            "batch.size": 1_000_000,
            "linger.ms": 5,
        }
    )
    zeros = bytes(bomb_bytes)
    kinds: list[str] = []
    between = max(1, ordinary // (bombs + 1))
    errors: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    made = 0
    for bomb in range(bombs + 1):
        for _ in range(between if bomb < bombs else ordinary - made):
            producer.produce(topic, b"ordinary-%09d" % made + b"." * 82, on_delivery=delivered)
            kinds.append("ordinary")
            made += 1
        producer.flush(60)
        if bomb < bombs:
            producer.produce(topic, zeros, on_delivery=delivered)
            producer.flush(60)  # its own batch
            kinds.append("bomb")
    if producer.flush(120) or errors:
        raise RuntimeError(f"produce failed: {errors[:3]}")
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bombs", type=int, default=100)
    parser.add_argument("--bomb-mib", type=int, default=60)
    parser.add_argument("--ordinary", type=int, default=2_000)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="ingest-bombs-"))
    print(f"# {machine()}; load average {load_average()}; work {work}", flush=True)
    bomb_bytes = args.bomb_mib * 2**20
    with KafkaCluster(1) as broker:
        topic = unique_name("bombs")
        create_topic(broker.bootstrap, topic, partitions=1)
        kinds = produce(broker.bootstrap, topic, args.bombs, bomb_bytes, args.ordinary)
        wire = sum(p.stat().st_size for p in broker.work_dir.rglob(f"{topic}-0/*.log"))
        table = work / "table"
        config = write_toml(
            work / "ingest.toml",
            {
                "kafka": {"bootstrap_servers": [broker.bootstrap]},
                "source": {"topics": [topic], "group_id": unique_name("bombs")},
                "table": {"uri": str(table)},
            },
        )
        measured = run_measured(
            ingest_argv(config, "--until-end"), log=work / "run.log", timeout=1800
        )
    from deltalake import DeltaTable

    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["offset", "value"])
    sizes = pc.binary_length(rows.column("value")).to_pylist()
    landed = dict(zip(rows.column("offset").to_pylist(), sizes, strict=True))
    try:
        dead_rows = DeltaTable(f"{table}_dead_letters").to_pyarrow_table(columns=["offset"])
        dead = dead_rows.column("offset").to_pylist()
    except Exception:  # no dead-letter table: none written
        dead = []
    bomb_lands = bomb_bytes <= 64 * 2**20
    problems: list[str] = []
    if measured.returncode != 0:
        problems.append(f"exit {measured.returncode}")
    if sorted([*landed, *dead]) != list(range(len(kinds))):
        problems.append("offsets are not each in one table once")
    for offset, kind in enumerate(kinds):
        if kind == "bomb" and bomb_lands and landed.get(offset) != bomb_bytes:
            problems.append(f"bomb at {offset}: {landed.get(offset)} bytes landed")
            break
    zero_rows = rows.filter(pc.equal(pc.binary_length(rows.column("value")), bomb_bytes))
    if (
        bomb_lands
        and zero_rows.num_rows
        and pc.any(pc.not_equal(zero_rows.column("value"), zero_rows.column("value")[0])).as_py()
    ):
        problems.append("a landed bomb is not all zeros")
    for problem in problems:
        print(f"# problem: {problem}")
    peak_rss, peak_pss = gib(measured.peak_rss), gib(measured.peak_pss)
    met = not problems and peak_rss < LIMIT_GIB
    print(
        f"RESULT bombs={args.bombs} bomb_mib={args.bomb_mib} wire_kib={wire / 1024:.0f} "
        f"seconds={measured.seconds:.1f} peak_rss_gib={peak_rss:.2f} "
        f"peak_pss_gib={peak_pss:.2f} landed={len(landed)} dead_letters={len(dead)} "
        f"exact={'true' if not problems else 'false'} met={'true' if met else 'false'}"
    )


if __name__ == "__main__":
    main()
