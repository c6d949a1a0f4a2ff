"""SQLite's limit admission (tether.store.admission): capacity, rate tokens, order."""

from __future__ import annotations

from tether.store.admission import Candidate, admit


def job(job_id: int, *limits: str, queue: str = "q", task: str = "t") -> Candidate:
    return (job_id, list(limits), queue, task)


def test_without_limits_it_takes_the_first_candidates_in_order() -> None:
    chosen, spent = admit([job(3), job(1), job(2)], {}, {}, 2)
    assert chosen == [3, 1]
    assert spent == {}


def test_a_limit_admits_up_to_its_room_and_passes_over_the_rest() -> None:
    candidates = [job(1, "db"), job(2, "db"), job(3), job(4, "db")]
    chosen, _ = admit(candidates, {"db": 1}, {}, 10)
    # Job 2 and job 4 are passed over, never reordered ahead of job 3.
    assert chosen == [1, 3]


def test_a_job_needs_room_in_every_limit_it_names() -> None:
    candidates = [job(1, "a", "b"), job(2, "a"), job(3, "b")]
    chosen, _ = admit(candidates, {"a": 2, "b": 0}, {}, 10)
    assert chosen == [2]


def test_an_unknown_or_full_limit_admits_nothing() -> None:
    chosen, _ = admit([job(1, "missing"), job(2, "full")], {"full": 0}, {}, 10)
    assert chosen == []


def test_room_is_not_changed() -> None:
    room = {"db": 2}
    admit([job(1, "db"), job(2, "db")], room, {}, 10)
    assert room == {"db": 2}


def test_rate_buckets_spend_one_token_per_job_for_queue_and_task() -> None:
    tokens = {"queue:q": 2.5, "task:t": 5.0}
    chosen, spent = admit([job(1), job(2), job(3)], {}, tokens, 10)
    assert chosen == [1, 2]
    assert spent == {"queue:q": 2, "task:t": 2}
    assert tokens == {"queue:q": 2.5, "task:t": 5.0}


def test_a_bucket_with_less_than_one_token_closes_only_its_queue_or_task() -> None:
    tokens = {"queue:slow": 0.9, "task:rare": 1.0}
    candidates = [
        job(1, queue="slow"),
        job(2, task="rare"),
        job(3, task="rare"),
        job(4, queue="fast", task="other"),
    ]
    chosen, spent = admit(candidates, {}, tokens, 10)
    assert chosen == [2, 4]
    assert spent == {"task:rare": 1}


def test_queues_and_tasks_without_a_bucket_are_not_rate_limited() -> None:
    chosen, spent = admit([job(1, queue="a"), job(2, queue="b")], {}, {"queue:b": 0.0}, 10)
    assert chosen == [1]
    assert spent == {}


def test_a_rate_limited_job_passed_over_spends_nothing_and_uses_no_room() -> None:
    candidates = [job(1, "db", queue="slow"), job(2, "db")]
    chosen, spent = admit(candidates, {"db": 1}, {"queue:slow": 0.5}, 10)
    assert chosen == [2]
    assert spent == {}


def test_the_claim_limit_caps_what_is_taken_and_spent() -> None:
    candidates = [job(i, "db") for i in range(1, 6)]
    chosen, spent = admit(candidates, {"db": 5}, {"task:t": 10.0}, 3)
    assert chosen == [1, 2, 3]
    assert spent == {"task:t": 3}
