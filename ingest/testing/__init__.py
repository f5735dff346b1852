"""Real servers for tests: Apache Kafka (one node or three), the Tansu broker, a SeaweedFS
S3 store, a Spark standalone cluster (a master and two workers), a schema registry
(Apicurio, Confluent's API), a Hive metastore (Spark's catalog for tables by name), and Kafka
helpers; programs out of Debian packages
(``debian_tool``, e.g. Prometheus' ``promtool``) fetched into the cache; several hosts on
one machine as network namespaces (``HostNetwork``, ``ingest.testing.netns``), where
``KafkaCluster(3, hosts=...)`` and ``S3Server(on=host)`` run.

Users can run their own pipelines against the same servers::

    from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce, read_topic

    with KafkaCluster() as broker:
        create_topic(broker.bootstrap, "events", partitions=4)
        produce(broker.bootstrap, "events", [ProducedRecord(b"v", key=b"k")], compression="zstd")
        records = read_topic(broker.bootstrap, "events")
"""

from ingest.embedded.probe import api_versions_answered
from ingest.embedded.seaweedfs import S3Server
from ingest.embedded.tansu import TansuBroker, tansu_binary
from ingest.testing.apache_kafka import KAFKA_VERSION, KafkaCluster, message_definition
from ingest.testing.debian import debian_tool
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
    set_group_configs,
    unique_name,
)
from ingest.testing.metastore import HiveMetastore
from ingest.testing.netns import Host, HostNetwork
from ingest.testing.registry import SchemaRegistry
from ingest.testing.spark_cluster import SparkCluster
from ingest.testing.verify import Verdict, verify_exact
from ingest.testing.verify_upsert import Change, verify_upsert

__all__ = [
    "CODECS",
    "KAFKA_VERSION",
    "Change",
    "ConsumedRecord",
    "HiveMetastore",
    "Host",
    "HostNetwork",
    "KafkaCluster",
    "ProducedRecord",
    "S3Server",
    "SchemaRegistry",
    "SparkCluster",
    "TansuBroker",
    "Transaction",
    "Verdict",
    "api_versions_answered",
    "create_topic",
    "debian_tool",
    "delete_topic",
    "message_definition",
    "produce",
    "produce_transactions",
    "read_topic",
    "set_group_configs",
    "tansu_binary",
    "unique_name",
    "verify_exact",
    "verify_upsert",
]
