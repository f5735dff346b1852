"""Tables by name: ``table.name`` (and a route's ``name``) resolved, registered and created through the Spark
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
  (``<name>_dead_letters``) likewise. Should a named table vanish mid-run, the batch fails
  at its commit, and its retry checks the catalog again before it writes: a table gone from
  both the catalog and its location is created anew; an entry left without its files is an
  error naming it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ingest.config import IngestConfig
from ingest.errors import ConfigError, IngestError, SinkError
from ingest.sink.storage import normalize_uri

__all__ = ["CatalogTables", "resolve", "same_location"]

log = logging.getLogger("ingest.sink")

_TOPIC = "{topic}"


def resolve(config: IngestConfig, session: Any) -> IngestConfig:
    """``config`` with ``table.uri`` set from the catalog for ``table.name``, and each named
    route's ``uri`` for its ``name`` (unchanged without names), in the one spelling the txn
    app ids are made of; ``ConfigError`` for a name the catalog cannot place."""
    if not config.names_tables():
        return config
    tables = CatalogTables(session, ConfigError)
    if config.table.name is not None:
        uri = _place(tables, config.table.name, config.table.uri, "table.uri")
        config = dataclasses.replace(config, table=dataclasses.replace(config.table, uri=uri))
    routes = [
        route
        if route.name is None
        else dataclasses.replace(
            route, uri=_place(tables, route.name, route.uri, f"route[{index}].uri")
        )
        for index, route in enumerate(config.route)
    ]
    return dataclasses.replace(config, route=routes)


def _place(tables: CatalogTables, name: str, uri: str | None, key: str) -> str:
    """Where the table ``name`` is, or goes: the catalog's location of it, else ``uri``
    (an external table), else the catalog's place for a managed table of that name."""
    given = None if uri is None else normalize_uri(uri)
    if given is None and not _session_catalog(name):
        raise ConfigError(
            f"{name} is not in Spark's session catalog: ingest commits by path, so a table "
            f"there must be an external table; set {key}",
            key=key,
        )
    if _TOPIC in name:
        placed = given or f"{tables.database_location(name)}/{_TOPIC}"
    else:
        found = tables.location_of(name)
        if found is not None and given is not None and found != given:
            raise ConfigError(
                f"{name} is the table at {found}, not {given}: leave {key} unset, or name "
                "another table",
                key=key,
            )
        placed = found or given or tables.default_location(name)
    log.info("table %s resolved through the catalog to %s", name, placed)
    return placed


def same_location(a: str, b: str) -> bool:
    """Whether two spellings of a table's location are one (``normalize_uri``)."""
    return normalize_uri(a) == normalize_uri(b)


def _session_catalog(name: str) -> bool:
    """Whether ``name`` is in Spark's session catalog (``spark_catalog``, the default)."""
    parts = name.split(".")
    return len(parts) < 3 or parts[0].lower() == "spark_catalog"


def _quoted(name: str) -> str:
    """A dotted name as Spark SQL's identifier (each part backquoted)."""
    return ".".join(f"`{part.replace('`', '``')}`" for part in name.split("."))


def _literal(text: str) -> str:
    """A Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class CatalogTables:
    """The catalog's side of tables by name, on one Spark session. ``error``: what a
    failure raises, ``ConfigError`` at a command's start (exit 2), ``SinkError`` at a
    batch (the batch fails, and is retried when the cause is transient)."""

    def __init__(self, session: Any, error: type[IngestError] = SinkError) -> None:
        self.session = session
        self.error = error

    def _fail(self, message: str, exc: BaseException | None = None) -> IngestError:
        failure: IngestError = (
            ConfigError(message, key="table.name")
            if issubclass(self.error, ConfigError)
            else self.error(message)
        )
        failure.__cause__ = exc
        return failure

    def location_of(self, name: str) -> str | None:
        """The location of the Delta table ``name`` (None: the catalog has no such table);
        a table that is not Delta is refused."""
        try:
            if not self.session.catalog.tableExists(name):
                return None
            detail = self.session.sql(f"DESCRIBE DETAIL {_quoted(name)}").collect()[0]
        except Exception as exc:  # py4j and Spark's AnalysisException
            raise self._fail(f"{name}: the catalog cannot describe it: {exc}", exc) from exc
        if str(detail["format"]).lower() != "delta":
            raise self._fail(f"{name} is a {detail['format']} table, not a Delta table")
        return normalize_uri(str(detail["location"]))

    def database_location(self, name: str) -> str:
        """The location of the database (schema) that holds ``name``."""
        parts = name.split(".")
        database = (
            ".".join(parts[:-1]) if len(parts) > 1 else self.session.catalog.currentDatabase()
        )
        try:
            rows = self.session.sql(f"DESCRIBE DATABASE EXTENDED {_quoted(database)}").collect()
        except Exception as exc:
            raise self._fail(
                f"{name}: the catalog has no database {database} (create it first): {exc}", exc
            ) from exc
        found = {str(row[0]).lower(): str(row[1] or "") for row in rows}
        location = found.get("location", "")
        if not location:
            raise self._fail(
                f"{name}: the catalog gives no location for database {database}: set "
                "table.uri (the table will be an external table there)"
            )
        return normalize_uri(location)

    def default_location(self, name: str) -> str:
        """Where the session catalog puts a managed table ``name``: its database's
        location and the name folded to lowercase."""
        return f"{self.database_location(name)}/{name.split('.')[-1].lower()}"

    def check(self, name: str, uri: str, *, exists: bool) -> bool:
        """At a table's first batch of a run: ``name`` must point at ``uri``, where a Delta
        table must be when the catalog names it; a Delta table at ``uri`` (``exists``) that
        the catalog does not know is registered (external). False: neither is there yet
        (the caller creates it: ``create``)."""
        found = self.location_of(name)
        if found is not None:
            self._check_at(name, found, uri)
            if not exists:
                raise self._fail(
                    f"the catalog names {name} at {uri}, but no Delta table is there (its "
                    f"files were removed): DROP TABLE {name}, and the next run creates it again"
                )
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
        (managed when ``uri`` is the session catalog's own place for the name, else
        external), or finds it created by a rival."""
        jvm = self.session._jvm
        columns = jvm.org.apache.spark.sql.types.DataType.fromJson(schema_json).toDDL()
        managed = _session_catalog(name) and same_location(uri, self.default_location(name))
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

    def _check_at(self, name: str, found: str | None, uri: str) -> None:
        if found is None or not same_location(found, uri):
            raise self._fail(
                f"{name} is registered at {found}, not at {uri} where ingest lands it: a "
                "table of the name's own elsewhere (a dead-letter or {topic} table: give "
                "dead_letter.uri, or a [[route]] with that uri), or an entry moved since the "
                "run resolved it (rerun)"
            )
