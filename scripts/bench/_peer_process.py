"""The peers of e2e.py as processes of their own (``e2e.py --peer NAME``), and what
Kafka's tools would show of each pipeline's group."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from _pipeline import run_measured

from ingest.testing import unique_name

E2E = Path(__file__).resolve().with_name("e2e.py")


def peer_seconds(log: Path) -> dict[str, float]:
    for line in log.read_text().splitlines():
        if line.startswith("PEER "):
            return {k: float(v) for k, v in json.loads(line[5:]).items()}
    raise RuntimeError(f"the peer printed no result; log: {log}")


def run_peer_process(
    peer: str,
    workdir: Path,
    bootstrap: str,
    topic: str,
    ends: dict[int, int],
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Runs ``e2e.py --peer peer`` (``extra``: more of its arguments) into ``workdir/peer``,
    measured; its seconds (wall clock, or (c)'s timed phases), phases and table."""
    log = workdir / f"{peer}.log"
    table = workdir / peer
    group = unique_name(peer)
    argv = [
        sys.executable,
        str(E2E),
        *("--peer", peer, "--bootstrap", bootstrap, "--topic", topic),
        *("--group", group, "--table", str(table)),
        *("--ends", ",".join(f"{p}:{n}" for p, n in ends.items())),
        *extra,
    ]
    measured = run_measured(argv, log=log, timeout=3600)
    if measured.returncode != 0:
        raise RuntimeError(f"{peer} exited {measured.returncode}; log: {log}")
    spent = peer_seconds(log)
    # (c) is its two timed phases; the others are wall clock, as ours.
    seconds = spent["read"] + spent["write"] if peer == "read_write" else measured.seconds
    phases = " ".join(f"{k}={v:.1f}s" for k, v in spent.items())
    result = {"m": measured, "seconds": seconds, "group": group, "phases": phases, "table": table}
    if peer == "read_write":
        # (c) as a process of its own, as ours is timed: wall clock from its start
        # (Python, imports, the consumer's start) to its exit, less the Arrow building
        # between its two timed phases, which no pipeline does that way.
        result["process_seconds"] = measured.seconds - spent["prepare_untimed"]
    return result


# -- what kafka-consumer-groups would show ------------------------------------------------------


def committed_lag(bootstrap: str, group: str | None, topic: str, ends: dict[int, int]) -> str:
    """The group's lag from its committed offsets, or why there is none to see."""
    if group is None:
        return "n/a"
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in ends], timeout=10)
    finally:
        consumer.close()
    offsets = {tp.partition: tp.offset for tp in committed if tp.offset >= 0}
    if not offsets:
        return "no (none committed)"
    lag = sum(end - offsets.get(p, 0) for p, end in ends.items())
    return f"yes (lag {lag})"


def spark_source_groups(bootstrap: str) -> list[str]:
    """Groups named like Spark's Kafka source's (``spark-kafka-source-...``)."""
    from confluent_kafka.admin import AdminClient

    listed = AdminClient({"bootstrap.servers": bootstrap}).list_consumer_groups().result(30)
    return [g.group_id for g in listed.valid if g.group_id.startswith("spark-kafka-source")]
