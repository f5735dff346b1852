"""A group member in a process of its own, for tests that SIGKILL or SIGSTOP it.

    python -m tests.supervisor.member_process '{"bootstrap": ..., "group": ..., "topic": ...}'

It prints one JSON object per line on stdout (``{"event": ...}``) and reads one
JSON command per line on stdin: ``{"commit": [[topic, partition, offset], ...]}``
or ``{"close": {"force": false}}``. The parent side is ``MemberProcess``.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ingest.group import (
    CommitFailed,
    Fatal,
    Fenced,
    Left,
    OffsetsCommitted,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
)
from ingest.membership.member import Event, GroupMember
from ingest.protocol.messages import OffsetCommitRequest
from ingest.protocol.partition import Partition
from tests.supervisor.support import client_config, group_config

ROOT = Path(__file__).resolve().parents[2]


def _names(partitions: Any) -> list[list[Any]]:
    return sorted([p.topic, p.partition] for p in partitions)


def describe(event: Event) -> dict[str, Any]:
    if isinstance(event, PartitionsAssigned):
        return {
            "event": "assigned",
            "assignment": _names(event.assignment),
            "generation_id": event.generation_id,
            "member_id": event.member_id,
        }
    if isinstance(event, PartitionsRevoked):
        return {"event": "revoked", "partitions": _names(event.partitions)}
    if isinstance(event, PartitionsLost):
        return {"event": "lost", "partitions": _names(event.partitions), "reason": event.reason}
    if isinstance(event, Fenced | Fatal | Left):
        return {"event": type(event).__name__.lower(), "detail": repr(event)}
    return {"event": "other", "detail": repr(event)}


def main() -> None:
    spec = json.loads(sys.argv[1])
    overrides = spec.get("config", {})
    member = GroupMember(
        client_config(spec["bootstrap"]),
        group_config(spec["group"], **overrides),
        name=spec.get("name", "child"),
    )
    out_lock = threading.Lock()

    def emit(payload: dict[str, Any]) -> None:
        with out_lock:
            sys.stdout.write(json.dumps(payload) + "\n")
            sys.stdout.flush()

    commands: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()

    def read_commands() -> None:
        for line in sys.stdin:
            commands.put(json.loads(line))
        commands.put(None)

    threading.Thread(target=read_commands, daemon=True).start()
    member.subscribe([spec["topic"]])
    emit({"event": "started", "pid": os.getpid()})
    while True:
        for event in member.poll(0.02):
            emit(describe(event))
            if isinstance(event, PartitionsRevoked):
                member.revocation_done()
        try:
            command = commands.get_nowait()
        except queue.Empty:
            continue
        if command is None or "close" in command:
            force = bool(command and command["close"].get("force"))
            for event in member.close(force=force):
                emit(describe(event))
            emit({"event": "closed"})
            return
        if "commit" in command:
            offsets = {Partition(t, p): o for t, p, o in command["commit"]}
            outcome = member.commit(offsets)
            emit(
                {
                    "event": "commit",
                    "ok": isinstance(outcome, OffsetsCommitted),
                    "error_name": outcome.error_name if isinstance(outcome, CommitFailed) else None,
                    "error_code": outcome.error_code if isinstance(outcome, CommitFailed) else None,
                    "retriable": outcome.retriable if isinstance(outcome, CommitFailed) else None,
                    "offset_commits_sent": member.requests_sent(OffsetCommitRequest.api_key),
                }
            )


class MemberProcess:
    """The parent's handle on one ``member_process`` child."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.events: list[tuple[float, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.supervisor.member_process", json.dumps(spec)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._lock:
                self.events.append((time.monotonic(), json.loads(line)))

    def of(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for _, e in self.events if e["event"] == kind]

    @property
    def owned(self) -> frozenset[Partition]:
        owned: set[Partition] = set()
        with self._lock:
            events = [e for _, e in self.events]
        for event in events:
            if event["event"] == "assigned":
                owned = {Partition(t, p) for t, p in event["assignment"]}
            elif event["event"] in ("revoked", "lost"):
                owned -= {Partition(t, p) for t, p in event["partitions"]}
        return frozenset(owned)

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None:
                raise AssertionError(f"the member process exited ({self.process.returncode})")
            if time.monotonic() > end:
                raise AssertionError(f"timed out waiting for {what}; child said {self.events}")
            time.sleep(0.02)

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def signal(self, signum: signal.Signals) -> None:
        os.kill(self.process.pid, signum)

    def stop(self) -> None:
        """Kill it if it still runs (test cleanup)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        self._reader.join(5)


if __name__ == "__main__":
    main()
