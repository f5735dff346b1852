"""The batch retry policy (ingest/supervisor/engine/retries.py) and what counts as transient
(ingest.errors.is_transient): each row of the policy, at given times."""

from __future__ import annotations

import pytest

from ingest.errors import (
    BrokerError,
    ConfigError,
    KafkaConnectionError,
    RegistryError,
    SinkError,
    is_transient,
)
from ingest.supervisor.engine.retries import BatchRetry, Failure, classify


def _s3_down() -> SinkError:
    try:
        try:
            raise OSError("AWS Error NETWORK_CONNECTION during HeadBucket operation")
        except OSError as exc:
            raise SinkError("s3://b/t: cannot write part-0.parquet") from exc
    except SinkError as outer:
        return outer


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (_s3_down(), True),  # an OSError under the sink's error
        (ConnectionRefusedError(111, "refused"), True),
        (OSError(5, "Input/output error"), True),  # EIO: a network filesystem's hiccup
        (PermissionError(13, "Permission denied"), False),  # a read-only handoff
        (OSError(27, "File too large"), False),  # EFBIG
        (OSError(28, "No space left on device"), False),
        (KafkaConnectionError("reset"), True),
        (BrokerError(7, "REQUEST_TIMED_OUT", True), True),
        (BrokerError(29, "TOPIC_AUTHORIZATION_FAILED", False), False),
        (RegistryError("did not answer", retriable=True), True),
        (RegistryError("subject not found", status=404), False),
        (SinkError("An error occurred: java.net.ConnectException: Connection refused"), True),
        (SinkError("failed validation: CHECK (id > 0)"), False),
        (ValueError("bad value"), False),
    ],
)
def test_what_is_transient(error: BaseException, transient: bool) -> None:
    assert is_transient(error) is transient


def test_a_transient_failure_is_retried_within_retry_for_then_stops() -> None:
    retry = BatchRetry(retry_for=40.0)
    delays = [retry.failed(Failure.TRANSIENT, now) for now in (0.0, 3.0, 8.0, 17.0)]
    assert delays == [2.0, 4.0, 8.0, 16.0]
    # The next backoff (30 s, the cap) would end 64 s after the first failure: past 40 s.
    assert retry.failed(Failure.TRANSIENT, 34.0) is None
    assert retry.failures == 5


def test_any_failure_gets_three_attempts_and_other_failures_no_more() -> None:
    retry = BatchRetry(retry_for=600.0)
    assert retry.failed(Failure.OTHER, 0.0) == 2.0
    assert retry.next_at == 2.0
    assert retry.failed(Failure.OTHER, 3.0) == 4.0
    assert retry.failed(Failure.OTHER, 8.0) is None
    # retry_for 0: three attempts even for a transient failure (the old rule).
    zero = BatchRetry(retry_for=0.0)
    assert [zero.failed(Failure.TRANSIENT, t) for t in (0.0, 3.0, 8.0)] == [2.0, 4.0, None]


def test_a_landed_batch_starts_the_count_and_the_clock_again() -> None:
    retry = BatchRetry(retry_for=10.0)
    retry.failed(Failure.TRANSIENT, 0.0)
    retry.failed(Failure.TRANSIENT, 3.0)
    retry.landed()
    assert retry.failures == 0 and retry.first_failed_at is None
    assert retry.failed(Failure.TRANSIENT, 100.0) == 2.0


@pytest.mark.parametrize("failure", [Failure.JVM_EXITED, Failure.CLUSTER_LOST, Failure.SPARK_START])
def test_failures_that_would_recur_stop_at_once(failure: Failure) -> None:
    assert BatchRetry(retry_for=600.0).failed(failure, 0.0) is None


def test_classify_puts_the_spark_rows_before_transient() -> None:
    down = _s3_down()
    assert classify(down) is Failure.TRANSIENT
    assert classify(down, jvm_exited=True) is Failure.JVM_EXITED
    assert classify(down, cluster_lost=True) is Failure.CLUSTER_LOST
    assert classify(down, spark_start=True) is Failure.SPARK_START
    assert classify(ConfigError("bad")) is Failure.OTHER
