"""The harness: worker processes under a supervisor, a history, and fault tools.

- :class:`Cluster` starts named worker processes (``tests.faults.faultapp``), each in
  this PID namespace or in one of its own (as on another host with the same name),
  restarts any that die while it supervises, and sends them signals;
- :class:`History` is the timeline of what the test did (enqueues acknowledged, faults
  injected, API answers), written to ``history.jsonl`` in the run directory;
- :func:`read_exec_log` reads what the jobs themselves logged;
- :class:`Db` is the test's own direct view of the database (never through the proxy);
- :meth:`Db.terminate_listeners` is a database fault; restarts act on a private
  cluster (``tests.pgcluster``), never on the shared server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.faults import effects
from tests.helpers import UNSHARE

ROOT = Path(__file__).resolve().parents[2]


class History:
    """Everything the test did, with wall-clock times (the exec log uses the same clock)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ops: list[dict[str, Any]] = []

    def add(self, kind: str, **fields: Any) -> dict[str, Any]:
        op = {"t": time.time(), "kind": kind, **fields}
        self.ops.append(op)
        return op

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [op for op in self.ops if op["kind"] == kind]

    def acked(self) -> set[int]:
        """Every job id whose enqueue was acknowledged."""
        return {i for op in self.of("enqueued") for i in op["ids"]}

    def rolled_back(self) -> list[str]:
        """The idempotency keys of jobs enqueued in a transaction that rolled back."""
        return [k for op in self.of("rolled_back") for k in op["keys"]]

    def save(self) -> None:
        with self.path.open("w") as out:
            for op in self.ops:
                out.write(json.dumps(op, default=str) + "\n")


def _unshared_child(parent: int, timeout: float = 10.0) -> int:
    """The pid (here) of the worker that ``unshare --fork`` (``parent``) started."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
            if children:
                return int(children[0])
        time.sleep(0.002)
    raise RuntimeError(f"unshare {parent} started no worker within {timeout}s")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    started: float
    incarnation: int
    #: The worker process's pid in our namespace (``popen.pid`` unless it has its own).
    pid: int = 0
    #: The worker's pid in its own namespace, as its worker id and exec log show it.
    own_pid: int = 0

    @property
    def key(self) -> str:
        """This incarnation's key, unique across PID namespaces."""
        return f"{self.name}#{self.incarnation}"


@dataclass
class Cluster:
    """Named worker processes; while ``supervise`` runs, a dead one is restarted."""

    run_dir: Path
    url: str
    history: History
    config: dict[str, Any] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    namespaced: set[str] = field(default_factory=set)
    #: Per worker: how to run it on another host (``tests.faults.hosts.Host.command``).
    on_host: dict[str, Callable[[list[str]], list[str]]] = field(default_factory=dict)
    incarnations: dict[str, int] = field(default_factory=dict)
    restarts: int = 0
    all_pids: list[int] = field(default_factory=list)
    _supervising: bool = False
    _held: set[str] = field(default_factory=set)

    def start(
        self,
        name: str,
        *,
        url: str | None = None,
        own_pid_namespace: bool = False,
        host: Callable[[list[str]], list[str]] | None = None,
        **config: Any,
    ) -> Proc:
        """Start worker ``name`` (its settings are kept for restarts); with
        ``own_pid_namespace`` it runs in a PID namespace of its own, under this host name;
        with ``host`` (a :meth:`tests.faults.hosts.Host.command`) on that host, in a
        network and PID namespace of its own."""
        if url is not None:
            self.urls[name] = url
        if config:
            self.overrides[name] = config
        if own_pid_namespace:
            self.namespaced.add(name)
        if host is not None:
            self.on_host[name] = host
            self.namespaced.add(name)
        n = self.incarnations.get(name, 0) + 1
        self.incarnations[name] = n
        env = {
            **os.environ,
            "TETHER_FAULT_URL": self.urls.get(name, self.url),
            "TETHER_FAULT_DIR": str(self.run_dir),
            "TETHER_FAULT_CONFIG": json.dumps({**self.config, **self.overrides.get(name, {})}),
            "TETHER_FAULT_NAME": name,
            "TETHER_FAULT_PROC": f"{name}#{n}",
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("TETHER_DATABASE_URL", None)
        stderr = (self.run_dir / f"worker-{name}-{n}.log").open("wb")
        cmd = [sys.executable, "-m", "tests.faults.faultapp"]
        if name in self.on_host:
            cmd = self.on_host[name](cmd)
        elif name in self.namespaced:
            cmd = [*UNSHARE, *cmd]
        popen = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        stderr.close()
        proc = Proc(name, popen, time.time(), n, popen.pid, popen.pid)
        if name in self.namespaced:
            proc.pid = _unshared_child(popen.pid)
            # NSpid: the pid in each namespace from ours down to its own (the last).
            status = Path(f"/proc/{proc.pid}/status").read_text()
            proc.own_pid = int(
                next(x for x in status.splitlines() if x.startswith("NSpid:")).split()[-1]
            )
        self.procs[name] = proc
        self.all_pids.append(proc.pid)
        self.history.add(
            "worker_started",
            name=name,
            pid=proc.pid,
            incarnation=n,
            proc=proc.key,
            own_pid=proc.own_pid,
        )
        return proc

    def pid(self, name: str) -> int:
        """The worker process's pid here (the one to signal)."""
        return self.procs[name].pid

    def worker_id(self, name: str) -> str | None:
        """The worker id of ``name``'s current incarnation (``None`` before it is known)."""
        path = self.run_dir / "exec" / f"worker-{self.procs[name].key}.id"
        with contextlib.suppress(OSError):
            return path.read_text() or None
        return None

    def registered(self, name: str, db: Db) -> bool:
        """Whether ``name``'s current incarnation has a worker row (registered; not
        necessarily "active")."""
        wid = self.worker_id(name)
        return wid is not None and bool(
            db.query("SELECT 1 FROM tether_workers WHERE id = %s", (wid,))
        )

    def alive(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.popen.poll() is None]

    def signal(self, name: str, sig: signal.Signals) -> int:
        proc = self.procs[name]
        pid = proc.pid
        self.history.add("signal", name=name, pid=pid, sig=sig.name, proc=proc.key)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        return pid

    def hold(self, name: str) -> None:
        """Do not restart ``name`` until :meth:`release` (a test stops it on purpose)."""
        self._held.add(name)

    def release(self, name: str) -> None:
        self._held.discard(name)

    async def supervise(self, every: float = 0.05) -> None:
        """Restart workers that died (run as a task; cancel it to stop supervising)."""
        while True:
            for name, proc in list(self.procs.items()):
                if name in self._held or proc.popen.poll() is None:
                    continue
                self.history.add(
                    "worker_died",
                    name=name,
                    pid=proc.pid,
                    code=proc.popen.returncode,
                    proc=proc.key,
                )
                self.restarts += 1
                self.start(name)
            await asyncio.sleep(every)

    async def wait_exit(self, name: str, timeout: float = 30.0) -> int:
        code = await asyncio.to_thread(self.procs[name].popen.wait, timeout)
        return int(code)

    async def stop_all(self, timeout: float = 20.0) -> dict[str, int | None]:
        """SIGTERM every live worker (SIGCONT first: a stopped one must hear it), then
        wait; SIGKILL whatever is left. Returns the exit codes of those that were alive
        (one killed just before, and not restarted yet, is not asked to stop)."""
        codes: dict[str, int | None] = {}
        db = Db(self.url)
        for proc in self.procs.values():
            self._held.add(proc.name)
        alive = {n: p for n, p in self.procs.items() if p.popen.poll() is None}
        for proc in alive.values():
            # A process still importing has no signal handler yet: wait until it is a
            # registered worker (a SIGTERM then is the graceful kind).
            with contextlib.suppress(AssertionError):
                await wait_for(
                    lambda proc=proc: (
                        proc.popen.poll() is not None or self.registered(proc.name, db)
                    ),
                    15,
                    every=0.1,
                )
            if proc.popen.poll() is None:
                self.history.add(
                    "signal", name=proc.name, pid=proc.pid, sig="SIGCONT", proc=proc.key
                )
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name, proc in alive.items():
            left = max(0.1, deadline - time.monotonic())
            try:
                codes[name] = await asyncio.to_thread(proc.popen.wait, left)
            except subprocess.TimeoutExpired:
                self.history.add("signal", name=name, pid=proc.pid, sig="SIGKILL", proc=proc.key)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.popen.kill()
                codes[name] = await asyncio.to_thread(proc.popen.wait)
        return codes

    def kill_all_now(self) -> None:
        for proc in self.procs.values():
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGKILL)
                proc.popen.kill()
                proc.popen.wait()

    def log_lines(self, name: str | None = None) -> Iterator[str]:
        pattern = f"worker-{name}-*.log" if name else "worker-*.log"
        for path in sorted(self.run_dir.glob(pattern)):
            yield from path.read_text(errors="replace").splitlines()


def first_starts(run_dir: Path, since: float) -> dict[str, float]:
    """Per worker process: its first job start after ``since`` (from the exec log)."""
    out: dict[str, float] = {}
    for e in read_exec_log(run_dir):
        if e["ev"] == "start" and e["t"] > since and e["proc"] not in out:
            out[e["proc"]] = float(e["t"])
    return out


def read_exec_log(run_dir: Path) -> list[dict[str, Any]]:
    """Every line the jobs logged, oldest first (a line cut by a kill is skipped)."""
    rows = []
    for path in (run_dir / "exec").glob("exec-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
    rows.sort(key=lambda r: r["t"])
    return rows


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50, p99 and max (nearest rank), or ``None`` for no values."""
    if not values:
        return {"p50": None, "p99": None, "max": None}
    s = sorted(values)

    def rank(p: float) -> float:
        return s[min(len(s) - 1, max(0, math.ceil(p / 100 * len(s)) - 1))]

    return {"p50": rank(50), "p99": rank(99), "max": s[-1]}


class Db:
    """The test's direct, synchronous view of the database (short statements only)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sqlite = url.startswith("sqlite")

    def query(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        if self.sqlite:
            conn = sqlite3.connect(effects.sqlite_path(self.url), timeout=30)
            try:
                return list(conn.execute(sql.replace("%s", "?"), params).fetchall())
            finally:
                conn.close()
        # The cluster may be restarting (this suite's scenario, or someone else's):
        # connection failures are retried for a while, other errors are not.
        deadline = time.monotonic() + 60
        while True:
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as pg:
                    cur = pg.execute(sql, params)  # type: ignore[arg-type]
                    return list(cur.fetchall()) if cur.description else []
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def execute_script(self, script: str) -> None:
        if self.sqlite:
            conn = sqlite3.connect(effects.sqlite_path(self.url), timeout=30)
            try:
                conn.executescript(script)
            finally:
                conn.close()
        else:
            with psycopg.connect(self.url, autocommit=True) as pg:
                pg.execute(script)  # type: ignore[arg-type]

    def running_of(self, pid: int) -> list[tuple[int, int]]:
        """(job, lease token) of the running jobs leased by the worker process ``pid``."""
        rows = self.query(
            "SELECT id, lease_token FROM tether_jobs WHERE state = 'running' AND worker_id LIKE %s",
            (f"%:{pid}:%",),
        )
        return [(int(r[0]), int(r[1])) for r in rows]

    def running_of_worker(self, worker_id: str | None) -> list[tuple[int, int]]:
        """(job, lease token) of the running jobs leased by ``worker_id``."""
        rows = self.query(
            "SELECT id, lease_token FROM tether_jobs WHERE state = 'running' AND worker_id = %s",
            (worker_id,),
        )
        return [(int(r[0]), int(r[1])) for r in rows]

    def states(self, job_ids: list[int]) -> dict[int, str]:
        """The current state of each of these jobs."""
        if not job_ids:
            return {}
        marks = ",".join(str(int(i)) for i in job_ids)
        rows = self.query(f"SELECT id, state FROM tether_jobs WHERE id IN ({marks})")
        return {int(r[0]): str(r[1]) for r in rows}

    def counts(self) -> dict[str, int]:
        return {
            r[0]: int(r[1])
            for r in self.query("SELECT state, COUNT(*) FROM tether_jobs GROUP BY state")
        }

    def events(self, job_ids: list[int] | None = None) -> list[dict[str, Any]]:
        """Transitions, each job's in order (stored and derived), with ``at`` as Unix
        seconds."""
        at = "at" if self.sqlite else "extract(epoch FROM at)"
        # The history, stored and derived (migration 0028), each job's in its order.
        sql = (
            f"SELECT job_id, from_state, to_state, {at}, worker_id, actor, reason "
            "FROM tether_job_history"
        )
        rows = self.query(sql + " ORDER BY job_id, rank, id")
        wanted = set(job_ids) if job_ids is not None else None
        keys = ("job", "src", "dst", "at", "worker", "actor", "reason")
        return [
            dict(zip(keys, (int(r[0]), r[1], r[2], float(r[3]), r[4], r[5], r[6]), strict=True))
            for r in rows
            if wanted is None or int(r[0]) in wanted
        ]

    def listener_pids(self) -> list[int]:
        """PostgreSQL backends of live workers' LISTEN connections (this database only)."""
        rows = self.query(
            "SELECT DISTINCT w.backend_pid FROM tether_workers w JOIN pg_stat_activity a "
            "ON a.pid = w.backend_pid WHERE w.state = 'active' AND a.datname = current_database()"
        )
        return [int(r[0]) for r in rows]

    def terminate(self, backend_pids: list[int]) -> int:
        """``pg_terminate_backend`` on these backends, only if they belong to this database."""
        if not backend_pids:
            return 0
        rows = self.query(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE pid = ANY(%s) AND datname = current_database()",
            (backend_pids,),
        )
        return int(rows[0][0])


async def wait_for(probe: Any, timeout: float, every: float = 0.05) -> Any:
    """Poll a sync or async ``probe`` until truthy; ``AssertionError`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(every)


ACTIVE_STATES = ("queued", "blocked", "running", "retrying", "paused")


def active_count(db: Db) -> int:
    rows = db.query(
        "SELECT COUNT(*) FROM tether_jobs WHERE state IN "
        "('queued', 'blocked', 'running', 'retrying', 'paused')"
    )
    return int(rows[0][0])


async def wait_all_done(db: Db, timeout: float, every: float = 0.25) -> float:
    """Wait until no job is active; returns the seconds waited."""
    started = time.monotonic()
    await wait_for(lambda: active_count(db) == 0, timeout, every)
    return time.monotonic() - started


def recovery_times(kills: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[float]:
    """For every job a kill took down: seconds from the kill until it was leased again
    (its next ``running`` transition).

    ``kills`` are history ops with ``t`` and ``held`` ([job, token] pairs read just
    before the signal); a job that finished in between is not leased again: skipped.
    """
    claims: dict[int, list[float]] = {}
    for e in events:
        if e["dst"] == "running":
            claims.setdefault(e["job"], []).append(e["at"])
    out = []
    for kill in kills:
        for job, _ in kill["held"]:
            later = [t for t in claims.get(job, []) if t >= kill["t"]]
            if later:
                out.append(min(later) - kill["t"])
    return out


def rescue_times(kills: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[float]:
    """For every job a kill took down: seconds from the kill until the rescuer freed it."""
    rescues: dict[int, list[float]] = {}
    for e in events:
        if e["actor"] == "rescuer" and e["src"] == "running":
            rescues.setdefault(e["job"], []).append(e["at"])
    out = []
    for kill in kills:
        for job, _ in kill["held"]:
            later = [t for t in rescues.get(job, []) if t >= kill["t"] - 0.01]
            if later:
                out.append(min(later) - kill["t"])
    return out
