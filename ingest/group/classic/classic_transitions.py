"""The classic machine's transition table: (state, outcome) -> next state and effects.

A handler reads its input, records what the input says (a member id, a
subscription, that the coordinator moved) and names the ``Outcome``: a ``Step``.
The row of ``ROWS`` for the machine's state and that outcome gives the next
state and the ``Effect``s that carry the outcome out, in order. Handlers never
choose a state: a state change is one lookup in ``ROWS``, as in h11 and h2, by the
shared engine (``engine.py``); ``classic_member.py`` carries the effects out. An
input may take more than one step (an assignment applied, then the rejoin the
subscription asked for; each request a lost connection failed), each a lookup.

``ACCEPTS`` is the other half: for each input type, the states that accept it
and the outcomes its handler may name there. Any other (state, input) pair
raises ``InvalidTransition``. ``TRANSITIONS`` derives from both, per accepted
pair, the outcomes and the states they can lead to. (In the tables, ``On`` is
``Outcome`` and ``Do`` is ``Effect``.)
"""

from __future__ import annotations

from enum import Enum

from ingest.group import engine
from ingest.group.engine import Row, Transition, derive_transitions, each, of, row
from ingest.group.events import (
    Commit,
    CoordinatorFound,
    CoordinatorLookupFailed,
    CoordinatorLost,
    FetchCommitted,
    Leave,
    MetadataUpdate,
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

__all__ = [
    "ACCEPTS",
    "ROWS",
    "STAY",
    "TERMINAL",
    "TRANSITIONS",
    "Effect",
    "Outcome",
    "Row",
    "Step",
    "Transition",
]

UNJOINED, JOINING, SYNCING, STABLE, REVOKING, LEAVING, FENCED, FAILED = MemberState
TERMINAL = frozenset({FENCED, FAILED})


class Outcome(Enum):
    """What an input comes to; the row for (state, outcome) says where that leads."""

    STAY = "nothing changes state (answered, refused, stale or only recorded)"
    # joining and syncing
    JOIN = "start a join round: a JoinGroup now, or after a backoff"
    RETRY_JOIN = "the JoinGroup got no answer: send it again after a backoff"
    REJOIN_AFTER_SYNC = "the subscription changed mid-round: finish it, then rejoin"
    REVOKE_THEN_JOIN = "rejoin, but first revoke what must not be kept while rejoining"
    REVOKE_MORE = "already revoking: revoke more (topics left the subscription)"
    AWAIT_METADATA = "the leader needs partition counts before it can assign"
    CHECK_METADATA = "the stable leader looks again at its topics (metadata_refresh_ms)"
    SYNC = "send the SyncGroup (the leader's assignments, or a follower's empty one)"
    ASSIGNED = "the SyncGroup answer's assignment is applied"
    ASSIGNED_REVOKING = "the assignment is applied; what it takes away is revoked"
    # losing the generation (Kafka's rule: the partitions are lost, then rejoin)
    GENERATION_LOST = "ILLEGAL_GENERATION: the member id may still be valid"
    MEMBER_LOST = "UNKNOWN_MEMBER_ID: the member id is gone too"
    SESSION_EXPIRED = "no heartbeat answer within the session timeout"
    # leaving
    REVOKE_THEN_LEAVE = "Leave: revoke what is owned; leave once it is acknowledged"
    LEAVE_AFTER_REVOCATION = "Leave: revocations are pending; leave once acknowledged"
    SEND_LEAVE_GROUP = "forget the membership and send LeaveGroup"
    LEAVE_QUIETLY = "forget the membership without LeaveGroup (static, or nothing to leave)"
    LEFT = "the LeaveGroup was answered or failed (or there was nothing to leave)"
    # terminal
    FENCE = "another consumer joined with our group.instance.id"
    FAIL = "a fatal error: authorization, inconsistent protocol, broken protocol"


class Effect(Enum):
    """One thing a row does, as ``GroupMachine`` implements it."""

    START_JOINING = "new round: answers to the old one are stale; JoinGroup due at step.at"
    RETRY_JOIN = "the JoinGroup is due again after retry_backoff"
    REJOIN_AFTER_SYNC = "remember to rejoin once this round's SyncGroup is answered"
    ABANDON_ROUND = "answers to this round's JoinGroup and SyncGroup become stale"
    REVOKE = "PartitionsRevoked(step.partitions): committable until RevocationDone"
    ASK_METADATA = "NeedMetadata(step.topics)"
    SEND_SYNC = "SyncGroup with step.assignments"
    APPLY_ASSIGNMENT = "own step.assignment from this generation; PartitionsAssigned"
    LOSE = "PartitionsLost(all owned or being revoked, step.lost)"
    RESET_GENERATION = "forget generation, protocol and leader; keep the member id"
    RESET_MEMBER = "forget generation, protocol, leader and the member id"
    STOP = "terminal: abandon the round, forget generation and member id"
    SEND_LEAVE_GROUP = "forget the membership; LeaveGroup for the member id it had"
    FORGET_MEMBERSHIP = "forget generation, member id and assignment"
    REPORT = "emit step.report (Left, Fenced, Fatal)"


#: An outcome named by a handler, with what its effects need (``engine.Step``).
Step = engine.Step[Outcome]
STAY = Step(Outcome.STAY)

On = Outcome
Do = Effect

#: (state, outcome) -> the next state and the effects, in order. The only place a state is chosen.
ROWS: dict[tuple[MemberState, Outcome], Row[MemberState, Effect]] = {
    # -- nothing changes
    **{(state, On.STAY): Row(state) for state in MemberState},
    # -- joining and syncing
    (UNJOINED, On.JOIN):                   row(JOINING, Do.START_JOINING),
    (JOINING, On.JOIN):                    row(JOINING, Do.START_JOINING),
    (SYNCING, On.JOIN):                    row(JOINING, Do.START_JOINING),
    (STABLE, On.JOIN):                     row(JOINING, Do.START_JOINING),
    (REVOKING, On.JOIN):                   row(JOINING, Do.START_JOINING),
    (JOINING, On.RETRY_JOIN):              row(JOINING, Do.RETRY_JOIN),
    (JOINING, On.REJOIN_AFTER_SYNC):       row(JOINING, Do.REJOIN_AFTER_SYNC),
    (SYNCING, On.REJOIN_AFTER_SYNC):       row(SYNCING, Do.REJOIN_AFTER_SYNC),
    (JOINING, On.REVOKE_THEN_JOIN):        row(REVOKING, Do.ABANDON_ROUND, Do.REVOKE),
    (SYNCING, On.REVOKE_THEN_JOIN):        row(REVOKING, Do.ABANDON_ROUND, Do.REVOKE),
    (STABLE, On.REVOKE_THEN_JOIN):         row(REVOKING, Do.ABANDON_ROUND, Do.REVOKE),
    (REVOKING, On.REVOKE_MORE):            row(REVOKING, Do.REVOKE),
    (JOINING, On.AWAIT_METADATA):          row(SYNCING, Do.ASK_METADATA),
    (SYNCING, On.AWAIT_METADATA):          row(SYNCING, Do.ASK_METADATA),
    (STABLE, On.CHECK_METADATA):           row(STABLE, Do.ASK_METADATA),
    (JOINING, On.SYNC):                    row(SYNCING, Do.SEND_SYNC),
    (SYNCING, On.SYNC):                    row(SYNCING, Do.SEND_SYNC),
    (SYNCING, On.ASSIGNED):                row(STABLE, Do.APPLY_ASSIGNMENT),
    (SYNCING, On.ASSIGNED_REVOKING):       row(REVOKING, Do.REVOKE, Do.APPLY_ASSIGNMENT),
    # -- losing the generation: rejoin at once, or once the revocations are acknowledged
    (JOINING, On.GENERATION_LOST):         row(JOINING, Do.LOSE, Do.RESET_GENERATION, Do.START_JOINING),
    (SYNCING, On.GENERATION_LOST):         row(JOINING, Do.LOSE, Do.RESET_GENERATION, Do.START_JOINING),
    (STABLE, On.GENERATION_LOST):          row(JOINING, Do.LOSE, Do.RESET_GENERATION, Do.START_JOINING),
    (REVOKING, On.GENERATION_LOST):        row(REVOKING, Do.LOSE, Do.RESET_GENERATION),
    (LEAVING, On.GENERATION_LOST):         row(LEAVING, Do.LOSE, Do.RESET_GENERATION),
    (JOINING, On.MEMBER_LOST):             row(JOINING, Do.LOSE, Do.RESET_MEMBER, Do.START_JOINING),
    (SYNCING, On.MEMBER_LOST):             row(JOINING, Do.LOSE, Do.RESET_MEMBER, Do.START_JOINING),
    (STABLE, On.MEMBER_LOST):              row(JOINING, Do.LOSE, Do.RESET_MEMBER, Do.START_JOINING),
    (REVOKING, On.MEMBER_LOST):            row(REVOKING, Do.LOSE, Do.RESET_MEMBER),
    (LEAVING, On.MEMBER_LOST):             row(LEAVING, Do.LOSE, Do.RESET_MEMBER),
    (SYNCING, On.SESSION_EXPIRED):         row(JOINING, Do.LOSE, Do.RESET_GENERATION, Do.START_JOINING),
    (STABLE, On.SESSION_EXPIRED):          row(JOINING, Do.LOSE, Do.RESET_GENERATION, Do.START_JOINING),
    (REVOKING, On.SESSION_EXPIRED):        row(REVOKING, Do.LOSE, Do.RESET_GENERATION),
    (LEAVING, On.SESSION_EXPIRED):         row(LEAVING, Do.LOSE, Do.RESET_GENERATION),
    # -- leaving: a Leave abandons the round in progress; RevocationDone finishes in LEAVING
    (JOINING, On.REVOKE_THEN_LEAVE):       row(LEAVING, Do.ABANDON_ROUND, Do.REVOKE),
    (SYNCING, On.REVOKE_THEN_LEAVE):       row(LEAVING, Do.ABANDON_ROUND, Do.REVOKE),
    (STABLE, On.REVOKE_THEN_LEAVE):        row(LEAVING, Do.ABANDON_ROUND, Do.REVOKE),
    (REVOKING, On.REVOKE_THEN_LEAVE):      row(LEAVING, Do.ABANDON_ROUND, Do.REVOKE),
    (REVOKING, On.LEAVE_AFTER_REVOCATION): row(LEAVING, Do.ABANDON_ROUND),
    (JOINING, On.SEND_LEAVE_GROUP):        row(LEAVING, Do.ABANDON_ROUND, Do.SEND_LEAVE_GROUP),
    (SYNCING, On.SEND_LEAVE_GROUP):        row(LEAVING, Do.ABANDON_ROUND, Do.SEND_LEAVE_GROUP),
    (STABLE, On.SEND_LEAVE_GROUP):         row(LEAVING, Do.ABANDON_ROUND, Do.SEND_LEAVE_GROUP),
    (REVOKING, On.SEND_LEAVE_GROUP):       row(LEAVING, Do.ABANDON_ROUND, Do.SEND_LEAVE_GROUP),
    (LEAVING, On.SEND_LEAVE_GROUP):        row(LEAVING, Do.SEND_LEAVE_GROUP),
    (JOINING, On.LEAVE_QUIETLY):           row(UNJOINED, Do.ABANDON_ROUND, Do.FORGET_MEMBERSHIP, Do.REPORT),
    (SYNCING, On.LEAVE_QUIETLY):           row(UNJOINED, Do.ABANDON_ROUND, Do.FORGET_MEMBERSHIP, Do.REPORT),
    (STABLE, On.LEAVE_QUIETLY):            row(UNJOINED, Do.ABANDON_ROUND, Do.FORGET_MEMBERSHIP, Do.REPORT),
    (REVOKING, On.LEAVE_QUIETLY):          row(UNJOINED, Do.ABANDON_ROUND, Do.FORGET_MEMBERSHIP, Do.REPORT),
    (LEAVING, On.LEAVE_QUIETLY):           row(UNJOINED, Do.FORGET_MEMBERSHIP, Do.REPORT),
    (UNJOINED, On.LEFT):                   row(UNJOINED, Do.REPORT),
    (LEAVING, On.LEFT):                    row(UNJOINED, Do.REPORT),
    # -- terminal: the partitions are lost, the membership forgotten
    (JOINING, On.FENCE):                   row(FENCED, Do.LOSE, Do.STOP, Do.REPORT),
    (SYNCING, On.FENCE):                   row(FENCED, Do.LOSE, Do.STOP, Do.REPORT),
    (STABLE, On.FENCE):                    row(FENCED, Do.LOSE, Do.STOP, Do.REPORT),
    (REVOKING, On.FENCE):                  row(FENCED, Do.LOSE, Do.STOP, Do.REPORT),
    (LEAVING, On.FENCE):                   row(FENCED, Do.LOSE, Do.STOP, Do.REPORT),
    (UNJOINED, On.FAIL):                   row(FAILED, Do.LOSE, Do.STOP, Do.REPORT),
    (JOINING, On.FAIL):                    row(FAILED, Do.LOSE, Do.STOP, Do.REPORT),
    (SYNCING, On.FAIL):                    row(FAILED, Do.LOSE, Do.STOP, Do.REPORT),
    (STABLE, On.FAIL):                     row(FAILED, Do.LOSE, Do.STOP, Do.REPORT),
    (REVOKING, On.FAIL):                   row(FAILED, Do.LOSE, Do.STOP, Do.REPORT),
    (LEAVING, On.FAIL):                    row(FAILED, Do.LOSE, Do.STOP, Do.REPORT),
}  # fmt: skip


_ALL = tuple(MemberState)
_LIVE = (UNJOINED, JOINING, SYNCING, STABLE, REVOKING, LEAVING)  # all but the terminal ones
_STAY = of(On.STAY)
_STAY_OR_FAIL = {**each(_LIVE, of(On.STAY, On.FAIL)), **each(TERMINAL, _STAY)}
_ANSWER_LOSES = of(On.STAY, On.GENERATION_LOST, On.MEMBER_LOST, On.FENCE, On.FAIL)
_REQUEST_FAILED = {
    **each(_ALL, _STAY),
    JOINING: of(On.STAY, On.RETRY_JOIN),
    SYNCING: of(On.STAY, On.JOIN, On.REVOKE_THEN_JOIN),
    LEAVING: of(On.STAY, On.LEFT),
}
_LEAVES = of(On.REVOKE_THEN_LEAVE, On.SEND_LEAVE_GROUP, On.LEAVE_QUIETLY)

#: input type -> the states that accept it -> the outcomes its handler may name there.
ACCEPTS: dict[type, dict[MemberState, frozenset[Outcome]]] = {
    # local commands
    Subscribe: {
        UNJOINED: of(On.JOIN),
        JOINING: of(On.STAY, On.REJOIN_AFTER_SYNC),
        SYNCING: of(On.STAY, On.REJOIN_AFTER_SYNC),
        STABLE: of(On.STAY, On.JOIN, On.REVOKE_THEN_JOIN),
        REVOKING: of(On.STAY, On.REVOKE_MORE),
    },
    Leave: {
        UNJOINED: of(On.LEFT),
        **each((JOINING, SYNCING, STABLE), _LEAVES),
        REVOKING: _LEAVES | of(On.LEAVE_AFTER_REVOCATION),
        **each((LEAVING, FENCED, FAILED), _STAY),
    },
    Commit: each(_ALL, _STAY),
    FetchCommitted: each(_ALL, _STAY),
    RevocationDone: {
        REVOKING: of(On.STAY, On.JOIN),
        LEAVING: of(On.STAY, On.SEND_LEAVE_GROUP, On.LEAVE_QUIETLY),
        **each(TERMINAL, _STAY),
    },
    Tick: {
        **each(_ALL, _STAY),
        **each((SYNCING, REVOKING, LEAVING), of(On.STAY, On.SESSION_EXPIRED)),
        STABLE: of(On.STAY, On.SESSION_EXPIRED, On.CHECK_METADATA),
    },
    # driver reports
    MetadataUpdate: {
        **each(_ALL, _STAY),
        SYNCING: of(On.STAY, On.AWAIT_METADATA, On.SYNC, On.JOIN, On.REVOKE_THEN_JOIN, On.FAIL),
        STABLE: of(On.STAY, On.JOIN, On.REVOKE_THEN_JOIN),
    },
    CoordinatorFound: _STAY_OR_FAIL,
    CoordinatorLookupFailed: _STAY_OR_FAIL,
    CoordinatorLost: _REQUEST_FAILED,  # every request in flight fails, then SYNCING rejoins
    RequestFailed: _REQUEST_FAILED,
    # coordinator answers (each must match a request in flight)
    JoinGroupResponse: {
        **each(_ALL, _STAY),
        JOINING: of(On.STAY, On.JOIN, On.MEMBER_LOST, On.AWAIT_METADATA, On.SYNC,
                    On.REVOKE_THEN_JOIN, On.FENCE, On.FAIL),
    },
    SyncGroupResponse: {
        **each(_ALL, _STAY),
        # an assignment applied may then rejoin (the subscription changed meanwhile)
        SYNCING: of(On.STAY, On.ASSIGNED, On.ASSIGNED_REVOKING, On.JOIN, On.REVOKE_THEN_JOIN,
                    On.GENERATION_LOST, On.MEMBER_LOST, On.FENCE, On.FAIL),
    },
    HeartbeatResponse: {
        **each((UNJOINED, *TERMINAL), _STAY),
        **each((JOINING, SYNCING, REVOKING, LEAVING), _ANSWER_LOSES),
        STABLE: _ANSWER_LOSES | of(On.JOIN, On.REVOKE_THEN_JOIN),
    },
    LeaveGroupResponse: {LEAVING: of(On.LEFT)},
    OffsetCommitResponse: {
        **each((UNJOINED, *TERMINAL), _STAY),
        **each((JOINING, SYNCING, REVOKING, LEAVING), _ANSWER_LOSES),
        STABLE: _ANSWER_LOSES | of(On.JOIN, On.REVOKE_THEN_JOIN),
    },
    OffsetFetchResponse: _STAY_OR_FAIL,
}  # fmt: skip


#: (state, input type) -> outcomes and target states. Nothing else is accepted.
TRANSITIONS: dict[tuple[MemberState, type], Transition[MemberState, Outcome]] = derive_transitions(
    ACCEPTS, ROWS
)
