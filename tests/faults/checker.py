"""The invariants, checked against the database after every scenario.

1. Every committed (acknowledged) job reaches exactly one terminal state.
2. No transition happens after a terminal state, and each job's history
   (``tether_job_history``) is one unbroken path from its creation.
3. At most one accepted completion per job and at most one fenced effect; a succeeded
   job's effect is the one its completing attempt wrote.
4. Every write with a stale token is rejected, and counted (``fault_effect_log``).
5. No job is left ``running``, no lease is left set, no limit slot stays taken.
6. Attempts never exceed ``max_attempts`` (rescues count as attempts).
7. No two attempts of one job overlap in time, and no job is rescued from a live
   worker while its attempt still runs there. (Computed from the execution log and the
   history of signals; see :func:`attempts`.) This holds even when every job ends
   ``succeeded``.
8. Nothing waits on what has already happened: no parent stays ``blocked`` waiting for
   its children once they have all ended, and no dependent stays ``blocked`` once its
   dependencies have all succeeded.
9. Workflows run in order: a dependent's first start comes after the end of each
   dependency's successful attempt, a parent's later phase starts after its children's
   last attempts ended, and a parent's fan-in sees every child it spawned (a pruner that
   deleted a workflow's children before the workflow ended shows here).
10. A rate limit's bucket clock never moves back (``fault_bucket_steps``): a claim that
    stamped ``refilled_at`` earlier than the refill before it credits that interval a
    second time, and more jobs start than the bucket allows.
11. No durable step ran twice to completion: each step name of a job has at most one
    completed record (``tether_steps``), its function ran to a committed end at most
    once (``step_done`` in the execution log), never again on an attempt after the one
    that completed it, and the attempt ``tether_steps`` names is the one whose fenced
    write (``fault_step_effects``) committed.
12. No fenced effect committed twice: at most one ``fault_step_effects`` row per (job,
    step), none without its step's record; a succeeded job of a step-effect task
    (``durable``) has exactly one per completed step, written by the attempt
    ``tether_steps`` names. (11 and 12 apply where there are steps or step effects:
    other scenarios have neither.)

Jobs the pruner deleted are checked too: the fault schema keeps every deleted job, event
and dependency link (:mod:`tests.faults.effects`), so a job deleted before it ended
fails invariant 1. A person's retry (``failed`` to ``queued``) is the one move out of a
terminal state; the terminal states are counted from the last retry on.
"""

from __future__ import annotations

import collections
import itertools
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.faults.harness import Db, History, read_exec_log
from tether.states import TRANSITIONS, JobState

TERMINAL = {"succeeded", "failed", "cancelled"}
EFFECT_TASKS = {"work", "long", "paced", "pooled"}
# Tasks whose every step writes one fenced row into fault_step_effects (faultapp).
STEP_EFFECT_TASKS = {"durable"}
RETRIED = "retried by a person"


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


@dataclass(frozen=True)
class LeaseLoss:
    """A job that lost its lease without its worker being killed: a ``lease_lost`` stop
    in the execution log (the worker noticed, or fenced itself), or a rescue from a
    process the test did not kill."""

    job: int
    proc: str
    t: float
    how: str


@dataclass
class Verdict:
    violations: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    lease_losses: list[LeaseLoss] = field(default_factory=list)

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
    cols = (
        "id, task, state, attempt, max_attempts, lease_token, {leased}, parent_id, "
        "waiting_children, idempotency_key"
    )
    live = db.query(f"SELECT {cols.format(leased='lease_expires_at IS NOT NULL')} FROM tether_jobs")
    gone = db.query(f"SELECT {cols.format(leased='leased')} FROM fault_gone_jobs")
    jobs: dict[int, dict[str, Any]] = {}
    for pruned, rows in ((True, gone), (False, live)):
        for r in rows:
            jobs[int(r[0])] = {
                "task": r[1],
                "state": r[2],
                "attempt": int(r[3]),
                "max_attempts": int(r[4]),
                "token": int(r[5]),
                "leased": bool(r[6]),
                "parent": None if r[7] is None else int(r[7]),
                "waiting_children": bool(r[8]),
                "key": r[9],
                "pruned": pruned,
            }
    events: dict[int, list[tuple[str | None, str]]] = collections.defaultdict(list)
    for job_id, _, _, src, dst, reason in sorted(
        (int(r[1]), int(r[5]), int(r[0] or 0), r[2], r[3], r[4])
        for r in db.query(
            "SELECT id, job_id, from_state, to_state, reason, rank FROM tether_job_history "
            "UNION ALL SELECT id, job_id, from_state, to_state, reason, rank "
            "FROM fault_gone_events"
        )
    ):
        events[job_id].append((src, dst))
        if (src, dst) == ("failed", "queued") and reason != RETRIED:
            v.fail(f"inv2: job {job_id} left failed without a person's retry ({reason})")
    deps: list[tuple[int, int]] = sorted(
        {
            (int(r[0]), int(r[1]))
            for r in db.query(
                "SELECT job_id, depends_on FROM tether_dependencies UNION "
                "SELECT job_id, depends_on FROM fault_gone_deps"
            )
        }
    )
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
    for key in history.rolled_back():
        found = [i for i, j in jobs.items() if j["key"] is not None and j["key"].endswith(key)]
        if found:
            v.fail(f"inv1: job(s) {found} of a rolled-back enqueue ({key}) exist")
    for job_id, job in jobs.items():
        evs = events[job_id]
        since = max((i for i, e in enumerate(evs) if e == ("failed", "queued")), default=-1)
        ends = [dst for _, dst in evs[since + 1 :] if dst in TERMINAL]
        if job["state"] not in TERMINAL:
            how = "was deleted while" if job["pruned"] else "ended"
            v.fail(f"inv1: job {job_id} ({job['task']}) {how} {job['state']}, not terminal")
        elif len(ends) != 1:
            v.fail(f"inv1: job {job_id} reached a terminal state {len(ends)} times: {ends}")
        elif ends[0] != job["state"]:
            v.fail(f"inv1: job {job_id} is {job['state']} but its events end {ends[0]}")
        if must_succeed is not None and job_id in must_succeed and job["state"] != "succeeded":
            v.fail(f"job {job_id} ({job['task']}) should have succeeded: {job['state']}")

    # 2. nothing after a terminal state; and each history, stored or read off the job's
    # row (migration 0028), is one path from the job's creation: a transition missing
    # or told twice breaks it.
    for job_id, evs in events.items():
        for i, (_, dst) in enumerate(evs):
            if dst in TERMINAL and i + 1 < len(evs) and evs[i + 1] != ("failed", "queued"):
                v.fail(f"inv2: job {job_id} moved after {dst}: {evs[i + 1 :]}")
                break
        if evs and evs[0][0] is not None:
            v.fail(f"inv2: job {job_id}'s history does not start with its creation: {evs[0]}")
        for (_, was), (src, dst) in itertools.pairwise(evs):
            if src != was:
                v.fail(f"inv2: job {job_id}'s history breaks: -> {was}, then {src} -> {dst}")
                break
            if JobState(dst) not in TRANSITIONS[JobState(src)]:
                v.fail(f"inv2: job {job_id}'s history breaks: {src} -> {dst} is not legal")
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
        "FROM tether_job_history WHERE actor = 'rescuer' AND from_state = 'running'"
    )
    # SQLite's clock keeps milliseconds (julianday('now') truncates), the test's clock
    # does not: a rescue stamped within that of an attempt's end may have come after it,
    # and one stamped within that before its logged start may have come after it too
    # (the rescue of a lease comes after its claim, which the start line follows).
    slack = 0.0011 if db.sqlite else 0.0
    for job_id, at, worker_id, reason in rescues:
        proc, at = worker_procs.get(worker_id), float(at)
        if proc is None:
            continue  # not a worker process of this scenario
        ran = by_job.get(int(job_id), [])
        if any(a.proc == proc and a.start - slack <= at < a.end - slack for a in ran):
            live_rescues += 1
            v.fail(f"inv7: job {job_id} rescued at {at:.3f} from {proc} while it ran ({reason})")

    # 8. nothing waits on what has already happened
    children: dict[int, list[int]] = collections.defaultdict(list)
    for job_id, job in jobs.items():
        if job["parent"] is not None:
            children[job["parent"]].append(job_id)
    upstream: dict[int, list[int]] = collections.defaultdict(list)
    for job_id, dep in deps:
        upstream[job_id].append(dep)
    stuck_parents = stuck_dependents = 0
    for job_id, job in jobs.items():
        if job["state"] != "blocked":
            continue
        kids = children.get(job_id, [])
        if job["waiting_children"] and all(jobs[k]["state"] in TERMINAL for k in kids):
            stuck_parents += 1
            v.fail(
                f"inv8: parent {job_id} is blocked waiting for its {len(kids)} children, "
                f"all ended ({dict(collections.Counter(jobs[k]['state'] for k in kids))})"
            )
        ups = upstream.get(job_id, [])
        if (
            not job["waiting_children"]
            and ups
            and all(jobs.get(d, {}).get("state") == "succeeded" for d in ups)
        ):
            stuck_dependents += 1
            v.fail(f"inv8: job {job_id} is blocked though its dependencies {ups} succeeded")

    # 9. workflows run in order
    ends_of: dict[tuple[int, int], float] = {}
    for row in execs:
        if row["ev"] == "end":
            ends_of.setdefault((row["job"], row["token"]), row["t"])
    last_end: dict[int, float] = {}
    for (job_id, token), t in ends_of.items():
        if token == jobs.get(job_id, {}).get("token"):
            last_end[job_id] = t
    out_of_order = 0
    for job_id, dep in deps:
        first = min((s["t"] for s in starts.get(job_id, [])), default=None)
        if first is None:
            continue
        if jobs.get(dep, {}).get("state") != "succeeded":
            out_of_order += 1
            v.fail(f"inv9: job {job_id} started though its dependency {dep} did not succeed")
        elif dep in last_end and first < last_end[dep]:
            out_of_order += 1
            v.fail(
                f"inv9: job {job_id} started at {first:.3f}, before its dependency {dep} "
                f"ended at {last_end[dep]:.3f}"
            )
    spawned_seen: list[tuple[int, int, int]] = []
    for row in execs:
        if row["ev"] == "start" and row.get("phase") is not None:
            late = [k for k in children.get(row["job"], []) if last_end.get(k, 0.0) > row["t"]]
            if late:
                out_of_order += 1
                v.fail(
                    f"inv9: parent {row['job']} started phase {row['phase']} at "
                    f"{row['t']:.3f} before children {late[:5]} ended"
                )
        elif row["ev"] == "fanin":
            spawned_seen.append((row["job"], len(children.get(row["job"], [])), row["seen"]))
    for job_id, made, seen in spawned_seen:
        if seen != made:
            v.fail(f"inv9: parent {job_id}'s fan-in saw {seen} of the {made} children it spawned")

    # 10. a rate bucket's clock never moves back
    steps = db.query("SELECT bucket, old_at, new_at, tokens FROM fault_bucket_steps")
    for bucket, old_at, new_at, tokens in steps[:10]:
        v.fail(
            f"inv10: bucket {bucket}'s clock moved back {float(old_at) - float(new_at):.3f}s "
            f"(refilled_at {float(old_at):.3f} -> {float(new_at):.3f}, {float(tokens):.2f} "
            "tokens left): that interval is credited twice"
        )
    if len(steps) > 10:
        v.fail(f"inv10: ... and {len(steps) - 10} more steps back of a bucket's clock")

    # 11 and 12. durable steps: each runs to completion once, its fenced write commits once
    step_figures = check_steps(db, jobs, execs, v)

    # Leases lost by workers the test did not kill (scenarios decide what may lose one).
    for row in execs:
        if row["ev"] == "stop" and row.get("why") == "lease_lost":
            v.lease_losses.append(LeaseLoss(row["job"], row["proc"], row["t"], "lease_lost"))
    for job_id, at, worker_id, reason in rescues:
        proc = worker_procs.get(worker_id)
        if proc is not None and procs[proc].died > float(at):
            v.lease_losses.append(LeaseLoss(int(job_id), proc, float(at), f"rescued: {reason}"))

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
        pruned=sum(1 for j in jobs.values() if j["pruned"]),
        stuck_parents=stuck_parents,
        stuck_dependents=stuck_dependents,
        out_of_order=out_of_order,
        bucket_steps_back=len(steps),
        lease_losses=len(v.lease_losses),
        **step_figures,
        violations=len(v.violations),
    )
    return v


def _has_table(db: Db, name: str) -> bool:
    if db.sqlite:
        sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = %s"
    else:
        sql = "SELECT 1 WHERE to_regclass(%s) IS NOT NULL"
    return bool(db.query(sql, (name,)))


def check_steps(
    db: Db, jobs: dict[int, dict[str, Any]], execs: list[dict[str, Any]], v: Verdict
) -> dict[str, int]:
    """Invariants 11 and 12 (durable steps and their fenced writes); the figures of a
    run that had any: ``steps`` completed, ``steps_replayed`` (steps a later attempt
    found done and did not run again), ``step_effects`` (rows committed) and
    ``step_writes_uncommitted`` (rows written in a transaction that never committed: the
    attempt was killed, frozen past its lease, or refused at its commit)."""
    records: dict[tuple[int, str], list[int]] = collections.defaultdict(list)
    if _has_table(db, "tether_steps"):
        for job_id, name, attempt in db.query(
            "SELECT job_id, name, attempt FROM tether_steps WHERE kind = 'step' AND state = 'done'"
        ):
            records[(int(job_id), str(name))].append(int(attempt))
    written: dict[tuple[int, str], list[tuple[int, int]]] = collections.defaultdict(list)
    if _has_table(db, "fault_step_effects"):
        for job_id, name, attempt, token in db.query(
            "SELECT job_id, step, attempt, lease_token FROM fault_step_effects"
        ):
            written[(int(job_id), str(name))].append((int(attempt), int(token)))
    step_rows = [r for r in execs if str(r["ev"]).startswith("step_")]
    if not records and not written and not step_rows:
        return {}

    # 11. a step completes once, and never runs again after it completed
    for (job_id, name), attempts_ in records.items():
        if len(attempts_) > 1:
            v.fail(f"inv11: job {job_id} step {name!r} has {len(attempts_)} completed records")
    done_lines = collections.Counter(
        (r["job"], r["step"]) for r in step_rows if r["ev"] == "step_done"
    )
    for (job_id, name), n in done_lines.items():
        if n > 1:
            v.fail(f"inv11: job {job_id} step {name!r} ran to completion {n} times")
    for r in step_rows:
        key = (r["job"], r["step"])
        if key not in records:
            continue
        done_by = min(records[key])
        if r["ev"] == "step_start" and r["attempt"] > done_by:
            v.fail(
                f"inv11: job {key[0]} step {key[1]!r} ran again on attempt {r['attempt']} "
                f"(token {r['token']}) after attempt {done_by} completed it"
            )
        if r["ev"] == "step_done" and jobs.get(key[0], {}).get("task") in STEP_EFFECT_TASKS:
            tokens = [t for _, t in written.get(key, [])]
            if tokens and r["token"] not in tokens:
                v.fail(
                    f"inv11: job {key[0]} step {key[1]!r} completed by token {r['token']} but "
                    f"its committed write is token {tokens}'s"
                )
    for key, rows in written.items():
        if key in records and len(rows) == 1 and rows[0][0] != records[key][0]:
            v.fail(
                f"inv11: job {key[0]} step {key[1]!r} is recorded as attempt {records[key][0]}'s "
                f"but attempt {rows[0][0]}'s write committed"
            )

    # 12. one committed fenced write per step, and the right one
    for key, rows in written.items():
        job_id, name = key
        if len(rows) > 1:
            v.fail(
                f"inv12: job {job_id} step {name!r}: {len(rows)} fenced writes committed "
                f"(attempt, token): {sorted(rows)}"
            )
        if key not in records and not jobs.get(job_id, {}).get("pruned"):
            v.fail(f"inv12: job {job_id} step {name!r}: a write committed without its step")
        job = jobs.get(job_id)
        for _, token in rows:
            if job is not None and token > job["token"]:
                v.fail(
                    f"inv12: job {job_id} step {name!r}: a write from token {token} it never issued"
                )
    for (job_id, name), attempts_ in records.items():
        job = jobs.get(job_id)
        if job is None or job["state"] != "succeeded" or job["task"] not in STEP_EFFECT_TASKS:
            continue
        rows = written.get((job_id, name), [])
        if len(rows) != 1:
            v.fail(
                f"inv12: job {job_id} succeeded with {len(rows)} committed writes of step {name!r}"
            )
        elif rows[0][0] != attempts_[0]:
            v.fail(
                f"inv12: job {job_id} step {name!r}: attempt {attempts_[0]} completed it, "
                f"attempt {rows[0][0]} wrote its effect"
            )

    writes = {(r["job"], r["step"], r["token"]) for r in step_rows if r["ev"] == "step_write"}
    committed = {(j, n, t) for (j, n), rows in written.items() for _, t in rows}
    return {
        "steps": len(records),
        "steps_replayed": len(
            {(r["job"], r["step"]) for r in step_rows if r["ev"] == "step_replay"}
        ),
        "step_effects": sum(len(rows) for rows in written.values()),
        "step_writes_uncommitted": len(writes - committed),
    }


def schedule_ticks(db: Db) -> dict[str, list[float]]:
    """Each schedule's ticks that got a job (pruned or not), as sorted Unix seconds,
    read from the jobs' idempotency keys (``schedule:<name>:<tick>``)."""
    rows = db.query(
        "SELECT idempotency_key FROM tether_jobs WHERE idempotency_key IS NOT NULL "
        "UNION SELECT idempotency_key FROM fault_gone_jobs WHERE idempotency_key IS NOT NULL"
    )
    ticks: dict[str, set[float]] = collections.defaultdict(set)
    for (key,) in rows:
        # An owner-scoped key is prefixed with the owner and a unit separator.
        kind, _, rest = str(key).split(chr(31))[-1].partition(":")
        if kind != "schedule":
            continue
        name, tick = rest.split(":", 1)
        ticks[name].add(datetime.fromisoformat(tick).timestamp())
    return {name: sorted(t) for name, t in ticks.items()}


def missing_ticks(ticks: list[float], start: float, end: float, every: float = 1.0) -> list[float]:
    """The ticks of a schedule firing ``every`` seconds that have no job in
    [``start``, ``end``]."""
    have = {round(t / every) for t in ticks}
    first, last = math.ceil(start / every), math.floor(end / every)
    return [n * every for n in range(first, last + 1) if n not in have]


def rate_overruns(starts: list[float], per_second: float, burst: int) -> list[tuple[int, float]]:
    """Windows in which more jobs were claimed than a token bucket allows: for claim
    times ``starts``, every (count, seconds) with count > burst + per_second * seconds
    + 1 (one token of slack for the clock's resolution)."""
    s = sorted(starts)
    out = []
    for i in range(len(s)):
        for j in range(i + burst, len(s)):
            count, span = j - i + 1, s[j] - s[i]
            if count > burst + per_second * span + 1:
                out.append((count, span))
    return out


def all_events(db: Db) -> list[dict[str, Any]]:
    """:meth:`Db.events` of every job, the pruned ones' included, each job's in order."""
    at = "at" if db.sqlite else "extract(epoch FROM at)"
    cols = "id, job_id, from_state, to_state, {at}, worker_id, actor, reason, rank"
    rows = db.query(
        f"SELECT {cols.format(at=at)} FROM tether_job_history UNION ALL "
        f"SELECT {cols.format(at='at')} FROM fault_gone_events"
    )
    keys = ("job", "src", "dst", "at", "worker", "actor", "reason")
    return [
        dict(zip(keys, (int(r[1]), r[2], r[3], float(r[4]), r[5], r[6], r[7]), strict=True))
        for r in sorted(rows, key=lambda r: (int(r[1]), int(r[8]), int(r[0] or 0)))
    ]
