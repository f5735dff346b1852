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

from ingest.group import engine
from ingest.group.classic.answers import AnswerHandlers
from ingest.group.classic.classic_transitions import ROWS, TRANSITIONS, Effect, Outcome, Transition
from ingest.group.classic.commands import CommandHandlers
from ingest.group.classic.effects import EFFECTS, Effects
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
from ingest.group.types import MemberState
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
        return _ENGINE.handle(self, event, now)

    def _enter(self, state: MemberState) -> None:
        """Called by the engine only: the row's next state."""
        self._state = state


Handler = engine.Handler["GroupMachine", Output]

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

_ENGINE: engine.Engine[GroupMachine, MemberState, Outcome, Effect, Output] = engine.Engine(
    ROWS, TRANSITIONS, _HANDLERS, EFFECTS
)
