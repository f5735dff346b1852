"""The consumer-group membership state machine (classic protocol), sans I/O.

``GroupMachine.handle(input, now)`` applies one input and returns what to do
next: requests to send to the coordinator, lookups and metadata the driver
must provide, and events for the application. It reads no clock (``now`` is
passed in, monotonic seconds), opens no socket and starts no thread.

An input passes three places, as in h11 and h2 (``transitions.py`` holds the tables):

1. ``TRANSITIONS``: is (state, input type) accepted? If not, ``InvalidTransition``
   is raised and nothing changes.
2. The input's handler (``commands.py`` for commands and driver reports,
   ``answers.py`` for the coordinator's answers) records what the input says and
   names the outcome, a ``Step``, following Kafka's AbstractCoordinator and
   ConsumerCoordinator: which errors rejoin at once, which back off, which reset
   the member id, which lose the partitions and which are fatal. A handler never
   chooses a state.
3. ``ROWS``: the row for (state, outcome) gives the next state and the effects
   (``effects.py``). ``_step`` runs them and enters the state; nothing else sets
   one. An input that takes several steps (an assignment applied, then the rejoin
   a changed subscription asked for; each request a lost connection failed)
   yields them, one lookup each.

Requests go out from one place, ``_pump`` (``core.py``), after every input: the
coordinator lookup when needed, the JoinGroup when due, and heartbeats (at most
one in flight) every ``heartbeat_interval_ms`` while a member of a generation.
Responses of one API must be fed back in the order their requests were sent;
each is matched to the oldest request of its API still in flight, and one sent
for a round or generation that has since been abandoned is set aside
(``inflight.py``). The leader's assignment is ``leader.py``; commits and offset
fetches are ``offsets.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ingest.group.answers import AnswerHandlers
from ingest.group.commands import CommandHandlers
from ingest.group.effects import EFFECTS, Effects
from ingest.group.events import (
    Commit,
    CoordinatorFound,
    CoordinatorLookupFailed,
    CoordinatorLost,
    FetchCommitted,
    Input,
    Leave,
    MetadataUpdate,
    Output,
    RequestFailed,
    RevocationDone,
    Subscribe,
    Tick,
)
from ingest.group.transitions import ROWS, TRANSITIONS, Step, Transition
from ingest.group.types import InvalidTransition
from ingest.protocol.messages import (
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
    SyncGroupResponse,
)

__all__ = ["TRANSITIONS", "GroupMachine", "Transition"]


class GroupMachine(CommandHandlers, AnswerHandlers, Effects):
    """One consumer's membership in one group. See the module docstring."""

    # -- the one entry point ----------------------------------------------------------

    def handle(self, event: Input, now: float) -> list[Output]:
        """Apply ``event`` at time ``now``; return the outputs in the order to act on them."""
        before = self._state
        transition = TRANSITIONS.get((before, type(event)))
        if transition is None:
            raise InvalidTransition(before, type(event))
        out: list[Output] = []
        named = _HANDLERS[type(event)](self, event, now, out)
        for step in (named,) if isinstance(named, Step) else named:
            self._step(step, transition, now, out)
        if self._state not in transition.targets:
            raise AssertionError(
                f"{type(event).__name__} took {before.name} to {self._state.name}, "
                f"which TRANSITIONS does not name"
            )
        self._pump(now, out)
        return out

    def _step(self, step: Step, transition: Transition, now: float, out: list[Output]) -> None:
        """One table lookup: run the row's effects, then enter its state."""
        row = ROWS.get((self._state, step.outcome))
        if row is None or step.outcome not in transition.outcomes:
            raise AssertionError(
                f"{step.outcome.name} in {self._state.name} is not a row of ROWS named by "
                f"this input's transition"
            )
        for effect in row.effects:
            EFFECTS[effect](self, step, now, out)
        self._state = row.next


Handler = Callable[[GroupMachine, Any, float, list[Output]], Step | Iterator[Step]]

#: input type -> the handler naming its outcome (``ACCEPTS`` says where it is accepted).
_HANDLERS: dict[type, Handler] = {
    Subscribe: GroupMachine._on_subscribe,
    Leave: GroupMachine._on_leave,
    Commit: GroupMachine._on_commit,
    FetchCommitted: GroupMachine._on_fetch_committed,
    RevocationDone: GroupMachine._on_revocation_done,
    Tick: GroupMachine._on_tick,
    MetadataUpdate: GroupMachine._on_metadata,
    CoordinatorFound: GroupMachine._on_coordinator_found,
    CoordinatorLookupFailed: GroupMachine._on_lookup_failed,
    CoordinatorLost: GroupMachine._on_coordinator_lost,
    RequestFailed: GroupMachine._on_request_failed,
    JoinGroupResponse: GroupMachine._on_join_response,
    SyncGroupResponse: GroupMachine._on_sync_response,
    HeartbeatResponse: GroupMachine._on_heartbeat_response,
    LeaveGroupResponse: GroupMachine._on_leave_response,
    OffsetCommitResponse: GroupMachine._on_commit_response,
    OffsetFetchResponse: GroupMachine._on_fetch_response,
}
