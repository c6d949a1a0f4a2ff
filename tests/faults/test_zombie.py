"""Scenario 2: a paused zombie. A worker holding a job is SIGSTOPped for three times the
lease, then SIGCONTed.

- The job is leased again elsewhere while the zombie sleeps.
- The zombie's heartbeat, completion and effect are all rejected.
- The zombie abandons its execution within one heartbeat of waking.

The first round pauses the maintenance leader (the first worker started, alone when
it claims); later rounds pause whichever worker claimed the job.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from tests.faults import effects
from tests.faults.conftest import MakeScenario
from tests.faults.faultapp import BASE_CONFIG
from tests.faults.harness import percentiles, read_exec_log, wait_for
from tether import JobState
from tether.job import Beat, Outcome

pytestmark = pytest.mark.slow

LEASE = BASE_CONFIG["lease_duration"]


async def test_paused_zombie(scenario: MakeScenario) -> None:
    s = await scenario("zombie", concurrency=2, claim_batch=1)
    rounds = s.params["rounds"]
    s.cluster.start("w0")
    # w0 alone: it leads maintenance before w1 exists.
    await wait_for(lambda: s.db.query("SELECT 1 FROM tether_workers"), 30)
    await asyncio.sleep(0.5)
    releases, wake_to_end, leased_elsewhere = [], [], 0
    hb_rejected = completion_rejected = effect_rejected = effect_accepted = 0
    zombie_effects_refused = zombie_fenced = zombie_late_outcomes = 0
    for r in range(rounds):
        (job,) = await s.enqueue("work", [{"ms": 1500}])
        running = await wait_for(
            lambda job=job: s.db.query(
                "SELECT worker_id, lease_token FROM tether_jobs "
                "WHERE id = %s AND state = 'running'",
                (job,),
            ),
            30,
        )
        worker_id, token = running[0]
        pid = int(worker_id.split(":")[1])
        name = next(n for n, p in s.cluster.procs.items() if p.popen.pid == pid)
        if r == 0:
            s.cluster.start("w1")
            await wait_for(
                lambda: len(s.db.query("SELECT 1 FROM tether_workers WHERE state = 'active'")) == 2,
                30,
            )
        s.cluster.signal(name, signal.SIGSTOP)
        stopped = time.time()
        try:
            # While the zombie sleeps, the job is leased again elsewhere...
            again = await wait_for(
                lambda job=job, pid=pid, token=token: [
                    e
                    for e in read_exec_log(s.run_dir)
                    if e["ev"] == "start"
                    and e["job"] == job
                    and e["token"] > token
                    and e["pid"] != pid
                ],
                3 * LEASE - 0.5,
            )
            leased_elsewhere += 1
            releases.append(again[0]["t"] - stopped)
            # ...and all the zombie could write with its token is refused while the new
            # attempt runs: its heartbeat, its completion, its effect.
            store = await s.app.store()
            beat = await store.heartbeat(worker_id, [Beat(job, token)], LEASE)
            hb_rejected += job not in beat.alive
            done = await store.finish(worker_id, [Outcome(job, token, JobState.SUCCEEDED, "0")])
            completion_rejected += job not in done
            ok = await asyncio.to_thread(effects.pg_effect_sync, s.url, job, token, 1, pid)
            effect_rejected += not ok
            now = s.db.query("SELECT state, lease_token FROM tether_jobs WHERE id = %s", (job,))
            assert now[0][0] == "running" and now[0][1] > token, now
        except AssertionError:
            pass  # not leased elsewhere in time: counted below
        await asyncio.sleep(max(0.0, stopped + 3 * LEASE - time.time()))
        cont = time.time()
        s.cluster.signal(name, signal.SIGCONT)
        await wait_for(
            lambda job=job: s.db.query(
                "SELECT 1 FROM tether_jobs WHERE id = %s AND state = 'succeeded'", (job,)
            ),
            30,
        )
        # The zombie's own end of its attempt: told to stop, or fenced by its effect.
        ends = await wait_for(
            lambda job=job, pid=pid: [
                e["t"]
                for e in read_exec_log(s.run_dir)
                if e["ev"] in ("stop", "end") and e["job"] == job and e["pid"] == pid
            ],
            10,
        )
        wake_to_end.append(min(ends) - cont)
        for e in read_exec_log(s.run_dir):
            if e["ev"] == "effect" and e["job"] == job and e["pid"] == pid:
                effect_accepted += e["ok"]
                zombie_effects_refused += not e["ok"]
        s.history.add("zombie_round", job=job, name=name, pid=pid, token=token)

    await s.cluster.stop_all()
    for line in s.cluster.log_lines():
        if "lease lost; stopping it" in line or "no heartbeat for" in line:
            zombie_fenced += 1
        if "lease lost before its outcome was recorded" in line:
            zombie_late_outcomes += 1
    verdict = s.assert_invariants(must_succeed=s.history.acked())
    held = percentiles(releases)
    woke = percentiles(wake_to_end)
    s.figures = {
        "rounds": rounds,
        "leased_elsewhere": leased_elsewhere,
        "stop_to_relet_p50": held["p50"],
        "stop_to_relet_max": held["max"],
        "wake_to_abandon_p50": woke["p50"],
        "wake_to_abandon_max": woke["max"],
        "replayed_heartbeats_rejected": hb_rejected,
        "replayed_completions_rejected": completion_rejected,
        "replayed_effects_rejected": effect_rejected,
        "zombie_self_fenced": zombie_fenced,
        "zombie_effects_refused": zombie_effects_refused,
        "zombie_effects_accepted": effect_accepted,
        "zombie_outcomes_refused": zombie_late_outcomes,
        "stale_rejected": verdict.figures["stale_rejected"],
    }
    assert leased_elsewhere == rounds, s.figures
    assert effect_accepted == 0, s.figures
    assert hb_rejected == completion_rejected == effect_rejected == rounds, s.figures
    # The zombie stopped its attempt after waking (how soon: conftest.TARGETS).
    assert woke["max"] is not None, s.figures
