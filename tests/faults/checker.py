"""The invariants, checked against the database after every scenario.

1. Every committed (acknowledged) job reaches exactly one terminal state.
2. No transition happens after a terminal state (``tether_job_events``).
3. At most one accepted completion per job and at most one fenced effect; a succeeded
   job's effect is the one its completing attempt wrote.
4. Every write with a stale token is rejected, and counted (``fault_effect_log``).
5. No job is left ``running``, no lease is left set, no limit slot stays taken.
6. Attempts never exceed ``max_attempts`` (rescues count as attempts).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.faults.harness import Db, History, read_exec_log

TERMINAL = {"succeeded", "failed", "cancelled"}
EFFECT_TASKS = {"work", "long"}


@dataclass
class Verdict:
    violations: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def fail(self, text: str) -> None:
        self.violations.append(text)

    def summary(self, limit: int = 25) -> str:
        head = self.violations[:limit]
        more = len(self.violations) - len(head)
        return "\n".join(head) + (f"\n... and {more} more" if more > 0 else "")


def check(
    db: Db,
    run_dir: Path,
    history: History,
    *,
    must_succeed: set[int] | None = None,
) -> Verdict:
    """Check every invariant; ``must_succeed`` names jobs that must end ``succeeded``."""
    v = Verdict()
    jobs = {
        int(r[0]): {
            "task": r[1],
            "state": r[2],
            "attempt": int(r[3]),
            "max_attempts": int(r[4]),
            "token": int(r[5]),
            "leased": bool(r[6]),
        }
        for r in db.query(
            "SELECT id, task, state, attempt, max_attempts, lease_token, "
            "lease_expires_at IS NOT NULL FROM tether_jobs"
        )
    }
    events: dict[int, list[tuple[str | None, str]]] = collections.defaultdict(list)
    for job_id, src, dst in db.query(
        "SELECT job_id, from_state, to_state FROM tether_job_events ORDER BY id"
    ):
        events[int(job_id)].append((src, dst))
    effect_rows = {
        int(r[0]): int(r[1]) for r in db.query("SELECT job_id, lease_token FROM fault_effects")
    }
    effect_log = [
        (int(r[0]), int(r[1]), bool(r[2]), float(r[3]), int(r[4]))
        for r in db.query("SELECT job_id, lease_token, accepted, at, pid FROM fault_effect_log")
    ]
    limits = db.query("SELECT name, used FROM tether_limits WHERE used <> 0")
    execs = read_exec_log(run_dir)
    starts: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for row in execs:
        if row["ev"] == "start":
            starts[row["job"]].append(row)

    # 1. committed jobs end exactly once
    acked = history.acked()
    missing = sorted(acked - set(jobs))
    if missing:
        v.fail(f"inv1: {len(missing)} acknowledged job(s) lost, e.g. {missing[:5]}")
    for job_id, job in jobs.items():
        ends = [dst for _, dst in events[job_id] if dst in TERMINAL]
        if job["state"] not in TERMINAL:
            v.fail(f"inv1: job {job_id} ({job['task']}) ended {job['state']}, not terminal")
        elif len(ends) != 1:
            v.fail(f"inv1: job {job_id} reached a terminal state {len(ends)} times: {ends}")
        elif ends[0] != job["state"]:
            v.fail(f"inv1: job {job_id} is {job['state']} but its events end {ends[0]}")
        if must_succeed is not None and job_id in must_succeed and job["state"] != "succeeded":
            v.fail(f"job {job_id} ({job['task']}) should have succeeded: {job['state']}")

    # 2. nothing after a terminal state
    for job_id, evs in events.items():
        for i, (_, dst) in enumerate(evs):
            if dst in TERMINAL and i + 1 < len(evs):
                v.fail(f"inv2: job {job_id} moved after {dst}: {evs[i + 1 :]}")
                break

    # 3. one completion, one effect, and the right one
    accepted_per_token = collections.Counter(
        (job, token) for job, token, ok, _, _ in effect_log if ok
    )
    for (job_id, token), n in accepted_per_token.items():
        if n > 1:
            v.fail(f"inv3: job {job_id} token {token}: {n} accepted effects")
    for job_id, job in jobs.items():
        completions = [e for e in events[job_id] if e == ("running", "succeeded")]
        if len(completions) > 1:
            v.fail(f"inv3: job {job_id} completed {len(completions)} times")
        eff = effect_rows.get(job_id)
        if job["state"] == "succeeded" and job["task"] in EFFECT_TASKS:
            if eff is None:
                v.fail(f"inv3: job {job_id} succeeded without its effect")
            elif eff != job["token"]:
                v.fail(
                    f"inv3: job {job_id} succeeded with token {job['token']} but its effect "
                    f"is from token {eff}"
                )
        if eff is not None and eff > job["token"]:
            v.fail(f"inv3: job {job_id} has an effect from a token it never issued ({eff})")

    # 4. stale writes are rejected and counted
    rejected = [(j, t, pid) for j, t, ok, _, pid in effect_log if not ok]
    for job_id, token, ok, at, _ in effect_log:
        if not ok:
            continue
        newer = [s for s in starts.get(job_id, []) if s["token"] > token and s["t"] < at]
        if newer:
            v.fail(
                f"inv4: job {job_id}: effect with token {token} accepted at {at:.3f} after "
                f"token {newer[0]['token']} started at {newer[0]['t']:.3f}"
            )
    logged = collections.Counter((j, t, pid) for j, t, _, _, pid in effect_log)
    logged_ok = collections.Counter((j, t, pid) for j, t, ok, _, pid in effect_log if ok)
    for row in execs:
        if row["ev"] != "effect":
            continue
        key = (row["job"], row["token"], row["pid"])
        if row["ok"] and not logged_ok[key]:
            v.fail(f"inv4: effect {key} says accepted but the database has no such write")
        if not row["ok"] and not logged[key]:
            v.fail(f"inv4: effect {key} was rejected but not counted")

    # 5. nothing left running or leased
    for job_id, job in jobs.items():
        if job["state"] == "running" or job["leased"]:
            v.fail(f"inv5: job {job_id} left {job['state']} with a lease")
    for name, used in limits:
        v.fail(f"inv5: limit {name} still has {used} slot(s) taken")

    # 6. attempts within max_attempts
    for job_id, job in jobs.items():
        if job["attempt"] > job["max_attempts"]:
            v.fail(f"inv6: job {job_id} attempt {job['attempt']} > {job['max_attempts']}")
        for s in starts.get(job_id, []):
            if s["attempt"] > job["max_attempts"]:
                v.fail(f"inv6: job {job_id} ran attempt {s['attempt']} > {job['max_attempts']}")
                break

    states = collections.Counter(j["state"] for j in jobs.values())
    accepted = sum(1 for e in effect_log if e[2])
    v.figures.update(
        jobs=len(jobs),
        acked=len(acked),
        succeeded=states.get("succeeded", 0),
        failed=states.get("failed", 0),
        cancelled=states.get("cancelled", 0),
        executions=sum(len(s) for s in starts.values()),
        reruns=sum(max(0, len(s) - 1) for s in starts.values()),
        stale_rejected=len(rejected),
        effects_superseded=accepted - len(effect_rows),
        violations=len(v.violations),
    )
    return v
