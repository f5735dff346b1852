"""A librdkafka consumer (confluent-kafka) in a group with ours, polled on its own thread.

Its ownership follows librdkafka's rebalance callbacks, read as increments: ``on_assign``
adds, ``on_revoke`` and ``on_lost`` remove. That is right for both rebalance protocols:
under the cooperative protocol the callbacks carry only what changes, and under the eager
one ``on_revoke`` carries the whole assignment and the next ``on_assign`` the whole new
one; in a KIP-848 group (``group.protocol=consumer``) they are incremental as well.
Every callback is kept with the time it came, and every record polled with its
partition and offset; a record of a partition it did not own when polled is kept aside
(``strays``). Callbacks and polls run on the same thread, so ownership is exact at a poll.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from confluent_kafka import Consumer

from ingest.protocol.partition import Partition
from tests.supervisor.support import HEARTBEAT_MS, SESSION_MS

Change = Literal["assign", "revoke", "lost"]


def _partitions(listed: list[Any]) -> frozenset[Partition]:
    return frozenset(Partition(t.topic, t.partition) for t in listed)


class ConfluentMember:
    """A confluent-kafka consumer in the group, polled on its own thread.

    ``strategy`` is librdkafka's ``partition.assignment.strategy`` (None: its default,
    ``range,roundrobin``). ``remote_assignor`` makes it a member of a KIP-848 group
    (``group.protocol=consumer``, ``group.remote.assignor``): the coordinator assigns and
    sets the session and heartbeat (group configs), so ``strategy``, ``session_ms`` and
    ``heartbeat_ms`` are not given to librdkafka then (it refuses them in that protocol).
    """

    def __init__(
        self,
        bootstrap: str,
        group: str,
        topic: str,
        *,
        strategy: str | None = "range",
        session_ms: int = SESSION_MS,
        heartbeat_ms: int = HEARTBEAT_MS,
        remote_assignor: str | None = None,
    ) -> None:
        settings: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
        if remote_assignor is not None:
            settings["group.protocol"] = "consumer"
            settings["group.remote.assignor"] = remote_assignor
        else:
            settings["session.timeout.ms"] = session_ms
            settings["heartbeat.interval.ms"] = heartbeat_ms
            if strategy is not None:  # None: librdkafka's default, "range,roundrobin"
                settings["partition.assignment.strategy"] = strategy
        self.consumer = Consumer(settings)
        self._owned: frozenset[Partition] = frozenset()
        self.errors: list[str] = []
        # (when, what, partitions) for every rebalance callback
        self.changes: list[tuple[float, Change, frozenset[Partition]]] = []
        # partition -> the highest offset polled, and records of partitions not owned
        self.consumed: dict[Partition, int] = {}
        self.strays: list[tuple[Partition, int]] = []
        self.closed = False
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self.consumer.subscribe(
            [topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _change(self, kind: Change, listed: list[Any]) -> None:
        partitions = _partitions(listed)
        with self._changed:
            if kind == "assign":
                self._owned |= partitions
            else:
                self._owned -= partitions
            self.changes.append((time.monotonic(), kind, partitions))
            self._changed.notify_all()

    def _on_assign(self, consumer: Any, assigned: list[Any]) -> None:
        self._change("assign", assigned)

    def _on_revoke(self, consumer: Any, revoked: list[Any]) -> None:
        self._change("revoke", revoked)

    def _on_lost(self, consumer: Any, lost: list[Any]) -> None:
        self._change("lost", lost)

    @property
    def owned(self) -> frozenset[Partition]:
        with self._changed:
            return self._owned

    def since(self, kind: Change, when: float) -> frozenset[Partition]:
        """Everything a callback of ``kind`` named since ``when``."""
        with self._changed:
            changes = list(self.changes)
        named: frozenset[Partition] = frozenset()
        for at, what, partitions in changes:
            if at >= when and what == kind:
                named |= partitions
        return named

    def wait(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Until ``condition`` (read under the member's lock), or False after ``timeout``;
        woken by each rebalance callback and each record polled."""
        with self._changed:
            return self._changed.wait_for(condition, timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self.consumer.poll(0.05)
            if message is None:
                continue
            with self._changed:
                error = message.error()
                if error is not None:
                    self.errors.append(error.name())
                    continue
                name, index, offset = message.topic(), message.partition(), message.offset()
                assert name is not None and index is not None and offset is not None
                tp = Partition(name, index)
                if tp not in self._owned:
                    self.strays.append((tp, offset))
                self.consumed[tp] = max(offset, self.consumed.get(tp, -1))
                self._changed.notify_all()

    def close(self) -> None:
        """Stops polling and closes the consumer (it leaves the group); it owns nothing then."""
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()
        with self._changed:
            self._owned = frozenset()
            self.closed = True
            self._changed.notify_all()
