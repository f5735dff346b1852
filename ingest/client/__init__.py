"""The client layer: the sockets to the Kafka cluster (the schema registry client and the
embedded servers' readiness probe open their own).

``BrokerConnection`` is one connection to one broker (framing, pipelining,
timeouts, version negotiation, TLS, SASL); ``Cluster`` bootstraps, keeps the
metadata and leader cache (``metadata_cache.py``), lists offsets per leader
(``offset_lookup.py``) and finds coordinators (``coordinators.py``); ``admin.py``
reads topics and describes groups. Both are
single-owner and start no thread. ``Partition`` is
``ingest.protocol.partition.Partition``, re-exported.
"""

from ingest.client.backoff import Backoff
from ingest.client.client_config import ClientConfig, SaslConfig, Secret, TlsConfig
from ingest.client.cluster import Cluster
from ingest.client.connection import BrokerConnection, InFlight
from ingest.client.metadata_cache import BrokerInfo, ClusterView, PartitionInfo, TopicInfo
from ingest.client.offset_lookup import ListedOffset
from ingest.client.versions import NegotiatedApi, Negotiation, negotiate
from ingest.protocol.partition import Partition

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
    "Partition",
    "PartitionInfo",
    "SaslConfig",
    "Secret",
    "TlsConfig",
    "TopicInfo",
    "negotiate",
]
