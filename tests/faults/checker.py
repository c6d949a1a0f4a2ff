"""The invariants, checked against the database after every scenario.

1. Every committed (acknowledged) job reaches exactly one terminal state.
2. No transition happens after a terminal state (``tether_job_events``).
3. At most one accepted completion per job and at most one fenced effect; a succeeded
   job's effect is the one its completing attempt wrote.
4. Every write with a stale token is rejected, and counted (``fault_effect_log``).
5. No job is left ``running``, no lease is left set, no limit slot stays taken.
6. Attempts never exceed ``max_attempts`` (rescues count as attempts).
7. No two attempts of one job overlap in time, and no job is rescued from a live
   worker while its attempt still runs there. (Computed from the execution log and the
   history of signals; see :func:`attempts`.) This holds even when every job ends
   ``succeeded``.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.faults.harness import Db, History, read_exec_log

TERMINAL = {"succeeded", "failed", "cancelled"}
EFFECT_TASKS = {"work", "long"}


@dataclass(frozen=True)
class Attempt:
    """One execution of a job, from its handler's start until it ended.

    ``end`` is the first of: the handler's ``end`` line, its process's death (a SIGKILL
    the test sent, an exit it logged, the supervisor seeing it gone), and its process
    being frozen (SIGSTOP). A frozen attempt counts as running until the freeze: once
    its lease has expired it is a zombie, and whatever it does when it wakes is the
    fencing invariants' business (3 and 4). ``inf``: it never ended while we watched.
    """

    job: int
    token: int
    proc: str
    start: float
    end: float


@dataclass
class ProcFate:
    """What the test did to one worker process (keyed by ``name#incarnation``)."""

    died: float = math.inf
    frozen: list[float] = field(default_factory=list)


def fates(history: History, execs: list[dict[str, Any]]) -> dict[str, ProcFate]:
    """Each worker process's death and freezes, from the history and the exec log."""
    out: dict[str, ProcFate] = collections.defaultdict(ProcFate)
    for op in history.ops:
        proc = op.get("proc")
        if proc is None:
            continue
        fate = out[proc]
        if op["kind"] == "worker_died" or (op["kind"] == "signal" and op["sig"] == "SIGKILL"):
            fate.died = min(fate.died, op["t"])
        elif op["kind"] == "signal" and op["sig"] == "SIGSTOP":
            fate.frozen.append(op["t"])
    for row in execs:
        if row["ev"] == "exit":
            out[row["proc"]].died = min(out[row["proc"]].died, row["t"])
    return out


def attempts(execs: list[dict[str, Any]], procs: dict[str, ProcFate]) -> list[Attempt]:
    """Every attempt that started, with its end (see :class:`Attempt`)."""
    ends: dict[tuple[int, int, str], float] = {}
    for row in execs:
        if row["ev"] == "end":
            key = (row["job"], row["token"], row["proc"])
            ends.setdefault(key, row["t"])
    out = []
    for row in execs:
        if row["ev"] != "start":
            continue
        fate = procs.get(row["proc"], ProcFate())
        start = row["t"]
        end = min(
            ends.get((row["job"], row["token"], row["proc"]), math.inf),
            fate.died,
            min((t for t in fate.frozen if t >= start), default=math.inf),
        )
        out.append(Attempt(row["job"], row["token"], row["proc"], start, max(start, end)))
    return out


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

    # 7. attempts never overlap; no job is rescued from a live worker
    procs = fates(history, execs)
    runs = attempts(execs, procs)
    by_job: dict[int, list[Attempt]] = collections.defaultdict(list)
    for a in runs:
        by_job[a.job].append(a)
    overlaps = 0
    for job_id, mine in by_job.items():
        mine.sort(key=lambda a: a.start)
        for i, a in enumerate(mine):
            for b in mine[i + 1 :]:
                if b.start < a.end:
                    overlaps += 1
                    v.fail(
                        f"inv7: job {job_id}: attempt with token {b.token} ({b.proc}) started "
                        f"at {b.start:.3f} while token {a.token} ({a.proc}) ran "
                        f"({a.start:.3f}-{a.end:.3f})"
                    )
    live_rescues = 0
    # Worker ids name the process (pids repeat across PID namespaces).
    worker_procs = {
        path.read_text(): path.name.removeprefix("worker-").removesuffix(".id")
        for path in (run_dir / "exec").glob("worker-*.id")
    }
    rescues = db.query(
        f"SELECT job_id, {'at' if db.sqlite else 'extract(epoch FROM at)'}, worker_id, reason "
        "FROM tether_job_events WHERE actor = 'rescuer' AND from_state = 'running'"
    )
    for job_id, at, worker_id, reason in rescues:
        proc, at = worker_procs.get(worker_id), float(at)
        if proc is None:
            continue  # not a worker process of this scenario
        if any(a.proc == proc and a.start <= at < a.end for a in by_job.get(int(job_id), [])):
            live_rescues += 1
            v.fail(f"inv7: job {job_id} rescued at {at:.3f} from {proc} while it ran ({reason})")

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
        overlaps=overlaps,
        live_rescues=live_rescues,
        violations=len(v.violations),
    )
    return v
