"""The TOML configuration of ``ingest run | replay | status``, validated on load.

Every section is a frozen pydantic dataclass, declared once: the loader validates the
TOML document against them, and the JSON Schema (``ingest config-schema``) and
``docs/configuration.md`` are generated from them. An unknown key, a wrong type or a bad
value is refused with the file and the dotted key, e.g. ``conf/x.toml: trigger.max_bytes:
expected a size like "256MiB"``. Sizes ("256MiB", "1.5GB", 1048576) and durations ("500ms", "30s",
"5m", 2.5) have their own parsers. Secrets are never written in the file: a
secret key takes the name of an environment variable (``password_env``), read
when the config loads and kept in a masked ``Secret``.

The package, by job (import every name from ``ingest.config``):

* ``units.py``: ``Size``, ``Duration``, their parsers and their JSON Schema; the strict
  scalars and the strings of a shape (host:port, ``SPARK_MASTER``, view names).
* ``kafka.py``: the sections of the Kafka side ([kafka], [source], [fetch]).
* ``registry.py``: [schema_registry] (formats "avro", "protobuf", "json_schema").
* ``sections.py``: the other section dataclasses (types, defaults, descriptions),
  ``IngestConfig`` (and what it gives the layers below: ``client_config``, storage
  options, the dead-letter URI), and ``offsets_topic_partition``.
* ``loader.py``: ``load_config``/``parse_config``: TOML validated against the sections,
  pydantic's errors as ours (``config_error``), secrets from the environment, the checks
  across keys.
* ``render.py``: ``render_config`` for ``--print-config``, ``toml_value``.
* ``config_schema.py``: ``config_schema``, the JSON Schema; ``docs.py`` writes
  ``docs/configuration.md`` from it.
"""

# First, before the modules that import them from here (see sections.py).
from ingest.config.units import SPARK_MASTER, Duration, Size, parse_duration, parse_size

# isort: split
from ingest.config.config_schema import config_schema
from ingest.config.kafka import FetchSection, KafkaSection, SaslSection, SourceSection, TlsSection
from ingest.config.loader import load_config, parse_config
from ingest.config.registry_section import SchemaRegistrySection
from ingest.config.render import render_config, toml_value
from ingest.config.sections import (
    DeadLetterSection,
    HandoffSection,
    IngestConfig,
    LoggingSection,
    MaintenanceSection,
    MetricsSection,
    RouteSection,
    SparkSection,
    TableSection,
    TriggerSection,
    ValueSection,
    WorkerSection,
    offsets_topic_partition,
)

__all__ = [
    "SPARK_MASTER",
    "DeadLetterSection",
    "Duration",
    "FetchSection",
    "HandoffSection",
    "IngestConfig",
    "KafkaSection",
    "LoggingSection",
    "MaintenanceSection",
    "MetricsSection",
    "RouteSection",
    "SaslSection",
    "SchemaRegistrySection",
    "Size",
    "SourceSection",
    "SparkSection",
    "TableSection",
    "TlsSection",
    "TriggerSection",
    "ValueSection",
    "WorkerSection",
    "config_schema",
    "load_config",
    "offsets_topic_partition",
    "parse_config",
    "parse_duration",
    "parse_size",
    "render_config",
    "toml_value",
]
