"""A member's coordination with its coordinator, in either protocol, and what its refusals
come to.

``Coordination`` holds the coordinator found (or the lookup: asked for, when to ask
again, why), and the requests in flight to it (``inflight.py``: an answer is matched to
the oldest request of its API). Both machines' records hold one (``link``) and use it
the same way: ``look_up`` from their ``pump``, ``send`` and ``take`` for every request,
``forget`` when an answer or a lost connection says the coordinator moved. (The
connections themselves are the supervisor's, ``membership_io.py``.)

``fail`` and ``fence`` name the outcomes both protocols give a fatal error code and
FENCED_INSTANCE_ID; ``LOOKUP_FATAL`` and ``COORDINATOR_MOVED`` are the codes both
treat alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import TypeVar

from ingest.group.engine import Step
from ingest.group.events import (
    Commit,
    CoordinatorFound,
    CoordinatorLookupFailed,
    Fatal,
    Fenced,
    FindCoordinator,
    RequestFailed,
    SendRequest,
)
from ingest.group.inflight import Epoch, InFlight, Sent
from ingest.group.types import InvalidTransition
from ingest.protocol.error_codes import ErrorCode, error_for
from ingest.protocol.partition import Partition
from ingest.protocol.schema import Request

__all__ = ["COORDINATOR_MOVED", "LOOKUP_FATAL", "Coordination", "fail", "fence"]

E = ErrorCode
OutcomeT = TypeVar("OutcomeT", bound=Enum)

#: FindCoordinator errors no retry mends.
LOOKUP_FATAL = frozenset({E.GROUP_AUTHORIZATION_FAILED, E.INVALID_REQUEST, E.INVALID_GROUP_ID})
#: Errors after which the coordinator is looked up again.
COORDINATOR_MOVED = frozenset({E.COORDINATOR_NOT_AVAILABLE, E.NOT_COORDINATOR})


@dataclass
class Coordination:
    """The coordinator found or being looked up, and the requests in flight to it."""

    inflight: InFlight = field(default_factory=InFlight)
    found: CoordinatorFound | None = None
    lookup_pending: bool = False
    lookup_retry_at: float = -math.inf
    lookup_reason: str = "no coordinator known yet"

    def forget(self, reason: str) -> None:
        """Recorded from an input: the coordinator is gone; ``look_up`` asks for it again."""
        if self.found is not None:
            self.lookup_reason = reason
        self.found = None

    def lookup_due(self, needed: bool) -> float | None:
        """When ``look_up`` would ask for the coordinator; None when it is known or asked for."""
        if self.found is None and needed and not self.lookup_pending:
            return self.lookup_retry_at
        return None

    def look_up(self, now: float, needed: bool) -> FindCoordinator | None:
        """The lookup to ask for, when the coordinator is unknown, ``needed`` and it is due."""
        due = now >= self.lookup_retry_at
        if self.found is None and needed and not self.lookup_pending and due:
            self.lookup_pending = True
            return FindCoordinator(self.lookup_reason)
        return None

    def lookup_failed(
        self, event: CoordinatorLookupFailed, state: Enum, retry_at: float, terminal: bool
    ) -> int | None:
        """The lookup asked for failed: the fatal error code (``LOOKUP_FATAL``, for a member
        not already ``terminal``), or None and the lookup is asked for again at ``retry_at``."""
        if not self.lookup_pending:
            raise InvalidTransition(state, CoordinatorLookupFailed, "no lookup was asked for")
        self.lookup_pending = False
        code = event.error_code
        if code in LOOKUP_FATAL and not terminal:
            return code
        self.lookup_retry_at = retry_at
        return None

    def send(
        self,
        request: Request,
        version: int,
        epoch: Epoch,
        *,
        commit: Commit | None = None,
        partitions: frozenset[Partition] = frozenset(),
        sent_at: float = -math.inf,
    ) -> SendRequest:
        """``request`` to send, remembered in flight with what its answer needs."""
        api_key = type(request).api_key
        self.inflight.add(Sent(api_key, epoch, commit, partitions, sent_at))
        return SendRequest(request, version)

    def lost(self, reason: str) -> Iterator[Sent]:
        """The connection is lost: the coordinator is forgotten, and every request in flight
        has failed (taken lazily, API by API, oldest first: ``InFlight.drain``)."""
        self.forget(reason or "the coordinator connection was lost")
        return self.inflight.drain()

    def failed(self, event: RequestFailed, state: Enum) -> Sent:
        """The oldest request of the failed one's API, taken; the coordinator is forgotten."""
        sent = self.take(event.api_key, RequestFailed, state)
        self.forget(event.reason or "a request to the coordinator failed")
        return sent

    def take(self, api_key: int, input_type: type, state: Enum) -> Sent:
        """The request an answer (or a failure) of ``api_key`` belongs to: the oldest in flight."""
        sent = self.inflight.take(api_key)
        if sent is None:
            raise InvalidTransition(state, input_type, "no such request is in flight")
        return sent


def fence(outcome: OutcomeT, api: str, instance_id: str | None, who: str) -> Step[OutcomeT]:
    """FENCED_INSTANCE_ID: another ``who`` joined with our group.instance.id (terminal)."""
    reason = (
        f"{api}: FENCED_INSTANCE_ID: another {who} joined with group.instance.id {instance_id!r}"
    )
    return Step(outcome, lost=reason, report=Fenced(reason))


def fail(
    outcome: OutcomeT, code: int, context: str, group_id: str, detail: str | None = None
) -> Step[OutcomeT]:
    """A fatal error code from the coordinator (or for it)."""
    info = error_for(code)
    if code == E.GROUP_AUTHORIZATION_FAILED:
        message = f"{context}: not authorized to use group {group_id!r}"
    else:
        message = f"{context}: {info.name}: {detail or info.description}"
    return Step(outcome, lost=message, report=Fatal(code, info.name, message))
