"""Real servers for tests: a Tansu Kafka broker, a SeaweedFS S3 store, and Kafka helpers.

Users can run their own pipelines against the same servers::

    from ingest.testing import Broker, ProducedRecord, create_topic, produce, read_topic

    with Broker() as broker:
        create_topic(broker.bootstrap, "events", partitions=4)
        produce(broker.bootstrap, "events", [ProducedRecord(b"v", key=b"k")], compression="zstd")
        records = read_topic(broker.bootstrap, "events")
"""

from ingest.testing.broker import Broker, api_versions_answered, tansu_binary
from ingest.testing.kafka import (
    CODECS,
    ConsumedRecord,
    ProducedRecord,
    Transaction,
    create_topic,
    delete_topic,
    produce,
    produce_transactions,
    read_topic,
    unique_name,
)
from ingest.testing.s3 import S3Server
from ingest.testing.verify import Verdict, verify_exact

__all__ = [
    "CODECS",
    "Broker",
    "ConsumedRecord",
    "ProducedRecord",
    "S3Server",
    "Transaction",
    "Verdict",
    "api_versions_answered",
    "create_topic",
    "delete_topic",
    "produce",
    "produce_transactions",
    "read_topic",
    "tansu_binary",
    "unique_name",
    "verify_exact",
]
