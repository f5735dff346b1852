"""``EpochTrack``: the leader epoch of each offset fetched, for the segments sealed."""

from __future__ import annotations

from ingest.worker.epochs import EpochTrack


def test_an_offset_takes_the_epoch_of_the_last_run_at_or_below_it() -> None:
    track = EpochTrack()
    assert track.at(0) == -1  # nothing seen
    track.note([(0, 3), (100, 5)])
    track.note([(150, 5), (200, 6)])  # a repeated epoch starts no run
    assert [track.at(o) for o in (0, 99, 100, 199, 200, 10**9)] == [3, 3, 5, 5, 6, 6]
    assert repr(track) == "EpochTrack([(0, 3), (100, 5), (200, 6)])"


def test_trimming_keeps_the_run_holding_the_offset() -> None:
    track = EpochTrack()
    track.note([(0, 1), (10, 2), (20, 3)])
    track.trim(15)
    assert [track.at(o) for o in (5, 15, 25)] == [-1, 2, 3]
    track.trim(15)  # idempotent
    assert track.at(10) == 2


def test_a_position_moved_back_replaces_what_followed() -> None:
    track = EpochTrack()
    track.note([(0, 1), (50, 2), (90, 3)])
    track.note([(40, 4)])  # a reset to offset 40, now in epoch 4
    assert [track.at(o) for o in (10, 40, 60, 95)] == [1, 4, 4, 4]
