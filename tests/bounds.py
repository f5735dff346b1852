"""The time bounds the product promises, named once; the tests that show a promise check
against its constant here.

Each is the promise plus the slack a loaded 2-core CI host needs, and still far from what
a broken product would take (a 30 s long poll, an endless stream, a JVM start, a hang).
Every other wait in the suite is a condition with a generous deadline, not a bound.
"""

from __future__ import annotations

# WorkerHandle.stop_now: the worker exits "within a second" (STOP_NOW_GRACE, then os._exit).
STOP_NOW_S = 2.0

# A second SIGINT/SIGTERM during a graceful stop exits at once, not after the batch.
SECOND_SIGNAL_S = 5.0

# A configuration error exits 2 before any server, JVM or worker starts: a Python process
# start and the config load (about 1 s idle), never a Spark session (5-10 s) or a retry.
CONFIG_REFUSAL_S = 15.0

# A connect, TLS handshake or request timeout fires within its setting plus this.
TIMEOUT_SLACK_S = 1.7

# A frame the connection refuses (too long, negative, not Kafka) closes it at once.
REFUSAL_S = 1.5
