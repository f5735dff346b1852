"""When a failed batch is tried again, and when the run stops instead.

Nothing of a failed batch is committed: its segments go back to their partitions and the
next batch takes them (with whatever was sealed meanwhile). Each failure is one row:

| the failure | what follows |
|---|---|
| the Spark JVM exited | stop now: every later batch would meet the dead JVM |
| the standalone cluster lost the application | stop now: no executor comes back |
| the Spark session did not start | stop now: the provider keeps the failed start |
| unreachable storage or network (transient) | retry while ``trigger.retry_for`` lasts |
| anything else | retry, three attempts in all |

Transient is ``ingest.errors.is_transient``: an ``OSError`` anywhere in the error's chain
(pyarrow's and delta-rs's object-store errors, refused or timed-out connections), a
retriable broker, connection or registry error, or a JVM error naming a network or I/O
exception. A transient failure is retried for as long as ``trigger.retry_for`` allows,
counted from the first failure in a row: an object store that is away for 30 s is ridden
out. Any failure gets at least three attempts. Backoff: 2 s, doubling, at most 30 s. A
batch that lands resets the count.

Pure: the caller gives ``now``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ingest.errors import SinkError, is_transient

__all__ = ["BatchRetry", "Failure", "classify"]

FIRST_BACKOFF = 2.0
MAX_BACKOFF = 30.0
MIN_ATTEMPTS = 3


class Failure(enum.Enum):
    JVM_EXITED = "jvm_exited"
    CLUSTER_LOST = "cluster_lost"
    SPARK_START = "spark_start"
    TRANSIENT = "transient"
    OTHER = "other"


# failure -> whether it may be retried at all, and whether ``retry_for`` extends it.
POLICY: dict[Failure, tuple[bool, bool]] = {
    Failure.JVM_EXITED: (False, False),
    Failure.CLUSTER_LOST: (False, False),
    Failure.SPARK_START: (False, False),
    Failure.TRANSIENT: (True, True),
    Failure.OTHER: (True, False),
}


def classify(
    error: BaseException,
    *,
    jvm_exited: bool = False,
    cluster_lost: bool = False,
    spark_start: bool = False,
) -> Failure:
    if jvm_exited:
        return Failure.JVM_EXITED
    if cluster_lost:
        return Failure.CLUSTER_LOST
    if spark_start:
        return Failure.SPARK_START
    return Failure.TRANSIENT if is_transient(error) else Failure.OTHER


@dataclass
class BatchRetry:
    """The failures in a row, and when the next batch may start."""

    retry_for: float
    failures: int = 0
    first_failed_at: float | None = None
    next_at: float = 0.0  # after a failure: no batch before then

    def landed(self) -> None:
        self.failures = 0
        self.first_failed_at = None

    def failed(self, failure: Failure, now: float) -> float | None:
        """Counts a failure; returns the seconds until the retry, or None to stop."""
        self.failures += 1
        if self.first_failed_at is None:
            self.first_failed_at = now
        retry, extended = POLICY[failure]
        if not retry:
            return None
        delay = min(MAX_BACKOFF, FIRST_BACKOFF * 2.0 ** (self.failures - 1))
        within = extended and now + delay - self.first_failed_at <= self.retry_for
        if self.failures >= MIN_ATTEMPTS and not within:
            return None
        self.next_at = now + delay
        return delay

    def final_error(
        self, failure: Failure, batch: int, error: BaseException, jvm_exit: int | None, now: float
    ) -> SinkError:
        """The error that ends the run when ``failed`` said no retry."""
        cause = f"{type(error).__name__}: {error}"
        if failure is Failure.JVM_EXITED:
            return SinkError(
                f"the Spark JVM exited (code {jvm_exit}) during batch {batch}; "
                f"nothing of it was committed; rerun to land it ({cause})"
            )
        if failure is Failure.CLUSTER_LOST:
            return SinkError(f"batch {batch}: {error}")
        if failure is Failure.SPARK_START:
            return SinkError(
                f"the Spark JVM exited or never answered while the session started, before "
                f"batch {batch}; nothing of it was committed; rerun to land it ({error})"
            )
        spent = now - (self.first_failed_at or now)
        within = (
            f" (trigger.retry_for = {self.retry_for:g}s)" if failure is Failure.TRANSIENT else ""
        )
        return SinkError(
            f"the batch failed {self.failures} times in a row over {spent:.0f}s{within}"
            f"; last error: {cause}"
        )
