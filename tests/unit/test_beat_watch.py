"""BeatWatch: a worker is quiet once its beat count stood still for its lease, on the
watcher's own monotonic clock (no wall clock involved)."""

from __future__ import annotations

from tether.maintenance.rescuer import DEFAULT_LEASE, BeatWatch


def test_a_worker_whose_count_moves_is_never_quiet() -> None:
    watch = BeatWatch()
    for t in range(100):
        watch.observe({"w": (t, 5.0)}, float(t))
        assert watch.quiet(float(t)) == {}


def test_a_count_that_stands_still_for_the_lease_makes_the_worker_quiet() -> None:
    watch = BeatWatch()
    watch.observe({"w": (7, 5.0)}, 100.0)
    watch.observe({"w": (7, 5.0)}, 103.0)
    assert watch.quiet(104.9) == {}
    assert watch.quiet(105.0) == {"w": 7}


def test_silence_is_measured_from_when_the_count_was_first_seen() -> None:
    watch = BeatWatch()
    watch.observe({"w": (1, 5.0)}, 0.0)
    watch.observe({"w": (2, 5.0)}, 4.0)  # a beat landed: the clock starts again
    assert watch.quiet(8.0) == {}
    assert watch.quiet(9.0) == {"w": 2}


def test_a_new_watcher_waits_a_whole_lease_before_judging() -> None:
    watch = BeatWatch()
    watch.observe({"w": (50, 2.0)}, 1000.0)  # a count that may be old: unknown
    assert watch.quiet(1001.9) == {}
    assert watch.quiet(1002.0) == {"w": 50}


def test_a_worker_without_a_lease_on_record_is_judged_by_the_default() -> None:
    watch = BeatWatch()
    watch.observe({"old": (0, None)}, 0.0)
    assert watch.quiet(DEFAULT_LEASE - 0.1) == {}
    assert watch.quiet(3.0, default_lease=3.0) == {"old": 0}


def test_workers_no_longer_live_are_forgotten() -> None:
    watch = BeatWatch()
    watch.observe({"a": (1, 1.0), "b": (1, 1.0)}, 0.0)
    watch.observe({"b": (1, 1.0)}, 0.5)
    assert watch.quiet(10.0) == {"b": 1}


def test_still_lists_the_workers_whose_count_stood_still_long_enough() -> None:
    watch = BeatWatch()
    watch.observe({"a": (1, 10.0), "b": (5, 10.0)}, now=100.0)
    watch.observe({"a": (1, 10.0), "b": (6, 10.0)}, now=103.0)
    assert watch.still(104.0, 4.0) == ["a"]
    assert watch.still(104.0, 5.0) == []
    assert sorted(watch.still(110.0, 7.0)) == ["a", "b"]
