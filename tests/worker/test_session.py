"""The KIP-227 client state machine, step by step (Kafka's FetchSessionHandler rules)."""

from __future__ import annotations

from ingest.worker.fetch_session import FetchSession, next_epoch

FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71
INT32_MAX = 2**31 - 1


def test_disabled_sessions_send_sessionless_full_fetches() -> None:
    session = FetchSession(enabled=False)
    for offset in (0, 0, 10):
        assert session.next_request((offset, 100, -1)) == (0, -1, True)
        session.on_response(0, 0)


def test_a_broker_that_never_grants_gets_full_fetches_asking_for_one() -> None:
    session = FetchSession()
    for offset in (0, 0, 5):
        assert session.next_request((offset, 100, -1)) == (0, 0, True)
        session.on_response(0, 0)
    assert (session.session_id, session.epoch, session.is_full) == (0, 0, True)


def test_a_granted_session_goes_incremental_and_names_only_changes() -> None:
    session = FetchSession()
    assert session.next_request((0, 100, -1)) == (0, 0, True)
    session.on_response(0, 77)
    assert (session.session_id, session.epoch, session.is_full) == (77, 1, False)
    # Same state as the broker holds: the partition is left out.
    assert session.next_request((0, 100, -1)) == (77, 1, False)
    session.on_response(0, 77)
    # The position moved: named again.
    assert session.next_request((10, 100, -1)) == (77, 2, True)
    session.on_response(0, 77)
    assert session.next_request((10, 100, -1)) == (77, 3, False)
    session.on_response(0, 77)
    # A bigger fetch size is a change too.
    assert session.next_request((10, 200, -1)) == (77, 4, True)


def test_epochs_wrap_to_one() -> None:
    assert next_epoch(INT32_MAX) == 1
    assert next_epoch(0) == 1
    assert next_epoch(-1) == -1
    session = FetchSession()
    session.next_request((0, 1, -1))
    session.on_response(0, 5)
    session.epoch = INT32_MAX
    assert session.next_request((0, 1, -1))[:2] == (5, INT32_MAX)
    session.on_response(0, 5)
    assert session.next_request((0, 1, -1))[:2] == (5, 1)


def test_session_not_found_starts_over_without_an_id() -> None:
    session = FetchSession()
    session.next_request((0, 1, -1))
    session.on_response(0, 9)
    session.next_request((3, 1, -1))
    session.on_response(FETCH_SESSION_ID_NOT_FOUND, 0)
    assert session.next_request((3, 1, -1)) == (0, 0, True)


def test_a_wrong_epoch_closes_the_session_and_asks_for_a_new_one() -> None:
    session = FetchSession()
    session.next_request((0, 1, -1))
    session.on_response(0, 9)
    session.next_request((3, 1, -1))
    session.on_response(INVALID_FETCH_SESSION_EPOCH, 0)
    assert session.next_request((3, 1, -1)) == (9, 0, True)
    session.on_response(0, 12)  # the broker replaced it
    assert session.next_request((3, 1, -1)) == (12, 1, False)


def test_a_lost_connection_closes_the_session_and_names_the_partition() -> None:
    session = FetchSession()
    session.next_request((0, 1, -1))
    session.on_response(0, 9)
    session.next_request((0, 1, -1))
    session.on_transport_error()
    assert session.next_request((0, 1, -1)) == (9, 0, True)


def test_the_broker_closing_the_session_means_full_fetches_again() -> None:
    session = FetchSession()
    session.next_request((0, 1, -1))
    session.on_response(0, 9)
    session.next_request((4, 1, -1))
    session.on_response(0, 0)  # an incremental answer with session id 0
    assert session.next_request((4, 1, -1)) == (0, 0, True)


def test_a_new_leader_starts_without_a_session() -> None:
    session = FetchSession()
    session.next_request((0, 1, -1))
    session.on_response(0, 9)
    session.reset()
    assert session.next_request((0, 1, -1)) == (0, 0, True)
