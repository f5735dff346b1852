"""Topic, producer and reference-reader helpers built on confluent-kafka (librdkafka).

confluent-kafka is a test dependency only: these helpers produce test data and
read topics back as the ground truth that our own client is checked against.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ingest.errors import HarnessError, KafkaConnectionError

Compression = Literal["none", "gzip", "snappy", "lz4", "zstd"]
CODECS: tuple[Compression, ...] = ("none", "gzip", "snappy", "lz4", "zstd")
Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True)
class ProducedRecord:
    value: bytes | None
    key: bytes | None = None
    partition: int | None = None
    headers: Headers | None = None
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class ConsumedRecord:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    timestamp_type: int  # 0 CreateTime, 1 LogAppendTime (Kafka's numbering)
    key: bytes | None
    value: bytes | None
    headers: Headers = field(default_factory=list)


@dataclass(frozen=True)
class Transaction:
    """Records produced in one transaction, then committed or aborted."""

    records: Sequence[ProducedRecord]
    commit: bool = True


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 4,
    *,
    timeout: float = 15.0,
    config: dict[str, str] | None = None,
    replication_factor: int = -1,
) -> str:
    """Creates a topic with N partitions and waits until its metadata shows them all.
    ``replication_factor`` -1 takes the broker's ``default.replication.factor`` (1 on one
    node, 3 on the harness's 3-node cluster)."""
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    admin = _admin(bootstrap)
    futures = admin.create_topics(
        [
            NewTopic(
                name,
                num_partitions=partitions,
                replication_factor=replication_factor,
                config=config or {},
            )
        ],
        operation_timeout=timeout,
    )
    try:
        futures[name].result(timeout)
    except Exception as exc:
        raise HarnessError(f"create topic {name!r} with {partitions} partitions: {exc}") from exc
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        meta = admin.list_topics(name, timeout=5)
        topic = meta.topics.get(name)
        if (
            topic is not None
            and topic.error is None
            and len(topic.partitions) == partitions
            and _every_broker_shows(
                [(broker.host, broker.port) for broker in meta.brokers.values()], name, partitions
            )
        ):
            return name
        time.sleep(0.05)
    raise HarnessError(f"topic {name!r} did not show {partitions} partitions within {timeout}s")


def _every_broker_shows(brokers: Sequence[tuple[str, int]], name: str, partitions: int) -> bool:
    """Whether each broker's own metadata shows the topic's partitions, each with a
    leader. A broker learns of a new topic from the controller's metadata log a little
    after the others: a client that asks that broker first (librdkafka picks any) would
    find the topic without partitions, so one broker's answer is not enough on a
    cluster."""
    from ingest.client import BrokerConnection, ClientConfig
    from ingest.protocol.messages import MetadataRequest, MetadataRequestTopic, MetadataResponse

    for host, port in brokers:
        config = ClientConfig(bootstrap_servers=f"{host}:{port}", request_timeout=5.0)
        try:
            with BrokerConnection(host, port, config) as connection:
                connection.connect(within=5.0)
                request = MetadataRequest(
                    topics=(MetadataRequestTopic(name=name),), allow_auto_topic_creation=False
                )
                version = connection.version_for(MetadataRequest.api_key)
                response = connection.request(request, version=version)
        except KafkaConnectionError:  # a broker just killed or restarting: ask again
            return False
        assert isinstance(response, MetadataResponse)
        shown = [
            partition
            for topic in response.topics
            if topic.name == name and topic.error_code == 0
            for partition in topic.partitions
            if partition.error_code == 0 and partition.leader_id >= 0
        ]
        if len(shown) != partitions:
            return False
    return True


def delete_topic(bootstrap: str, name: str, *, timeout: float = 15.0) -> None:
    admin = _admin(bootstrap)  # held: a collected client fails its futures (_DESTROY)
    futures = admin.delete_topics([name], operation_timeout=timeout)
    futures[name].result(timeout)


def set_group_configs(
    bootstrap: str, group: str, configs: Mapping[str, int | str], *, timeout: float = 15.0
) -> None:
    """Sets a consumer group's own configs (Kafka 3.8+, e.g. a KIP-848 group's
    ``consumer.heartbeat.interval.ms`` and ``consumer.session.timeout.ms``, which are the
    coordinator's, not the member's), before or while members join."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    entries = [
        ConfigEntry(name, str(value), incremental_operation=AlterConfigOpType.SET)
        for name, value in configs.items()
    ]
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    admin = _admin(bootstrap)  # kept alive until the futures are done
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=timeout)


def _producer(bootstrap: str, compression: Compression, extra: dict[str, Any]) -> Any:
    from confluent_kafka import Producer

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "compression.type": compression,
        "linger.ms": 20,
        "batch.size": 1_000_000,
        # Tansu can lose acknowledged idempotent writes across a crash (see
        # docs/kafka-compat.md); tests that crash the broker pass
        # enable.idempotence=False explicitly, the rest keep librdkafka's default.
    }
    conf.update(extra)
    return Producer(conf)


def _send(producer: Any, topic: str, record: ProducedRecord, errors: list[str]) -> None:
    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    kwargs: dict[str, Any] = {"value": record.value, "key": record.key, "on_delivery": on_delivery}
    if record.partition is not None:
        kwargs["partition"] = record.partition
    if record.headers is not None:
        kwargs["headers"] = record.headers
    if record.timestamp_ms is not None:
        kwargs["timestamp"] = record.timestamp_ms
    while True:
        try:
            producer.produce(topic, **kwargs)
            return
        except BufferError:
            producer.poll(0.05)


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[ProducedRecord],
    *,
    compression: Compression = "none",
    timeout: float = 60.0,
    **producer_conf: Any,
) -> int:
    """Produces records and waits for every delivery report; raises on any failure."""
    producer = _producer(
        bootstrap, compression, {k.replace("_", "."): v for k, v in producer_conf.items()}
    )
    errors: list[str] = []
    count = 0
    for record in records:
        _send(producer, topic, record, errors)
        count += 1
        if count % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(timeout)
    if remaining:
        raise HarnessError(f"{remaining} records to {topic!r} not delivered within {timeout}s")
    if errors:
        raise HarnessError(f"{len(errors)} records to {topic!r} failed: {errors[:3]}")
    return count


def produce_transactions(
    bootstrap: str,
    topic: str,
    transactions: Iterable[Transaction],
    *,
    compression: Compression = "none",
    timeout: float = 60.0,
) -> int:
    """Runs each transaction in turn, committing or aborting it. Returns committed records."""
    producer = _producer(
        bootstrap,
        compression,
        {"transactional.id": unique_name("ingest-txn"), "enable.idempotence": True},
    )
    producer.init_transactions(timeout)
    errors: list[str] = []
    committed = 0
    for txn in transactions:
        producer.begin_transaction()
        for record in txn.records:
            _send(producer, topic, record, errors)
        if txn.commit:
            producer.commit_transaction(timeout)
            committed += len(txn.records)
        else:
            producer.flush(timeout)  # the records reach the log before the abort marker
            producer.abort_transaction(timeout)
    if errors:
        raise HarnessError(f"{len(errors)} transactional records failed: {errors[:3]}")
    return committed


def _header_pairs(headers: Any) -> Headers:
    # librdkafka gives a list of (key, value) pairs; values are bytes or None.
    return [(str(key), value) for key, value in headers or ()]


def read_topic(
    bootstrap: str, topic: str, *, isolation_level: str = "read_committed", timeout: float = 60.0
) -> list[ConsumedRecord]:
    """Reads a whole topic from the start to its current end, through librdkafka.

    The end is where each partition reports EOF, which librdkafka derives from
    the Fetch high watermark (or last stable offset). ListOffsets "latest" is not
    used: the test broker answers it wrongly (docs/kafka-compat.md).
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_name("ingest-reference-reader"),
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation_level,
            "fetch.queue.backoff.ms": 10,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=10)
        info = meta.topics.get(topic)
        if info is None or info.error is not None:
            raise HarnessError(
                f"topic {topic!r} not found: {info.error if info else 'no metadata'}"
            )
        partitions = sorted(info.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        pending = set(partitions)
        out: list[ConsumedRecord] = []
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise HarnessError(
                    f"reading {topic!r}: partitions {sorted(pending)} never reached EOF"
                )
            for msg in consumer.consume(10_000, 0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                        continue
                    raise HarnessError(f"reading {topic!r}: {err}")
                pending.add(msg.partition())  # more data arrived after an EOF
                ts_type, ts = msg.timestamp()
                partition, offset = msg.partition(), msg.offset()
                assert partition is not None and offset is not None  # set on data messages
                out.append(
                    ConsumedRecord(
                        topic=topic,
                        partition=partition,
                        offset=offset,
                        timestamp_ms=ts,
                        # librdkafka: 1 = CreateTime, 2 = LogAppendTime; Kafka: 0 and 1.
                        timestamp_type=ts_type - 1,
                        key=msg.key(),
                        value=msg.value(),
                        headers=_header_pairs(msg.headers()),
                    )
                )
        out.sort(key=lambda r: (r.partition, r.offset))
        return out
    finally:
        consumer.close()
