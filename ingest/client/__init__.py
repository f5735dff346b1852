"""The client layer: the only part of ingest that opens sockets.

``BrokerConnection`` is one connection to one broker (framing, pipelining,
timeouts, version negotiation, TLS, SASL); ``Cluster`` bootstraps, keeps the
metadata and leader cache, and finds coordinators. Both are single-owner and
start no thread.
"""

from ingest.client.backoff import Backoff
from ingest.client.cluster import (
    BrokerInfo,
    Cluster,
    ClusterView,
    ListedOffset,
    PartitionInfo,
    TopicInfo,
    TopicPartition,
)
from ingest.client.config import ClientConfig, SaslConfig, Secret, TlsConfig
from ingest.client.connection import BrokerConnection, InFlight
from ingest.client.versions import NegotiatedApi, Negotiation, negotiate

__all__ = [
    "Backoff",
    "BrokerConnection",
    "BrokerInfo",
    "ClientConfig",
    "Cluster",
    "ClusterView",
    "InFlight",
    "ListedOffset",
    "NegotiatedApi",
    "Negotiation",
    "PartitionInfo",
    "SaslConfig",
    "Secret",
    "TlsConfig",
    "TopicInfo",
    "TopicPartition",
    "negotiate",
]
