"""Tables by name: ``table.name`` resolved, registered and created through the Spark
session's catalog (the session catalog over a Hive metastore, or any catalog ``[spark] conf``
configures: Spark SQL names them ``catalog.database.table``).

ingest itself reads and commits a table by its location, so a name becomes a location once:

- **At the start of a command** (``SparkEngine.resolve`` → ``resolve``): a table the catalog
  holds gives its location (it must be a Delta table, and agree with ``table.uri`` when both
  are set); a new one goes to ``table.uri`` (an external table) or, unset, where the catalog
  puts a managed table of that name (its database's location and the name in lowercase, as
  Spark's session catalog does). ``raw.{topic}`` takes the database's location and
  ``/{topic}``.
- **Before a named table's first batch of a run** (``SparkEngine.land`` →
  ``CatalogTables.check``): the name must still point at that location; a Delta table there
  that the catalog does not know (its entry dropped) is registered as an external table; a
  table that is nowhere yet is created now (``CatalogTables.create``), with the columns the
  batch will land (``job.table_schema``), its partitioning and properties, through Delta
  Spark's ``CREATE TABLE``: managed when the location is the catalog's own place for the
  name, so it is registered as Spark registers a table, with the session's Delta defaults.
  It must happen before the batch writes a file there: Delta Spark creates a managed table
  only in an empty location. A rival creating it at the same time is found afterwards; a
  name that points elsewhere is a ``SinkError``. The dead-letter table
  (``<name>_dead_letters``) likewise. Should a named table vanish mid-run, its next commit
  recreates it the same way (``TableCommitter.create_table``), or fails naming the cause.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ingest.config import IngestConfig
from ingest.errors import ConfigError, SinkError

__all__ = ["CatalogTables", "resolve", "same_location"]

log = logging.getLogger("ingest.sink")

_TOPIC = "{topic}"


def resolve(config: IngestConfig, session: Any) -> IngestConfig:
    """``config`` with ``table.uri`` set from the catalog for ``table.name`` (unchanged
    without a name); ``ConfigError`` for a name the catalog cannot place."""
    name = config.table.name
    if name is None:
        return config
    tables = CatalogTables(session)
    given = config.table.uri
    if _TOPIC in name:
        uri = given or f"{tables.database_location(name)}/{_TOPIC}"
    else:
        found = tables.location_of(name)
        if found is not None and given is not None and not same_location(found, given):
            raise ConfigError(
                f"{name} is the table at {found}, not {given}: leave table.uri unset, or "
                "name another table",
                key="table.uri",
            )
        uri = found or given or tables.default_location(name)
    log.info("table %s resolved through the catalog to %s", name, uri)
    table = dataclasses.replace(config.table, uri=uri)
    return dataclasses.replace(config, table=table)


def same_location(a: str, b: str) -> bool:
    """Whether two spellings of a table's location are one (``file:`` URIs and paths)."""
    return _plain(a) == _plain(b)


def _plain(location: str) -> str:
    """A location as delta-rs and ``normalize_uri`` take it: ``file:/x`` and
    ``file:///x`` as the path ``/x``; no trailing slash."""
    if location.startswith("file://"):
        location = location.removeprefix("file://")
    elif location.startswith("file:"):
        location = location.removeprefix("file:")
    return location.rstrip("/") or "/"


def _quoted(name: str) -> str:
    """A dotted name as Spark SQL's identifier (each part backquoted)."""
    return ".".join(f"`{part.replace('`', '``')}`" for part in name.split("."))


def _literal(text: str) -> str:
    """A Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class CatalogTables:
    """The catalog's side of tables by name, on one Spark session."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def location_of(self, name: str) -> str | None:
        """The location of the Delta table ``name`` (None: the catalog has no such table);
        ``ConfigError`` for a table that is not Delta."""
        try:
            if not self.session.catalog.tableExists(name):
                return None
            detail = self.session.sql(f"DESCRIBE DETAIL {_quoted(name)}").collect()[0]
        except Exception as exc:  # py4j and Spark's AnalysisException
            raise ConfigError(
                f"{name}: the catalog cannot describe it: {exc}", key="table.name"
            ) from exc
        if str(detail["format"]).lower() != "delta":
            raise ConfigError(
                f"{name} is a {detail['format']} table, not a Delta table", key="table.name"
            )
        return _plain(str(detail["location"]))

    def database_location(self, name: str) -> str:
        """The location of the database (schema) that holds ``name``."""
        parts = name.split(".")
        database = (
            ".".join(parts[:-1]) if len(parts) > 1 else self.session.catalog.currentDatabase()
        )
        try:
            rows = self.session.sql(f"DESCRIBE DATABASE EXTENDED {_quoted(database)}").collect()
        except Exception as exc:
            raise ConfigError(
                f"{name}: the catalog has no database {database} (create it first): {exc}",
                key="table.name",
            ) from None
        found = {str(row[0]).lower(): str(row[1] or "") for row in rows}
        location = found.get("location", "")
        if not location:
            raise ConfigError(
                f"{name}: the catalog gives no location for database {database}: set "
                "table.uri (the table will be an external table there)",
                key="table.uri",
            )
        return _plain(location)

    def default_location(self, name: str) -> str:
        """Where the session catalog puts a managed table ``name``: its database's
        location and the name folded to lowercase."""
        return f"{self.database_location(name)}/{name.split('.')[-1].lower()}"

    def check(self, name: str, uri: str, *, exists: bool) -> bool:
        """At a table's first batch of a run: ``name`` must point at ``uri``; a Delta table
        at ``uri`` (``exists``) that the catalog does not know is registered (external).
        False: neither is there yet (the caller creates it: ``create``)."""
        found = self.location_of(name)
        if found is not None:
            self._check_at(name, found, uri)
            return True
        if not exists:
            return False
        self._run(
            name, f"CREATE TABLE IF NOT EXISTS {_quoted(name)} USING delta LOCATION {_literal(uri)}"
        )
        log.info("registered the table at %s as %s", uri, name)
        self._check_at(name, self.location_of(name), uri)
        return True

    def create(
        self,
        name: str,
        uri: str,
        schema_json: str,
        partition_by: Sequence[str],
        properties: Mapping[str, str],
    ) -> None:
        """Creates ``name`` at ``uri`` with no rows, through Delta Spark's CREATE TABLE
        (managed when ``uri`` is the catalog's own place for the name, else external),
        or finds it created by a rival."""
        jvm = self.session._jvm
        columns = jvm.org.apache.spark.sql.types.DataType.fromJson(schema_json).toDDL()
        try:
            managed = same_location(uri, self.default_location(name))
        except ConfigError:
            managed = False  # a catalog without database locations: external tables
        statement = [f"CREATE TABLE IF NOT EXISTS {_quoted(name)} ({columns}) USING delta"]
        if partition_by:
            statement.append(f"PARTITIONED BY ({', '.join(_quoted(c) for c in partition_by)})")
        if not managed:
            statement.append(f"LOCATION {_literal(uri)}")
        if properties:
            pairs = ", ".join(f"{_literal(k)} = {_literal(v)}" for k, v in properties.items())
            statement.append(f"TBLPROPERTIES ({pairs})")
        try:
            self._run(name, " ".join(statement))
        except SinkError:
            if self.location_of(name) is None:
                raise
            log.info("%s: another writer created the table first", name)
        self._check_at(name, self.location_of(name), uri)
        log.info("created the table %s at %s (%s)", name, uri, "managed" if managed else "external")

    def _run(self, name: str, statement: str) -> None:
        try:
            self.session.sql(statement).collect()
        except Exception as exc:
            raise SinkError(f"{name}: the catalog refused {statement!r}: {exc}") from exc

    @staticmethod
    def _check_at(name: str, found: str | None, uri: str) -> None:
        if found is None or not same_location(found, uri):
            raise SinkError(
                f"{name} is registered at {found}, not at {uri} where ingest lands it: the "
                "catalog's entry moved since the run resolved it; rerun to resolve it again"
            )
