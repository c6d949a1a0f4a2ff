"""The fault suite's runner: profile selection, one database per scenario, the report.

Profiles: ``--faults=short|full|off`` (with ``pytest tests/faults``) or
``TETHER_FAULTS=short|full|off``; plain ``pytest`` runs the short profile. The full
profile writes ``tests/faults/REPORT.md``; ``TETHER_FAULTS_REPORT=path`` writes the
table of any run to ``path``.

PostgreSQL is restarted only by the PostgreSQL-restart scenario, on a private
throwaway cluster of the session's own (``private_pg``), never the shared server; it
runs in every profile.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import IN_CI
from tests.faults import effects
from tests.faults.checker import Verdict, check
from tests.faults.faultapp import build_app
from tests.faults.harness import Cluster, Db, History, wait_for
from tests.faults.hosts import HostNet, unavailable
from tests.faults.profiles import PROFILES
from tether import App, AppConfig, StoreError

HERE = Path(__file__).resolve().parent
RESULTS: dict[str, dict[str, Any]] = {}
TIMEOUTS = {"short": 150, "full": 1800}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--faults",
        default=None,
        choices=["short", "full", "off"],
        help="fault-injection profile (default: $TETHER_FAULTS or short)",
    )


def profile_name(config: pytest.Config) -> str:
    name = None
    with contextlib.suppress(ValueError):
        name = config.getoption("faults", default=None)
    return str(name or os.environ.get("TETHER_FAULTS") or "short")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "faults: fault-injection scenario (tests/faults)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    name = profile_name(config)
    for item in items:
        if HERE not in Path(str(item.fspath)).parents:
            continue
        item.add_marker(pytest.mark.faults)
        if name == "off":
            item.add_marker(pytest.mark.skip(reason="TETHER_FAULTS=off"))
        elif item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIMEOUTS.get(name, 1800)))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if not RESULTS:
        return
    name = profile_name(config)
    table = render_report(name)
    terminalreporter.write_sep("-", f"fault scenarios ({name} profile)")
    terminalreporter.write_line(table)
    target = os.environ.get("TETHER_FAULTS_REPORT")
    if target or name == "full":
        path = Path(target) if target else HERE / "REPORT.md"
        path.write_text(table + "\n")
        terminalreporter.write_line(f"report written to {path}")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


LEGEND = """
Figures:

- `recovery_*`: from a SIGKILL until each job the victim held was leased again (its
  next `running` transition); `rescue_*`: until the rescuer took it from the dead
  worker. Percentiles are nearest-rank.
- `stale_rejected`: fenced effect writes refused because their lease token was stale,
  each counted in `fault_effect_log`; `effects_superseded`: effects of attempts that
  died before completing, replaced by the completing attempt's (one effect per job).
- `reruns`: executions beyond the first, over all jobs (crashes cost re-runs, never
  a second completion).
- `overlaps`: pairs of attempts of one job that ran at the same time; `live_rescues`:
  jobs the rescuer took from a worker while their attempt still ran there. Both must
  be 0 (invariant 7); an attempt runs from its start until it ends, its process is
  killed, or its process is frozen (a frozen attempt is a zombie, which the fence
  answers).
- multihost: workers share one host name in three PID namespaces; `kill_rescue_*`
  and `freeze_rescue_*` are from the SIGKILL (SIGSTOP) until the rescuer freed each
  job the victim held; `rescued_worker_dead` counts rescues after a pid check (same
  namespace) or a lost session, `rescued_lease_expired` those after lease expiry.
- `pruned`: jobs the pruner deleted during the run (checked all the same: the fault
  schema keeps what is deleted); `stuck_parents` / `stuck_dependents`: jobs still
  `blocked` though everything they waited for had ended (invariant 8);
  `out_of_order`: dependents that started before a dependency's successful end, or a
  parent's later phase before its children's ends (invariant 9).
- mixed: every kind of job at once (bulk, workflows with `WaitForChildren`, dependency
  chains, `depends_on` a running job, transactional enqueue committed and rolled
  back, a 5/s burst-5 rate limit, per-second schedules on two kinds of worker,
  pruning after 1 s), the leader and another worker SIGKILLed; failed parents are
  retried once their children are old enough to prune. `ticks_*` / `missed_*`: ticks
  each schedule fired, and those missed once any schedule fired; `rate_overruns`:
  windows in which the rate-limited task started more than its bucket allows;
  `feed_transitions`: what a live feed saw while it followed, from a quarter of the run
  to a half (on PostgreSQL every transition is stored meanwhile, and only what a job's
  row cannot give before and after: the histories must be whole either way).
- foreign_locks: an outside transaction holds random job, limit, rate-bucket and
  schedule rows (`FOR UPDATE`, `FOR SHARE`, `FOR KEY SHARE`; on SQLite long reads and
  the write lock); `rescue_others_*`: from a SIGKILL until each of the victim's jobs
  whose row was not held was freed (polled; bound `rescue_bound`), while one of its
  rows was held; `rescue_unheld_max`: the same with no row held;
  `unrelated_lease_losses`: jobs whose rows were not held that lost their lease (must
  be 0; on SQLite outside the one hold of the write lock for two leases).
- hosts: each worker on a host of its own (a network namespace linked by a veth pair,
  and a PID namespace); `jobs_cut_off` were running on a host when its link went down
  (or its traffic was dropped by iptables); `fence_margin` is how long before its lease
  ended each was stopped, `rescue_after_cut` from the cut until the rescuer freed it,
  `rejoin` from healing until the host's worker started a job again;
  `claims_lost_in_cut` were claimed just before the cut but the answer never reached
  the worker (it never started them; the rescue frees them);
  `rescued_while_slow` counts rescues from a host whose link was slowed (must be 0).
- failover: a synchronous standby promoted after the primary was stopped
  `-m immediate`, everyone on one multi-host URL; `acked_lost` counts acknowledged
  enqueues missing afterwards (must be 0), `unacked_committed` enqueues whose answer
  was lost but which committed; `worker_recovery_*` is from the promotion until each
  worker started a job again, `producer_recovery_max` until an enqueue was acknowledged.
- pgbouncer_restart: the pooler SIGKILLed and started again after `down_s`;
  `worker_recovery_*` and `producer_recovery_max` are from its restart.
- zombie: `replayed_*` are the zombie's own heartbeat, completion and effect, sent
  with its token while the new attempt runs; `wake_to_abandon` is from SIGCONT until
  the zombie's attempt was told to stop (it fences itself before its first beat).
- durable: jobs of five durable steps, each step's row written in a fenced transaction
  (`fault_step_effects`, no unique key), while workers are SIGKILLed mid-step and
  SIGSTOPped past their lease; `steps` completed, `steps_replayed` steps a later
  attempt found done and did not run again, `effects` rows committed (one per step:
  invariants 11 and 12), `writes_uncommitted` rows written by attempts that never
  committed them (killed, or a zombie's); `zombie_effects_refused` writes of attempts
  frozen mid-step that never committed, `zombie_effects_committed` those that did when
  the zombie woke because nobody had taken the job meanwhile (a lease is fenced by its
  token: an expired one nobody took is still its holder's).
- partition: `fence_margin` is how long before its lease ended each cut-off job was
  stopped; `log_lines_during` counts the worker's log records during the partition;
  `rejoin_s` is from healing until the worker claimed work again.
- sigterm: `takeup` is from a long job's release until another worker started it
  from its checkpoint; `started_after_signal` counts jobs that started on the victim
  after the signal (must be 0); `in_flight_claims_handed_back` counts jobs of a claim
  already out at the signal, which went back to the queue unstarted.
- cancel race: `answer_*` are app.cancel()'s outcomes (`illegal`: it raised because
  the job had already succeeded); `disagreements` counts answers that contradict the
  job's final state.
"""


# Timing targets: figures a healthy run reaches on an idle machine. They are reported
# (met or missed) in REPORT.md, never asserted: on a loaded machine they vary while
# every invariant holds. scenario -> [(figure, bound, comparison)].
_FAST = {"<": lambda v, b: v < b, "<=": lambda v, b: v <= b}
_STORM = [("rescue_max", 5.0, "<"), ("recovery_p50", 2.0, "<")]
_SIGTERM = [("takeup_max", 2.0, "<")]
_MULTIHOST = [("kill_rescue_max", 5.0, "<")]
TARGETS: dict[str, list[tuple[str, float, str]]] = {
    "storm": _STORM,
    "sqlite_storm": _STORM,
    "hung": [
        ("spin_slot_held_max", 3.0, "<"),
        ("thread_slot_held_max", 3.0, "<"),
        ("force_cancel_s_max", 3.0, "<"),
    ],
    "listen_kill": [("start_during_gap_max", 4.0, "<="), ("start_after_relisten_max", 1.0, "<")],
    "pg_restart": [("probe_start_max", 1.5, "<")],
    "sigterm": _SIGTERM,
    "sqlite_sigterm": _SIGTERM,
    "rolling": [("recovery_max", 5.0, "<")],
    "pause": [("first_claim_after_resume_s", 1.0, "<")],
    "zombie": [("wake_to_abandon_max", 1.0, "<=")],
    "multihost": _MULTIHOST,
    "sqlite_multihost": _MULTIHOST,
    "foreign_locks": [("rescue_unheld_max", 1.5, "<")],
    "sqlite_foreign_locks": [("rescue_unheld_max", 1.5, "<")],
    "hosts": [("rejoin_max", 5.0, "<"), ("rescue_after_cut_max", 6.0, "<")],
    "failover": [("worker_recovery_max", 5.0, "<"), ("producer_recovery_max", 5.0, "<")],
    "pgbouncer_restart": [("worker_recovery_max", 5.0, "<")],
}


def render_targets() -> list[str]:
    """The timing targets of the scenarios that ran, with what each run measured."""
    rows = []
    for scen, res in RESULTS.items():
        for figure, bound, op in TARGETS.get(scen, []):
            value = res["figures"].get(figure)
            met = "-" if value is None else ("yes" if _FAST[op](value, bound) else "**no**")
            rows.append(f"| {scen} | {figure} {op} {bound:g} | {_fmt(value)} | {met} |")
    if not rows:
        return []
    return [
        "",
        "Timing targets (reported, not asserted: the tests assert invariants only):",
        "",
        "| scenario | target (s) | measured | met |",
        "|---|---|---|---|",
        *rows,
    ]


def render_report(profile: str) -> str:
    lines = [
        f"# Fault-injection report ({profile} profile)",
        "",
        f"Run on {time.strftime('%Y-%m-%d %H:%M')} on this 2-core machine; times in seconds. "
        "Every scenario ends with the invariant check (0 violations = all twelve hold).",
        "",
        "| scenario | result | time | figures |",
        "|---|---|---|---|",
    ]
    for scen, res in RESULTS.items():
        figures = ", ".join(
            f"{k}={_fmt(v)}" for k, v in res["figures"].items() if k not in ("violations",)
        )
        lines.append(f"| {scen} | {res['result']} | {_fmt(res['seconds'])} | {figures} |")
    lines += render_targets()
    return "\n".join(lines) + "\n" + LEGEND


@dataclass
class Scenario:
    """One scenario's world: its database, workers, history and figures."""

    name: str
    url: str
    run_dir: Path
    history: History
    cluster: Cluster
    db: Db
    app: App
    params: dict[str, Any]
    profile: str
    figures: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    supervisor: asyncio.Task[None] | None = None

    @property
    def sqlite(self) -> bool:
        return self.url.startswith("sqlite")

    async def enqueue(self, task: str, args: list[dict[str, Any]], **options: Any) -> list[int]:
        """Enqueue in one transaction and record the acknowledged ids."""
        sent = time.time()
        jobs = await self.app.enqueue_many([(task, a) for a in args], **options)
        ids = [j.id for j in jobs]
        self.history.add("enqueued", task=task, ids=ids, sent=sent)
        return ids

    async def registered(self, names: Iterable[str], timeout: float = 30) -> None:
        """Wait until each of ``names`` is a registered worker (not "active": a worker
        judged dead by mistake must not stop the run before the invariants see what
        that costs)."""
        await wait_for(lambda: all(self.cluster.registered(n, self.db) for n in names), timeout)

    async def trickle(self, rng: random.Random, stop: asyncio.Event) -> None:
        """A few work jobs every 0.1 s until ``stop``, through whatever fails meanwhile
        (a failover, a pooler restart): a failed try is recorded and the next one made
        (an unacknowledged one may still have committed, which the checker allows)."""
        while not stop.is_set():
            args = [{"ms": rng.randint(*self.params["ms"])} for _ in range(3)]
            try:
                await self.enqueue("work", args)
            except StoreError as exc:
                self.history.add("enqueue_failed", error=str(exc)[:200])
            await asyncio.sleep(0.1)

    def supervise(self) -> None:
        if self.supervisor is None:
            self.supervisor = asyncio.create_task(self.cluster.supervise())

    async def unsupervise(self) -> None:
        if self.supervisor is not None:
            self.supervisor.cancel()
            with contextlib.suppress(BaseException):
                await self.supervisor
            self.supervisor = None

    def check(self, *, must_succeed: set[int] | None = None) -> Verdict:
        verdict = check(self.db, self.run_dir, self.history, must_succeed=must_succeed)
        self.figures.update(verdict.figures)
        return verdict

    def assert_invariants(self, *, must_succeed: set[int] | None = None) -> Verdict:
        verdict = self.check(must_succeed=must_succeed)
        assert not verdict.violations, (
            f"{len(verdict.violations)} invariant violation(s) in {self.run_dir}:\n"
            + verdict.summary()
        )
        return verdict


MakeScenario = Callable[..., Awaitable[Scenario]]


@pytest.fixture
def fault_profile(request: pytest.FixtureRequest) -> str:
    return profile_name(request.config)


@pytest.fixture
async def scenario(
    request: pytest.FixtureRequest, tmp_path: Path, fault_profile: str
) -> AsyncIterator[MakeScenario]:
    """``await scenario(name, store="postgres"|"sqlite", **worker config)``."""
    made: list[Scenario] = []
    dbs: list[tuple[str, str]] = []

    async def make(
        name: str,
        *,
        store: str = "postgres",
        params: str | None = None,
        pg_admin: str | None = None,
        **config: Any,
    ) -> Scenario:
        run_dir = tmp_path / name
        (run_dir / "exec").mkdir(parents=True)
        if store == "sqlite":
            url = f"sqlite:///{run_dir}/tether.db"
        else:
            admin = pg_admin or request.getfixturevalue("pg_admin_url")
            db_name = f"fault_{name}_{secrets.token_hex(4)}"
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{db_name}"')  # type: ignore[arg-type]
            dbs.append((admin, db_name))
            url = admin.rsplit("/", 1)[0] + f"/{db_name}"
        app = build_app(url)
        app.config = AppConfig(wait_poll_interval=0.1)
        await app.admin.migrate()
        db = Db(url)
        db.execute_script(effects.SQLITE_SCHEMA if store == "sqlite" else effects.PG_SCHEMA)
        history = History(run_dir / "history.jsonl")
        cluster = Cluster(run_dir, url, history, config=config)
        scen = Scenario(
            name,
            url,
            run_dir,
            history,
            cluster,
            db,
            app,
            PROFILES[fault_profile][params or name],
            fault_profile,
        )
        made.append(scen)
        return scen

    yield make

    for scen in made:
        await scen.unsupervise()
        scen.cluster.kill_all_now()
        with contextlib.suppress(Exception):
            await scen.app.close()
        scen.history.save()
        failed = getattr(request.node, "rep_call", None)
        result = "pass" if failed is not None and failed.passed else "FAIL"
        if failed is not None and failed.skipped:
            result = "xfail" if hasattr(failed, "wasxfail") else "skip"
        RESULTS[scen.name] = {
            "result": result,
            "seconds": time.monotonic() - scen.started,
            "figures": scen.figures,
        }
    for admin, db_name in dbs:
        with contextlib.suppress(psycopg.Error), psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')  # type: ignore[arg-type]


@pytest.fixture
def hosts() -> Iterator[HostNet]:
    """This test's worker hosts (``hosts.add(n)``), removed afterwards whatever happens.
    Skips where namespaces cannot be made (not root, ``ip``/``iptables`` missing), except
    under ``CI=true``, where that fails: CI must not pass by skipping these scenarios."""
    why = unavailable()
    if why is not None:
        if IN_CI:
            pytest.fail(f"CI needs network namespaces for the host scenarios: {why}")
        pytest.skip(why)
    net = HostNet()
    try:
        yield net
    finally:
        net.close()
    assert not net.leftovers(), f"hosts left behind: {net.leftovers()}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.rep_call = rep  # type: ignore[attr-defined]
