"""Fetch sessions (KIP-227) on or off: what the fetchers send and what the broker spends.

On one Apache Kafka node of its own, P partitions, one ``PartitionFetcher`` a partition,
each on its own connection and thread (as each worker process has one), in two phases:

* busy: every fetcher drains its partition (``--records`` in all, 100 B values, uncompressed)
  in answers of at most 256 KiB;
* idle: every fetcher sits at the log end for ``--idle-seconds``, long-polling
  (``max_wait_ms`` 500) with nothing new.

For each phase and mode: Fetch requests sent, request bytes (frames as written to the
socket), and the broker JVM's CPU seconds (utime + stime of its process, from /proc).
Modes alternate, ``--repeat`` times each; the best (least CPU) run of each is shown.

    .venv/bin/python scripts/bench/fetch_sessions.py             # 8 partitions, ~1.5 min
    .venv/bin/python scripts/bench/fetch_sessions.py --partitions 32 --idle-seconds 20

The last line is ``RESULT idle_bytes=<sessions/full> idle_broker_cpu=<sessions/full>
busy_bytes=<..> busy_broker_cpu=<..>``: below 1 means sessions send or cost less.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ingest.client import ClientConfig, Cluster
from ingest.client.connection import BrokerConnection
from ingest.protocol.messages import FetchRequest
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce, unique_name
from ingest.worker import FetchSettings, PartitionFetcher, StartPosition

VALUE = b"v" * 100
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


class Counted:
    """Fetch frames and their bytes, counted where a connection writes them."""

    def __init__(self) -> None:
        self.frames = 0
        self.bytes = 0
        self._lock = threading.Lock()
        original = BrokerConnection._send_frame
        counter = self

        def send_frame(connection: BrokerConnection, frame: bytearray, ticket: Any) -> None:
            if ticket.api_key == FetchRequest.api_key:
                with counter._lock:
                    counter.frames += 1
                    counter.bytes += len(frame)
            original(connection, frame, ticket)

        BrokerConnection._send_frame = send_frame  # type: ignore[method-assign]

    def take(self) -> tuple[int, int]:
        with self._lock:
            taken = (self.frames, self.bytes)
            self.frames = self.bytes = 0
        return taken


def run_mode(
    kafka: KafkaCluster, topic: str, partitions: int, end: int, idle: float, sessions: bool
) -> dict[str, Any]:
    counted = COUNTED
    clusters = [Cluster(ClientConfig(bootstrap_servers=kafka.bootstrap)) for _ in range(partitions)]
    # 256 KiB answers: the busy phase takes many Fetches, as a worker's prefetch does.
    settings = FetchSettings(
        max_wait_ms=500, partition_max_bytes=256 * 1024, incremental_sessions=sessions
    )
    fetchers = [
        PartitionFetcher(clusters[p], topic, p, settings, start=StartPosition.earliest())
        for p in range(partitions)
    ]
    pid = kafka.nodes[0].pid
    assert pid is not None
    out: dict[str, Any] = {"mode": "sessions" if sessions else "full"}
    try:
        counted.take()
        for phase, until in (("busy", None), ("idle", idle)):
            stop = threading.Event()

            def loop(
                fetcher: PartitionFetcher,
                until: float | None = until,
                stop: threading.Event = stop,
            ) -> None:
                while not stop.is_set():
                    fetcher.poll(prefetch=until is not None)
                    if until is None and (fetcher.position or 0) >= end:
                        return

            cpu, began = cpu_seconds(pid), time.monotonic()
            threads = [threading.Thread(target=loop, args=(f,)) for f in fetchers]
            for thread in threads:
                thread.start()
            if until is not None:
                time.sleep(until)
                stop.set()
            for thread in threads:
                thread.join()
            seconds = time.monotonic() - began
            frames, sent = counted.take()
            out[phase] = {
                "seconds": seconds,
                "requests": frames,
                "requests_per_s": frames / seconds,
                "bytes": sent,
                "bytes_per_request": sent / max(frames, 1),
                "broker_cpu_s": cpu_seconds(pid) - cpu,
            }
    finally:
        for fetcher in fetchers:
            fetcher.close()
        for cluster in clusters:
            cluster.close()
    return out


COUNTED: Counted


def main() -> None:
    global COUNTED
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--records", type=int, default=400_000, help="in all")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    per = args.records // args.partitions
    COUNTED = Counted()
    runs: dict[str, list[dict[str, Any]]] = {"sessions": [], "full": []}
    with KafkaCluster(1) as kafka:
        topic = unique_name("bench-sessions")
        create_topic(kafka.bootstrap, topic, partitions=args.partitions)
        produce(
            kafka.bootstrap,
            topic,
            (
                ProducedRecord(VALUE, partition=p)
                for p in range(args.partitions)
                for _ in range(per)
            ),
            compression="none",  # identical values compress to nothing: keep the bytes
        )
        print(f"# Apache Kafka 4.4, {args.partitions} partitions x {per:,} records", flush=True)
        for _ in range(args.repeat):
            for sessions in (True, False):
                result = run_mode(kafka, topic, args.partitions, per, args.idle_seconds, sessions)
                runs[result["mode"]].append(result)
                print(
                    f"{result['mode']:8}  "
                    + "  ".join(
                        f"{phase}: {r['requests']} req ({r['requests_per_s']:.1f}/s), "
                        f"{r['bytes_per_request']:.0f} B/req, broker CPU {r['broker_cpu_s']:.2f} s"
                        f" in {r['seconds']:.1f} s"
                        for phase in ("busy", "idle")
                        for r in [result[phase]]
                    ),
                    flush=True,
                )
    best = {
        mode: {
            phase: min((r[phase] for r in results), key=lambda x: x["broker_cpu_s"])
            for phase in ("busy", "idle")
        }
        for mode, results in runs.items()
    }
    print("\n| phase | mode | requests/s | bytes/request | request bytes/s | broker CPU s |")
    print("|---|---|---|---|---|---|")
    for phase in ("busy", "idle"):
        for mode in ("sessions", "full"):
            r = best[mode][phase]
            print(
                f"| {phase} | {mode} | {r['requests_per_s']:.1f} | {r['bytes_per_request']:.0f} "
                f"| {r['bytes'] / r['seconds']:.0f} | {r['broker_cpu_s']:.2f} |"
            )

    def ratio(phase: str, key: str) -> float:
        s, f = best["sessions"][phase], best["full"][phase]
        if key == "bytes":
            return (s["bytes"] / s["seconds"]) / max(f["bytes"] / f["seconds"], 1e-9)
        return s[key] / max(f[key], 1e-9)

    print(
        f"RESULT idle_bytes={ratio('idle', 'bytes'):.2f} "
        f"idle_broker_cpu={ratio('idle', 'broker_cpu_s'):.2f} "
        f"busy_bytes={ratio('busy', 'bytes'):.2f} busy_broker_cpu={ratio('busy', 'broker_cpu_s'):.2f}"
    )


if __name__ == "__main__":
    main()
