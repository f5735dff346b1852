"""The transition table is the only place a state is chosen, and it is complete:
every outcome a handler may name has a row, every row is reachable, every effect
and every input has its implementation."""

from __future__ import annotations

import ast
from pathlib import Path

from ingest.group import INPUT_TYPES, TRANSITIONS, MemberState
from ingest.group.classic.classic_machine import HANDLERS
from ingest.group.classic.classic_member import EFFECTS
from ingest.group.classic.classic_transitions import ACCEPTS, ROWS, TERMINAL, Effect, Outcome

GROUP = Path(__file__).resolve().parents[2] / "ingest" / "group"
S = MemberState


def test_every_input_has_a_handler_and_an_acceptance_row() -> None:
    assert set(HANDLERS) == set(INPUT_TYPES) == set(ACCEPTS)


def test_every_effect_is_implemented() -> None:
    assert set(EFFECTS) == set(Effect)


def test_the_accepted_pairs_are_unchanged() -> None:
    """Issue 15 moved the table; which (state, input) pairs are accepted did not change."""
    refused = {(s, i) for s in MemberState for i in INPUT_TYPES} - set(TRANSITIONS)
    only_in = {
        "Subscribe": {S.UNJOINED, S.JOINING, S.SYNCING, S.STABLE, S.REVOKING},
        "RevocationDone": {S.REVOKING, S.LEAVING, S.FENCED, S.FAILED},
        "LeaveGroupResponse": {S.LEAVING},
    }
    expected = {
        (s, i)
        for i in INPUT_TYPES
        if i.__name__ in only_in
        for s in set(MemberState) - only_in[i.__name__]
    }
    assert refused == expected
    assert len(TRANSITIONS) == 122


def test_every_named_outcome_has_a_row_and_every_row_is_named() -> None:
    named = set()
    for (state, input_type), transition in TRANSITIONS.items():
        assert transition.outcomes, (state, input_type)
        for outcome in transition.outcomes:
            assert (state, outcome) in ROWS, (state.name, input_type.__name__, outcome.name)
            named.add((state, outcome))
        assert transition.targets == {ROWS[(state, o)].next for o in transition.outcomes}
    assert set(ROWS) == named, sorted((s.name, o.name) for s, o in set(ROWS) - named)
    assert {outcome for _, outcome in ROWS} == set(Outcome)


def test_rows_read_as_the_protocol_says() -> None:
    # A few rows, spelled out: reading one tells where an outcome leads and what it does.
    assert ROWS[(S.STABLE, Outcome.GENERATION_LOST)].next is S.JOINING
    assert ROWS[(S.STABLE, Outcome.GENERATION_LOST)].effects == (
        Effect.LOSE,
        Effect.RESET_GENERATION,
        Effect.START_JOINING,
    )
    assert ROWS[(S.REVOKING, Outcome.MEMBER_LOST)].next is S.REVOKING  # waits for RevocationDone
    assert ROWS[(S.SYNCING, Outcome.ASSIGNED_REVOKING)].next is S.REVOKING
    assert ROWS[(S.LEAVING, Outcome.LEFT)].next is S.UNJOINED
    for state in MemberState:
        assert ROWS[(state, Outcome.STAY)].next is state and not ROWS[(state, Outcome.STAY)].effects
    # Nothing leaves a terminal state, and every way into one loses the partitions first.
    for (state, outcome), row in ROWS.items():
        if state in TERMINAL:
            assert outcome is Outcome.STAY
        elif row.next in TERMINAL:
            assert row.effects[0] is Effect.LOSE and Effect.STOP in row.effects


def test_only_the_table_lookup_sets_the_state() -> None:
    """The record's ``state`` is set in two places in the classic package and the engine: its
    initial value, and the engine's one table lookup (``TableEngine._step``). The consumer
    protocol's: ``test_consumer_table.py``."""
    places = []
    for path in sorted([*(GROUP / "classic").glob("*.py"), GROUP / "engine.py"]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            for target in targets:
                field = isinstance(target, ast.Name) and target.id == "state"
                if (isinstance(node, ast.AnnAssign) and field and node.value is not None) or (
                    isinstance(target, ast.Attribute) and target.attr in ("state", "_state")
                ):
                    places.append((path.name, ast.unparse(node.value)))
    assert sorted(places) == [("classic_member.py", "UNJOINED"), ("engine.py", "row.next")]
