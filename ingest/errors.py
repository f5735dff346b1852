"""The one error root of ingest, and its hierarchy.

Every exception the package raises on purpose derives from ``IngestError``::

    IngestError
    ├── ConfigError                  bad or missing configuration (CLI exit code 2)
    │   ├── HandoffTooSmall          the handoff cannot hold one segment per partition
    │   │                            (ingest/handoff/space.py)
    │   └── IncompatibleSchemaError  a writer's schema does not fit the table, and
    │                                [table.value] on_incompatible = "fail" (the run stops)
    ├── ProtocolError                bytes that do not follow the Kafka protocol
    │   ├── DecodeError              a decoder met bytes it cannot parse (offset, field)
    │   ├── EncodeError              a value the chosen version cannot carry
    │   ├── UnsupportedVersionError  no version both sides support
    │   ├── CorruptBatchError        a record batch failed its CRC or structure checks
    │   │   └── UnreadableCorruption     broken framing at the fetch position: the rest of
    │   │                                the partition cannot be reached (ingest/worker/results.py)
    │   └── BrokerFaultError         the broker broke a contract the client relies on (fatal)
    ├── BrokerError                  the broker answered with a non-zero error code
    │   (carries the code's row from ingest.protocol.error_codes: name, retriable)
    ├── KafkaConnectionError         connect, TLS, SASL or socket failure (retriable)
    │   └── RequestTimeoutError      no answer within the request timeout
    ├── GroupError                   consumer-group membership failures
    │   ├── FencedError              a newer generation or instance fenced us out
    │   └── GroupProtocolError       the group protocol was broken; ``remote`` says by whom
    │       ├── LocalProtocolError   by this process: its driver or its own assignor
    │       │   └── InvalidTransition    an input the group machine's table does not accept
    │       │                            in its state (ingest/group/types.py)
    │       └── RemoteProtocolError  by the other side: the coordinator's answer or another
    │                                member's bytes
    ├── HandoffError                 a segment could not be written, published, read or
    │   │                            released (ingest/handoff/store.py)
    │   ├── HandoffFull              ENOSPC: the write was undone; wait for room (store.py)
    │   └── HandoffSpaceExhausted    full for handoff.full_timeout with nothing of ours left
    │                                to free (store.py)
    ├── SinkError                    Delta / Spark sink failures
    │   ├── StaleBatchError          a concurrent writer covered offsets of the batch, or the
    │   │                            table's column mapping changed: redo it from its segments
    │   │                            (ingest/sink/maintenance/rewrite.py)
    │   ├── LocalTaskError           a local-engine task process died: the batch is retried
    │   │                            on a new pool (ingest/engines/local/task_pool.py)
    │   ├── UnsupportedTableFeature  the table uses a Delta feature ingest cannot honour for
    │   │                            the write asked; refused before writing
    │   │                            (ingest/sink/metadata/features.py)
    │   ├── UncommittedError         a commit failed before it reached the table's log:
    │   │                            nothing of it is in the table, its files may go
    │   ├── SparkStartError          the Spark session did not start (its JVM exited or never
    │   │                            answered): no later batch can land in this process
    │   └── SparkClusterLost         a standalone cluster's batch had no executor for
    │                                [spark] executorless_timeout (a restarted master forgets the
    │                                application): no later batch can land in this process
    ├── LogTruncationError           the log diverged below a restored position (KIP-320):
    │                                records the table holds are no longer the broker's
    ├── RegistryError                the schema registry did not answer, or not with the schema
    │                                asked for (``retriable``: down or overloaded, not refused)
    ├── DependencyError              Java or a Maven artifact missing or unresolvable
    └── HarnessError                 the test harness could not start or stop a server

``is_transient`` says which errors mean a server or store unreachable for now (retried
within ``trigger.retry_for`` and ``worker.retry_for``). A class defined in another module
names it in parentheses; the rest live here. A private exception that never leaves its
module (``records_reference._RecordFailure``, control flow of the reference decoder) is not
part of the tree.

Errors are plain classes with keyword fields, so that a message always names
where the failure happened (offset and field, broker and API, topic and
partition) without callers formatting strings themselves.
"""

from __future__ import annotations

import errno


class IngestError(Exception):
    """Root of every error ingest raises on purpose."""


class ConfigError(IngestError):
    """Configuration that cannot be used; names the file and the key."""

    def __init__(self, message: str, *, path: str | None = None, key: str | None = None) -> None:
        self.path = path
        self.key = key
        where = ": ".join(part for part in (path, key) if part)
        super().__init__(f"{where}: {message}" if where else message)


class IncompatibleSchemaError(ConfigError):
    """A writer's schema (from the registry) that does not fit the table's columns, or
    that its format cannot map to columns: its records cannot land without a silent cast
    or a dropped field. A config error because the choice is the operator's: dead-letter
    such records (``on_incompatible``) or change the table."""


class ProtocolError(IngestError):
    """Bytes or values that do not follow the Kafka protocol."""

    def __init__(
        self, message: str, *, offset: int | None = None, field: str | None = None
    ) -> None:
        self.offset = offset
        self.field = field
        self.reason = message
        location = []
        if field is not None:
            location.append(f"field {field}")
        if offset is not None:
            location.append(f"offset {offset}")
        super().__init__(f"{message} ({', '.join(location)})" if location else message)


class DecodeError(ProtocolError):
    """A decoder met bytes it cannot parse. The only exception decoders raise."""


class EncodeError(ProtocolError):
    """A value the chosen message version cannot carry."""


class UnsupportedVersionError(ProtocolError):
    """No version of an API is supported by both sides."""


class CorruptBatchError(ProtocolError):
    """A record batch failed its CRC or structure checks.

    ``base_offset`` and ``last_offset`` bound the batch when they could be read,
    so the range can go to the dead-letter table with its raw bytes.
    """

    def __init__(
        self,
        message: str,
        *,
        offset: int | None = None,
        field: str | None = None,
        base_offset: int | None = None,
        last_offset: int | None = None,
    ) -> None:
        self.base_offset = base_offset
        self.last_offset = last_offset
        super().__init__(message, offset=offset, field=field)


class BrokerFaultError(ProtocolError):
    """The broker broke a contract of the protocol that the client relies on, such as
    listing every aborted transaction of a read_committed answer. Never retried: the
    same broker would answer the same way."""

    retriable = False


class BrokerError(IngestError):
    """The broker answered with a non-zero error code."""

    def __init__(
        self,
        code: int,
        name: str,
        retriable: bool,
        *,
        context: str = "",
        message: str | None = None,
    ) -> None:
        self.code = code
        self.name = name
        self.retriable = retriable
        self.context = context
        text = f"{name} ({code})"
        if message:
            text += f": {message}"
        if context:
            text = f"{context}: {text}"
        super().__init__(text)


class KafkaConnectionError(IngestError):
    """Connecting to or talking with a broker failed at the transport level."""

    retriable = True


class RequestTimeoutError(KafkaConnectionError):
    """No response arrived within the request timeout."""


class GroupError(IngestError):
    """Consumer-group membership failed."""


class FencedError(GroupError):
    """A newer generation or another instance with our id fenced us out."""


class GroupProtocolError(GroupError):
    """The consumer-group protocol was broken. ``remote`` tells by which side (as h11
    splits its protocol errors): the other side's bytes or answer (``RemoteProtocolError``),
    or this process's own use of the group machine (``LocalProtocolError``).

    The group machine reports either in a ``Fatal`` event whose ``error_name`` is the
    class's ``error_name``; only local misuse of the machine is raised at once.
    """

    remote: bool = False
    error_name = "PROTOCOL_ERROR"


class LocalProtocolError(GroupProtocolError):
    """This process broke the group protocol: its driver fed the machine an input the
    machine's state does not accept, or its own assignor made an assignment the
    protocol forbids. A bug on this side; the coordinator and the other members are fine."""

    remote = False
    error_name = "LOCAL_PROTOCOL_ERROR"


class RemoteProtocolError(GroupProtocolError):
    """The other side broke the group protocol: the coordinator's answer or another
    member's bytes (its subscription, the leader's assignment) cannot be used. Asking
    again gets the same bytes, so it is never retried."""

    remote = True
    error_name = "REMOTE_PROTOCOL_ERROR"


class SinkError(IngestError):
    """Writing to or committing the Delta table failed."""


class UncommittedError(SinkError):
    """A commit failed before it reached the table's log (Delta Spark's planning of an
    overwrite's DELETE, a row its writer refused): nothing of it is in the table, so the
    caller may delete the files it would have added."""


class SparkStartError(SinkError):
    """The Spark session did not start; the provider keeps the failure, so a retry in the
    same process would only meet it again."""


class SparkClusterLost(SinkError):
    """A batch on a Spark standalone master had no executor for ``[spark] executorless_timeout``
    (``ingest/engines/spark/spark_session.py``): the application lost its cluster (a master
    restarted without recovery forgets it and kills its executors, and the driver waits for
    it forever). The session cannot get executors back; a new run can."""


class LogTruncationError(IngestError):
    """OffsetForLeaderEpoch says the partition's log no longer holds the records before
    the position restored from a commit: offsets ``first_offset`` to ``position - 1``
    were read, but the broker has other records there now (or none). Never retried:
    the same log answers the same way (ingest/worker/truncation.py)."""

    retriable = False

    def __init__(
        self, message: str, *, topic: str, partition: int, first_offset: int, position: int
    ) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.first_offset = first_offset
        self.position = position


class RegistryError(IngestError):
    """The schema registry did not answer within the retry timeout (``retriable``), or
    refused: an unknown schema id or subject (HTTP 404 and the registry's ``code``), a
    refused credential."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: int | None = None,
        retriable: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retriable = retriable


class DependencyError(IngestError):
    """Java, or a Java artifact from Maven Central, that cannot be found or resolved."""


class HarnessError(IngestError):
    """The test harness could not start, reach or stop a server."""


# What a JVM error (Py4J's text of a Java exception) says when the network or a store is
# the cause.
TRANSIENT_JVM_MARKERS = (
    "java.net.",
    "java.io.IOException",
    "java.io.InterruptedIOException",
    "SdkClientException",
    "AWSClientIOException",
    "ConnectTimeoutException",
)


# What a local filesystem answers when waiting will not help (a read-only or full disk, a
# missing path, a limit): an OSError with one of these is not transient.
_LOCAL_ERRNOS = frozenset(
    {
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.EFBIG,
        errno.ENOSPC,
        errno.EDQUOT,
        errno.ENOENT,
        errno.EISDIR,
        errno.ENOTDIR,
        errno.ENAMETOOLONG,
        errno.EMFILE,
        errno.ENFILE,
    }
)


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` says a server or store was unreachable for now, so that trying
    again later may succeed: an ``OSError`` anywhere in its chain (pyarrow's and delta-rs's
    object-store errors, refused or timed-out connections) unless its errno is a local
    filesystem's final answer (read-only, full, missing, a limit), a retriable broker,
    connection or registry error, or a JVM error naming a network or I/O exception."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError):
            return current.errno not in _LOCAL_ERRNOS
        if isinstance(current, KafkaConnectionError | BrokerError | RegistryError):
            return bool(current.retriable)
        current = current.__cause__ or current.__context__
    return any(marker in str(error) for marker in TRANSIENT_JVM_MARKERS)
