"""The consumer-protocol machine's transition table (KIP-848): (state, outcome) -> next state, effects.

The classic table's twin (``classic/classic_transitions.py``), for a member whose
coordinator assigns: one ConsumerGroupHeartbeat joins (member epoch 0), heartbeats,
receives the target assignment and leaves (epoch -1, or -2 for a static member). A
handler (``consumer_machine.py``) reads its input, records what it says and names
the ``Outcome``; the row of ``ROWS`` for the machine's state and that outcome gives
the next state and the ``Effect``s, in order (``consumer_member.py`` carries them
out). A state change is one lookup, by the shared engine (``engine.py``).

``ACCEPTS`` says, per input type, the states that accept it and the outcomes its
handler may name there; any other (state, input) raises ``InvalidTransition``.
``TRANSITIONS`` derives both into the accepted pairs' outcomes and targets.

Reconciliation is incremental: partitions the new target drops are revoked first
(REVOKING until RevocationDone), then the target is applied, which names only the
partitions it adds (``PartitionsAssigned.added``); partitions kept get no event,
so their workers run on. The next heartbeat reports what the member owns.
"""

from __future__ import annotations

from enum import Enum

from ingest.group import engine
from ingest.group.consumer.consumer_events import SubscribeRegex, TopicNames
from ingest.group.engine import Row, Transition, derive_transitions, each, of, row
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
from ingest.group.types import MemberState
from ingest.protocol.messages import (
    ConsumerGroupHeartbeatResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
)

__all__ = [
    "ACCEPTS",
    "ROWS",
    "STAY",
    "TERMINAL",
    "TRANSITIONS",
    "ConsumerState",
    "Effect",
    "Outcome",
    "Row",
    "Step",
    "Transition",
]


class ConsumerState(Enum):
    """Where a consumer-protocol member stands (Kafka's MemberState, folded for our driver).

    UNJOINED     not a member (initial state, and after leaving)
    JOINING      a heartbeat at member epoch 0 is due or in flight
    STABLE       a member epoch; owns all of the target assignment it can name
    RECONCILING  owns what it can name of the target; waits for topic names (TopicNames)
    REVOKING     waits for RevocationDone before applying the target (or rejoining)
    LEAVING      revoking before the leaving heartbeat, or that heartbeat is in flight
    FENCED       terminal: another member took our instance id
    FAILED       terminal: a fatal error
    """

    UNJOINED = "unjoined"
    JOINING = "joining"
    STABLE = "stable"
    RECONCILING = "reconciling"
    REVOKING = "revoking"
    LEAVING = "leaving"
    FENCED = "fenced"
    FAILED = "failed"

    @property
    def for_offsets(self) -> MemberState:
        """The classic state that commits and offset fetches treat alike (``commits.py``)."""
        return _FOR_OFFSETS[self]


_FOR_OFFSETS = {
    ConsumerState.UNJOINED: MemberState.UNJOINED,
    ConsumerState.JOINING: MemberState.JOINING,
    ConsumerState.STABLE: MemberState.STABLE,
    ConsumerState.RECONCILING: MemberState.STABLE,
    ConsumerState.REVOKING: MemberState.REVOKING,
    ConsumerState.LEAVING: MemberState.LEAVING,
    ConsumerState.FENCED: MemberState.FENCED,
    ConsumerState.FAILED: MemberState.FAILED,
}

UNJOINED, JOINING, STABLE, RECONCILING, REVOKING, LEAVING, FENCED, FAILED = ConsumerState
TERMINAL = frozenset({FENCED, FAILED})


class Outcome(Enum):
    """What an input comes to; the row for (state, outcome) says where that leads."""

    STAY = "nothing changes state (answered, refused, stale or only recorded)"
    JOIN = "join at member epoch 0: a heartbeat with every field, at step.at"
    # reconciling the target assignment
    RECONCILED = "the target is applied; the member owns all of it"
    PARTLY_RECONCILED = "the target is applied as far as topic names are known (already asked)"
    AWAIT_TOPIC_NAMES = "the target is applied as far as names are known; ask the others"
    REVOKE = "the target drops partitions: revoke them before applying it"
    # losing the partitions (the coordinator's rule: drop them, rejoin at epoch 0)
    MEMBER_FENCED = "FENCED_MEMBER_EPOCH or UNKNOWN_MEMBER_ID: the partitions are lost"
    SESSION_EXPIRED = "no heartbeat answer within the session timeout: the partitions are lost"
    # leaving
    REVOKE_THEN_LEAVE = "Leave: revoke what is owned; leave once it is acknowledged"
    LEAVE_AFTER_REVOCATION = "Leave: a revocation is pending; leave once it is acknowledged"
    SEND_LEAVE = "send the leaving heartbeat (epoch -1, or -2 for a static member)"
    LEAVE_QUIETLY = "forget the membership without a heartbeat (nothing to leave, or by config)"
    LEFT = "the leaving heartbeat was answered or failed (or there was nothing to leave)"
    # terminal
    FENCE = "FENCED_INSTANCE_ID: another member took our instance id"
    FAIL = "a fatal error: authorization, a request the coordinator refuses, no such API"


class Effect(Enum):
    """One thing a row does, as ``ConsumerMachine`` implements it."""

    START_JOINING = "member epoch 0, a new round (older answers are stale), heartbeat at step.at"
    APPLY_ASSIGNMENT = "own step.assignment; PartitionsAssigned(added) if it changed, ack at once"
    ASK_TOPIC_NAMES = "NeedTopicNames(step.topic_ids)"
    REVOKE = "PartitionsRevoked(step.partitions): committable until RevocationDone"
    LOSE = "PartitionsLost(all owned or being revoked, step.lost)"
    RESET_EPOCH = "member epoch 0, no target, a new round: rejoin once nothing is pending"
    ABANDON_ROUND = "answers to heartbeats sent so far become stale"
    SEND_LEAVE = "the leaving heartbeat, now, even with another heartbeat in flight"
    FORGET_MEMBERSHIP = "member epoch 0, nothing owned, no target"
    STOP = "terminal: abandon the round, forget the membership"
    REPORT = "emit step.report (Left, Fenced, Fatal)"


#: An outcome named by a handler, with what its effects need (``engine.Step``).
Step = engine.Step[Outcome]
STAY = Step(Outcome.STAY)

On = Outcome
Do = Effect

#: (state, outcome) -> the next state and the effects, in order. The only place a state is chosen.
ROWS: dict[tuple[ConsumerState, Outcome], Row[ConsumerState, Effect]] = {
    # -- nothing changes
    **{(state, On.STAY): Row(state) for state in ConsumerState},
    # -- joining: after Subscribe, or once a loss's pending revocation is acknowledged
    (UNJOINED, On.JOIN):                    row(JOINING, Do.START_JOINING),
    (REVOKING, On.JOIN):                    row(JOINING, Do.START_JOINING),
    # -- reconciling a target assignment
    (JOINING, On.RECONCILED):               row(STABLE, Do.APPLY_ASSIGNMENT),
    (STABLE, On.RECONCILED):                row(STABLE, Do.APPLY_ASSIGNMENT),
    (RECONCILING, On.RECONCILED):           row(STABLE, Do.APPLY_ASSIGNMENT),
    (REVOKING, On.RECONCILED):              row(STABLE, Do.APPLY_ASSIGNMENT),
    (RECONCILING, On.PARTLY_RECONCILED):    row(RECONCILING, Do.APPLY_ASSIGNMENT),
    (JOINING, On.AWAIT_TOPIC_NAMES):        row(RECONCILING, Do.APPLY_ASSIGNMENT, Do.ASK_TOPIC_NAMES),
    (STABLE, On.AWAIT_TOPIC_NAMES):         row(RECONCILING, Do.APPLY_ASSIGNMENT, Do.ASK_TOPIC_NAMES),
    (RECONCILING, On.AWAIT_TOPIC_NAMES):    row(RECONCILING, Do.APPLY_ASSIGNMENT, Do.ASK_TOPIC_NAMES),
    (REVOKING, On.AWAIT_TOPIC_NAMES):       row(RECONCILING, Do.APPLY_ASSIGNMENT, Do.ASK_TOPIC_NAMES),
    (STABLE, On.REVOKE):                    row(REVOKING, Do.REVOKE),
    (RECONCILING, On.REVOKE):               row(REVOKING, Do.REVOKE),
    (REVOKING, On.REVOKE):                  row(REVOKING, Do.REVOKE),
    # -- losing the partitions: rejoin at once, or once the pending revocation is acknowledged
    (JOINING, On.MEMBER_FENCED):            row(JOINING, Do.LOSE, Do.RESET_EPOCH, Do.START_JOINING),
    (STABLE, On.MEMBER_FENCED):             row(JOINING, Do.LOSE, Do.RESET_EPOCH, Do.START_JOINING),
    (RECONCILING, On.MEMBER_FENCED):        row(JOINING, Do.LOSE, Do.RESET_EPOCH, Do.START_JOINING),
    (REVOKING, On.MEMBER_FENCED):           row(REVOKING, Do.LOSE, Do.RESET_EPOCH),
    (LEAVING, On.MEMBER_FENCED):            row(LEAVING, Do.LOSE, Do.RESET_EPOCH),
    (STABLE, On.SESSION_EXPIRED):           row(JOINING, Do.LOSE, Do.RESET_EPOCH, Do.START_JOINING),
    (RECONCILING, On.SESSION_EXPIRED):      row(JOINING, Do.LOSE, Do.RESET_EPOCH, Do.START_JOINING),
    (REVOKING, On.SESSION_EXPIRED):         row(REVOKING, Do.LOSE, Do.RESET_EPOCH),
    (LEAVING, On.SESSION_EXPIRED):          row(LEAVING, Do.LOSE, Do.RESET_EPOCH),
    # -- leaving: RevocationDone finishes it in LEAVING
    (STABLE, On.REVOKE_THEN_LEAVE):         row(LEAVING, Do.ABANDON_ROUND, Do.REVOKE),
    (RECONCILING, On.REVOKE_THEN_LEAVE):    row(LEAVING, Do.ABANDON_ROUND, Do.REVOKE),
    (REVOKING, On.REVOKE_THEN_LEAVE):       row(LEAVING, Do.ABANDON_ROUND, Do.REVOKE),
    (REVOKING, On.LEAVE_AFTER_REVOCATION):  row(LEAVING, Do.ABANDON_ROUND),
    (JOINING, On.SEND_LEAVE):               row(LEAVING, Do.ABANDON_ROUND, Do.SEND_LEAVE),
    (STABLE, On.SEND_LEAVE):                row(LEAVING, Do.ABANDON_ROUND, Do.SEND_LEAVE),
    (RECONCILING, On.SEND_LEAVE):           row(LEAVING, Do.ABANDON_ROUND, Do.SEND_LEAVE),
    (LEAVING, On.SEND_LEAVE):               row(LEAVING, Do.SEND_LEAVE),
    (JOINING, On.LEAVE_QUIETLY):            row(UNJOINED, Do.ABANDON_ROUND, Do.FORGET_MEMBERSHIP, Do.REPORT),
    (STABLE, On.LEAVE_QUIETLY):             row(UNJOINED, Do.ABANDON_ROUND, Do.FORGET_MEMBERSHIP, Do.REPORT),
    (RECONCILING, On.LEAVE_QUIETLY):        row(UNJOINED, Do.ABANDON_ROUND, Do.FORGET_MEMBERSHIP, Do.REPORT),
    (LEAVING, On.LEAVE_QUIETLY):            row(UNJOINED, Do.FORGET_MEMBERSHIP, Do.REPORT),
    (UNJOINED, On.LEFT):                    row(UNJOINED, Do.REPORT),
    (LEAVING, On.LEFT):                     row(UNJOINED, Do.REPORT),
    # -- terminal: the partitions are lost, the membership forgotten
    (JOINING, On.FENCE):                    row(FENCED, Do.LOSE, Do.STOP, Do.REPORT),
    (STABLE, On.FENCE):                     row(FENCED, Do.LOSE, Do.STOP, Do.REPORT),
    (RECONCILING, On.FENCE):                row(FENCED, Do.LOSE, Do.STOP, Do.REPORT),
    (REVOKING, On.FENCE):                   row(FENCED, Do.LOSE, Do.STOP, Do.REPORT),
    (LEAVING, On.FENCE):                    row(FENCED, Do.LOSE, Do.STOP, Do.REPORT),
    (UNJOINED, On.FAIL):                    row(FAILED, Do.LOSE, Do.STOP, Do.REPORT),
    (JOINING, On.FAIL):                     row(FAILED, Do.LOSE, Do.STOP, Do.REPORT),
    (STABLE, On.FAIL):                      row(FAILED, Do.LOSE, Do.STOP, Do.REPORT),
    (RECONCILING, On.FAIL):                 row(FAILED, Do.LOSE, Do.STOP, Do.REPORT),
    (REVOKING, On.FAIL):                    row(FAILED, Do.LOSE, Do.STOP, Do.REPORT),
    (LEAVING, On.FAIL):                     row(FAILED, Do.LOSE, Do.STOP, Do.REPORT),
}  # fmt: skip


_ALL = tuple(ConsumerState)
_LIVE = (UNJOINED, JOINING, STABLE, RECONCILING, REVOKING, LEAVING)
_MEMBER = (JOINING, STABLE, RECONCILING, REVOKING)  # in the group, not leaving
_STAY = of(On.STAY)
_STAY_OR_FAIL = {**each(_LIVE, of(On.STAY, On.FAIL)), **each(TERMINAL, _STAY)}
# A new target (or one left waiting for RevocationDone) asks for every id it cannot name;
# only TopicNames, in RECONCILING, can leave ids unnamed that were asked for already.
_RECONCILE = of(On.RECONCILED, On.AWAIT_TOPIC_NAMES, On.REVOKE)
_RENAMED = _RECONCILE | of(On.PARTLY_RECONCILED)
_SUBSCRIBE = {UNJOINED: of(On.JOIN, On.FAIL), **each(_MEMBER, of(On.STAY, On.FAIL))}
_LEAVES = of(On.SEND_LEAVE, On.LEAVE_QUIETLY)
_REQUEST_FAILED = {**each(_ALL, _STAY), LEAVING: of(On.STAY, On.LEFT)}
_ANSWER_LOSES = of(On.STAY, On.MEMBER_FENCED, On.FENCE, On.FAIL)

#: input type -> the states that accept it -> the outcomes its handler may name there.
ACCEPTS: dict[type, dict[ConsumerState, frozenset[Outcome]]] = {
    # local commands
    Subscribe: _SUBSCRIBE,
    SubscribeRegex: _SUBSCRIBE,  # FAIL: the coordinator speaks only v0 (no regex)
    Leave: {
        UNJOINED: of(On.LEFT),
        JOINING: _LEAVES,
        **each((STABLE, RECONCILING), _LEAVES | of(On.REVOKE_THEN_LEAVE)),
        REVOKING: of(On.REVOKE_THEN_LEAVE, On.LEAVE_AFTER_REVOCATION),
        **each((LEAVING, *TERMINAL), _STAY),
    },
    Commit: each(_ALL, _STAY),
    FetchCommitted: each(_ALL, _STAY),
    RevocationDone: {
        REVOKING: of(On.STAY, On.JOIN) | _RECONCILE,
        LEAVING: of(On.STAY) | _LEAVES,
        **each(TERMINAL, _STAY),
    },
    Tick: {
        **each(_ALL, _STAY),
        **each((STABLE, RECONCILING, REVOKING, LEAVING), of(On.STAY, On.SESSION_EXPIRED)),
    },
    # driver reports
    TopicNames: {**each(_ALL, _STAY), RECONCILING: _STAY | _RENAMED},
    CoordinatorFound: _STAY_OR_FAIL,
    CoordinatorLookupFailed: _STAY_OR_FAIL,
    CoordinatorLost: _REQUEST_FAILED,  # every request in flight fails
    RequestFailed: _REQUEST_FAILED,
    # coordinator answers (each must match a request in flight)
    ConsumerGroupHeartbeatResponse: {
        **each((UNJOINED, *TERMINAL), _STAY),
        JOINING: _ANSWER_LOSES | (_RECONCILE - {On.REVOKE}),  # a joining member owns nothing
        **each((STABLE, RECONCILING), _ANSWER_LOSES | _RECONCILE),
        REVOKING: _ANSWER_LOSES,  # a new target waits for RevocationDone
        LEAVING: _ANSWER_LOSES | of(On.LEFT),
    },
    OffsetCommitResponse: _STAY_OR_FAIL,
    OffsetFetchResponse: _STAY_OR_FAIL,
}  # fmt: skip


#: (state, input type) -> outcomes and target states. Nothing else is accepted.
TRANSITIONS: dict[tuple[ConsumerState, type], Transition[ConsumerState, Outcome]] = (
    derive_transitions(ACCEPTS, ROWS)
)
