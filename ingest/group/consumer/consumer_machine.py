"""The consumer-group membership state machine for the consumer protocol (KIP-848), sans I/O.

``ConsumerMachine.handle(input, now)`` applies one input and returns what to do
next, like ``GroupMachine`` (the classic protocol) and with the same inputs and
outputs where they mean the same thing, so one driver can run either. It reads no
clock (``now`` is passed in, monotonic seconds), opens no socket, starts no thread
and draws no random number: the member id (a UUID, KIP-1082) comes from the driver.

The coordinator assigns. The member heartbeats with ConsumerGroupHeartbeat: epoch
0 joins (every field), later heartbeats carry only what changed, at the interval
the coordinator gives. An answer may bring a target assignment by topic id; the
member reconciles it incrementally: it revokes what the target drops
(PartitionsRevoked, then RevocationDone), then owns the target, announcing only
the partitions it adds (PartitionsAssigned.added), and reports what it owns in the
next heartbeat, sent at once. Topic ids it cannot name are asked for
(NeedTopicNames -> TopicNames). Commits carry the member epoch (OffsetCommit v9+).
A static member leaves with epoch -2 and keeps its assignment for a restart; a
dynamic one with -1.

An input passes three places (``consumer_transitions.py`` holds the tables):
``TRANSITIONS`` says whether (state, input type) is accepted (``InvalidTransition``
otherwise, nothing changed); the handler (``consumer_handlers.py``) names the
outcome; the row of ``ROWS`` gives the next state and the effects
(``consumer_effects.py``). ``_step`` is the only place a state is set.
"""

from __future__ import annotations

from ingest.group import engine
from ingest.group.consumer.consumer_effects import CONSUMER_EFFECTS, ConsumerEffects
from ingest.group.consumer.consumer_events import (
    ConsumerInput,
    ConsumerOutput,
    SubscribeRegex,
    TopicNames,
)
from ingest.group.consumer.consumer_handlers import ConsumerHandlers
from ingest.group.consumer.consumer_transitions import (
    ROWS,
    TRANSITIONS,
    ConsumerState,
    Effect,
    Outcome,
)
from ingest.group.events import (
    Commit,
    CoordinatorFound,
    CoordinatorLookupFailed,
    CoordinatorLost,
    FetchCommitted,
    Leave,
    RequestFailed,
    RevocationDone,
    Subscribe,
    Tick,
)
from ingest.protocol.messages import (
    ConsumerGroupHeartbeatResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
)

__all__ = ["CONSUMER_HANDLERS", "ConsumerMachine"]


class ConsumerMachine(ConsumerHandlers, ConsumerEffects):
    """One consumer's membership in one consumer-protocol group. See the module docstring."""

    def handle(self, event: ConsumerInput, now: float) -> list[ConsumerOutput]:
        """Apply ``event`` at time ``now``; return the outputs in the order to act on them."""
        return _ENGINE.handle(self, event, now)

    def _enter(self, state: ConsumerState) -> None:
        """Called by the engine only: the row's next state."""
        self._state = state


Handler = engine.Handler["ConsumerMachine", ConsumerOutput]

#: input type -> the handler naming its outcome (``ACCEPTS`` says where it is accepted).
CONSUMER_HANDLERS: dict[type, Handler] = {
    Subscribe: ConsumerMachine._on_subscribe,
    SubscribeRegex: ConsumerMachine._on_subscribe_regex,
    Leave: ConsumerMachine._on_leave,
    Commit: ConsumerMachine._on_commit,
    FetchCommitted: ConsumerMachine._on_fetch_committed,
    RevocationDone: ConsumerMachine._on_revocation_done,
    Tick: ConsumerMachine._on_tick,
    TopicNames: ConsumerMachine._on_topic_names,
    CoordinatorFound: ConsumerMachine._on_coordinator_found,
    CoordinatorLookupFailed: ConsumerMachine._on_lookup_failed,
    CoordinatorLost: ConsumerMachine._on_coordinator_lost,
    RequestFailed: ConsumerMachine._on_request_failed,
    ConsumerGroupHeartbeatResponse: ConsumerMachine._on_heartbeat_response,
    OffsetCommitResponse: ConsumerMachine._on_commit_response,
    OffsetFetchResponse: ConsumerMachine._on_fetch_response,
}

_ENGINE: engine.Engine[ConsumerMachine, ConsumerState, Outcome, Effect, ConsumerOutput] = (
    engine.Engine(ROWS, TRANSITIONS, CONSUMER_HANDLERS, CONSUMER_EFFECTS)
)
