"""A real Hive metastore for tests: Hive's standalone Thrift metastore server on 127.0.0.1.

The server is ``org.apache.hadoop.hive.metastore.HiveMetaStore`` from the Hive 2.3 jars
pyspark itself ships (``hive-metastore``, ``hive-exec``, DataNucleus, Derby): the same
client library Spark's session catalog speaks, so nothing is downloaded. It keeps its
catalog in an embedded Derby database in its own work directory (schema created on first
start), serves any number of clients over Thrift (each ``ingest`` process and the test's own
Spark session, at once: an embedded Derby metastore admits one JVM), and logs to a file a
failing test shows. A Spark session reaches it with ``spark_conf``::

    from ingest.testing.metastore import HiveMetastore

    with HiveMetastore() as metastore:
        conf = metastore.spark_conf  # [spark] conf of an ingest config, or a session's
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

from ingest.embedded.managed import ManagedProcess, ProcessServer, free_port
from ingest.errors import DependencyError

__all__ = ["HiveMetastore"]

READY_TIMEOUT_S = 90.0
JVM_OPTIONS = ("-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


def _pyspark_jars() -> Path:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    if not any(jars.glob("hive-metastore-*.jar")):
        raise DependencyError(f"pyspark's jars ({jars}) hold no hive-metastore jar")
    return jars


class HiveMetastore(ProcessServer):
    """Hive's metastore on 127.0.0.1 (``uri``: ``thrift://127.0.0.1:<port>``), its catalog
    in Derby under ``work_dir``, managed tables under ``warehouse``."""

    stop_timeout = 10.0

    def __init__(self, *, work_dir: Path | None = None, java: str | None = None) -> None:
        self.host = "127.0.0.1"
        self.java = java or shutil.which("java") or "java"
        self.owns_work_dir = work_dir is None
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="ingest-metastore-"))
        self.warehouse = self.work_dir / "warehouse"
        self.warehouse.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        database = self.work_dir / "derby"
        argv = [
            self.java,
            *JVM_OPTIONS,
            "-cp",
            f"{_pyspark_jars()}/*",
            f"-Djava.io.tmpdir={self.work_dir}",
            f"-Dderby.system.home={self.work_dir}",
            # Hive's default log4j setup asks for async loggers, whose jar Spark leaves out.
            "-Dlog4j2.contextSelector=org.apache.logging.log4j.core.selector.ClassLoaderContextSelector",
            f"-Djavax.jdo.option.ConnectionURL=jdbc:derby:;databaseName={database};create=true",
            "-Ddatanucleus.schema.autoCreateAll=true",
            "-Dhive.metastore.schema.verification=false",
            f"-Dhive.metastore.warehouse.dir={self.warehouse}",
            "org.apache.hadoop.hive.metastore.HiveMetaStore",
            "-p",
            str(self.port),
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HIVE_", "HADOOP_"))}
        self.process = ManagedProcess(
            f"hive metastore :{self.port}", argv, env, self.work_dir / "metastore.log"
        )

    @property
    def uri(self) -> str:
        return f"thrift://{self.host}:{self.port}"

    @property
    def spark_conf(self) -> dict[str, str]:
        """The Spark settings of a session whose catalog is this metastore."""
        return {
            "spark.sql.catalogImplementation": "hive",
            "spark.hadoop.hive.metastore.uris": self.uri,
            "spark.sql.warehouse.dir": str(self.warehouse),
        }

    def start(self) -> HiveMetastore:
        """Starts the JVM and returns once its Thrift port accepts connections; raises
        HarnessError with the log's tail if it exits first or is not up in time."""
        self._start_until(self._listening, timeout=READY_TIMEOUT_S, what="listen", interval=0.2)
        return self

    def _listening(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def __repr__(self) -> str:
        return f"HiveMetastore({self.uri})"
