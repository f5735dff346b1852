"""What a Spark session needs beyond pyspark: Delta Lake's jars and SQL extensions, and S3.

pyspark ships neither Delta nor an S3 filesystem. Every session ingest starts (the
supervisor's, the test harness's, the benches') carries:

- **Delta Lake** (``io.delta:delta-spark_<spark minor>_2.13``, the version of the installed
  ``delta-spark`` Python package): its SQL extensions and its catalog as ``spark_catalog``, so
  SQL reads ``delta.`<path>``` and tables by name, and runs MERGE, OPTIMIZE, VACUUM...;
- **S3A** (``org.apache.hadoop:hadoop-aws`` at the Hadoop version pyspark bundles, with the
  AWS SDK bundle it names), with ``s3://`` mapped to S3A as well, so the URIs delta-rs takes
  work unchanged in Spark SQL.

The jars are resolved from Maven Central once (``ingest.jars``, a shared cache) and go on the
JVM's class path (``spark.driver.extraClassPath``, and the executors' for a cluster whose
hosts share the cache path): nothing is downloaded or copied at a warm start. Jars that Spark
itself bundles (Hadoop's client, Parquet, Jackson, Scala, logging...) are left out, whatever
version Delta's POM names: Spark's own win, as they would on a cluster.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from ingest.errors import DependencyError
from ingest.jars import resolve

__all__ = [
    "DELTA_SETTINGS",
    "beside_spark",
    "delta_coordinates",
    "hadoop_aws_coordinates",
    "s3a_settings",
    "session_jars",
    "session_settings",
]

DELTA_SETTINGS: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

_VERSIONED_JAR = re.compile(r"^(?P<name>.+?)-(?P<version>\d[\w.+-]*)\.jar$")


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _artifact_name(jar: Path) -> str:
    match = _VERSIONED_JAR.match(jar.name)
    return match.group("name") if match else jar.stem


def delta_coordinates() -> list[str]:
    """Delta's jar for the installed pyspark, at the installed delta-spark's version."""
    import pyspark

    try:
        delta = importlib.metadata.version("delta-spark")
    except importlib.metadata.PackageNotFoundError as exc:  # pragma: no cover - a dependency
        raise DependencyError("delta-spark is not installed (pip install delta-spark)") from exc
    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    return [f"io.delta:delta-spark_{spark_minor}_2.13:{delta}"]


def hadoop_aws_coordinates() -> list[str]:
    """hadoop-aws at the version of the Hadoop client inside pyspark (they must match)."""
    found = sorted(_pyspark_jars().glob("hadoop-client-api-*.jar"))
    if not found:
        raise DependencyError(f"no hadoop-client-api-*.jar in {_pyspark_jars()}")
    version = found[-1].name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    return [f"org.apache.hadoop:hadoop-aws:{version}"]


def beside_spark(coordinates: list[str]) -> list[Path]:
    """The jars of ``coordinates`` (resolved once, cached) that pyspark does not bundle
    under any version: what goes on a session's class path next to Spark's own."""
    bundled = {_artifact_name(jar) for jar in _pyspark_jars().glob("*.jar")}
    jars: list[Path] = []
    for jar in resolve(coordinates):
        if _artifact_name(jar) not in bundled and jar not in jars:
            jars.append(jar)
    return jars


def session_jars(*, s3: bool = True) -> list[Path]:
    """The jars a session adds to pyspark's: Delta's, and S3A's unless ``s3`` is False."""
    return beside_spark(delta_coordinates() + (hadoop_aws_coordinates() if s3 else []))


def s3a_settings(storage_options: Mapping[str, str]) -> dict[str, str]:
    """Hadoop S3A settings (``spark.hadoop.fs.s3a.*``) from delta-rs storage options
    (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_VIRTUAL_HOSTED_STYLE_REQUEST``; any case),
    so Spark reaches the objects delta-rs does. ``s3://`` is served by S3A too."""
    lowered = {key.lower(): value for key, value in storage_options.items()}
    prefix = "spark.hadoop.fs.s3a."
    settings = {"spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
    endpoint = lowered.get("aws_endpoint_url") or lowered.get("aws_endpoint")
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        settings[prefix + "endpoint"] = f"{parts.scheme}://{parts.netloc}"
        settings[prefix + "connection.ssl.enabled"] = str(parts.scheme == "https").lower()
        virtual = lowered.get("aws_virtual_hosted_style_request", "false").lower() == "true"
        settings[prefix + "path.style.access"] = str(not virtual).lower()
    for ours, theirs in (
        ("aws_access_key_id", "access.key"),
        ("aws_secret_access_key", "secret.key"),
        ("aws_session_token", "session.token"),
        ("aws_region", "endpoint.region"),
    ):
        if lowered.get(ours):
            settings[prefix + theirs] = lowered[ours]
    if lowered.get("aws_session_token"):
        settings[prefix + "aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        )
    elif lowered.get("aws_access_key_id"):
        settings[prefix + "aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        )
    return settings


def session_settings(
    storage_options: Mapping[str, str] | None = None, *, s3: bool = True
) -> dict[str, str]:
    """Everything above as Spark settings: the class path, Delta's extensions and catalog,
    and (with ``s3``) S3A configured from ``storage_options``."""
    classpath = ":".join(str(jar) for jar in session_jars(s3=s3))
    settings = {
        "spark.driver.extraClassPath": classpath,
        "spark.executor.extraClassPath": classpath,
        **DELTA_SETTINGS,
    }
    if s3:
        settings.update(s3a_settings(storage_options or {}))
    return settings
