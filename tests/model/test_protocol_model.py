"""The SPIN model of the lease protocol (src/tether/model/protocol.pml), checked.

Safety (every scenario, exhaustively): no two attempts of a job effective at once, none
inside its lease at once, no write accepted from a stale token, no lost job, and no
transition that states.py does not list. Liveness under weak fairness (acceptance
cycles of the LTL claims): every job ends, every cancellation settles. A mutated model
must fail with a counterexample trail, so a model change that breaks a property fails
the run. A broken property's assertion message carries the trail (``spin -t -p``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.model.promela import MODEL_DIR, STATES_PML, model_transitions, states_pml
from tether.states import transition_pairs

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
MODEL = MODEL_DIR / "protocol.pml"
# Deep enough for the longest path of any scenario (about 2,700 steps).
DEPTH = "-m20000"
# The model's scenario bits (protocol.pml, SCENARIOS).
SCENARIO = {"S_CRASH": 1, "S_CLOCK": 2, "S_NETWORK": 4, "S_REQUESTS": 8, "S_LOCKS": 16}


def scenarios(*names: str) -> str:
    """The ``-D`` that restricts a check to the named scenarios (spin hands its defines
    to the preprocessor through a shell, so a plain number)."""
    return f"-DSCENARIOS={sum(SCENARIO[n] for n in names)}"


def _tools() -> None:
    missing = [tool for tool in ("spin", "gcc") if shutil.which(tool) is None]
    if missing:
        message = f"the protocol model needs {' and '.join(missing)} (Debian packages spin, gcc)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


@dataclass
class Check:
    """One pan run: what it found and what it cost."""

    errors: int
    states: int
    memory_mb: float
    seconds: float
    output: str
    trail: str

    def summary(self) -> str:
        return (
            f"{self.states} states, {self.memory_mb:.0f} MB, {self.seconds:.1f} s, "
            f"{self.errors} error(s)"
        )


def run_check(
    workdir: Path,
    *,
    defines: list[str],
    claim: str | None = None,
    model: str | None = None,
    optimize: str = "-O0",
) -> Check:
    """Generate the verifier (``spin -a``), compile it and run it: for safety (assertions,
    the invariant monitor, end states) without a claim, else for acceptance cycles of
    the LTL ``claim`` under weak fairness. On an error, replay the trail.

    ``optimize``: gcc takes about 9 s to compile ``pan.c`` with -O2 and 1.5 s with -O0,
    and -O2's verifier runs about twice as fast: worth it only for the long searches."""
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(STATES_PML, workdir / "states.pml")
    (workdir / "protocol.pml").write_text(model if model is not None else MODEL.read_text())
    spin_defs = [*defines, *(["-DNOMONITOR"] if claim else [])]
    subprocess.run(
        ["spin", "-a", *spin_defs, "protocol.pml"],
        cwd=workdir,
        check=True,
        capture_output=True,
        text=True,
    )
    cflags = [optimize, "-w", "-DMEMLIM=2048", "-DNOBOUNDCHECK"]
    cflags += ["-DNFAIR=3"] if claim else ["-DSAFETY", "-DNOCLAIM"]
    subprocess.run(
        ["gcc", *cflags, "-o", "pan", "pan.c"], cwd=workdir, check=True, capture_output=True
    )
    args = ["./pan", DEPTH, "-w24"]
    args += ["-a", "-f", "-N", claim] if claim else []
    started = time.monotonic()
    out = subprocess.run(args, cwd=workdir, capture_output=True, text=True, timeout=600).stdout
    seconds = time.monotonic() - started
    errors = int(_field(r"errors: (\d+)", out))
    trail = ""
    if errors and (workdir / "protocol.pml.trail").exists():
        replay = subprocess.run(
            ["spin", "-t", "-p", "-g", "-k", "protocol.pml.trail", *spin_defs, "protocol.pml"],
            cwd=workdir,
            capture_output=True,
            text=True,
        )
        trail = replay.stdout + replay.stderr
    return Check(
        errors=errors,
        states=int(_field(r"(\d+) states, stored", out)),
        memory_mb=float(_field(r"([\d.]+)\s+total actual memory usage", out)),
        seconds=seconds,
        output=out,
        trail=trail,
    )


def _field(pattern: str, text: str) -> str:
    found = re.search(pattern, text)
    assert found, f"pan's output has no {pattern!r}:\n{text}"
    return found.group(1)


def _failure(check: Check, what: str) -> str:
    # The trail can be long; its last part holds the violation, and the start the scenario.
    trail = check.trail
    if len(trail) > 60_000:
        trail = trail[:10_000] + "\n[...]\n" + trail[-50_000:]
    return f"{what}: {check.summary()}\n{check.output}\ncounterexample (spin -t -p):\n{trail}"


@pytest.fixture(autouse=True)
def _need_tools() -> None:
    _tools()


# -- the model and states.py ---------------------------------------------------------


def test_the_models_state_machine_is_generated_from_states_py() -> None:
    assert STATES_PML.read_text() == states_pml(), (
        "src/tether/model/states.pml differs from states.py; regenerate it with "
        "`PYTHONPATH=src python -m tests.model.promela` and check the model still holds"
    )


def test_the_models_transitions_equal_states_py() -> None:
    assert model_transitions(STATES_PML.read_text()) == set(transition_pairs())


def test_every_state_change_in_the_model_goes_through_the_checked_guard() -> None:
    # MOVE asserts LEGAL(from, to) (generated from states.py): a state assigned any
    # other way would escape the comparison above.
    text = MODEL.read_text()
    assignments = re.findall(r"\bst\[[^\]]+\]\s*=(?!=)", text)
    assert assignments == ["st[j] ="], assignments
    assert "assert(LEGAL(st[j], to))" in text


# -- the protocol's properties -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_safety_holds_in_every_scenario(tmp_path: Path) -> None:
    check = run_check(tmp_path, defines=[scenarios(*SCENARIO)], optimize="-O2")
    print(f"safety, every scenario: {check.summary()}")
    assert check.errors == 0, _failure(check, "a safety property broke")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("size", ["-DNW=3", "-DNJ=3"])
def test_safety_holds_with_three_workers_or_three_jobs(tmp_path: Path, size: str) -> None:
    # The crash scenario (a SIGKILL or shutdown, and a stall): a third worker or job
    # multiplies the states by 10 to 34 (every worker watches every worker), so the
    # other scenarios stay at 2 x 2.
    check = run_check(tmp_path, defines=[size, scenarios("S_CRASH")], optimize="-O2")
    print(f"safety, {size}, crash: {check.summary()}")
    assert check.errors == 0, _failure(check, "a safety property broke")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("claim", "names"),
    [
        ("every_job_ends", tuple(SCENARIO)),
        # Only this scenario cancels anything.
        ("every_cancellation_settles", ("S_REQUESTS",)),
    ],
)
def test_liveness_holds_under_weak_fairness(
    tmp_path: Path, claim: str, names: tuple[str, ...]
) -> None:
    check = run_check(tmp_path, defines=[scenarios(*names)], claim=claim, optimize="-O2")
    print(f"{claim} ({', '.join(names)}): {check.summary()}")
    assert check.errors == 0, _failure(check, f"{claim} broke")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_safety_holds_when_an_abandoned_heartbeat_lands_late(tmp_path: Path) -> None:
    # The heartbeater stops waiting for a call at its timeout and never waits for it
    # again, so the call may land after later beats (S_LOCKS gets one delay). Beats are
    # numbered (HEARTBEAT's beat_seq): one older than a beat already counted leaves the
    # worker's row alone. STALE_BEATS=2 is that; STALE_BEATS=1 (below) is without it.
    check = run_check(tmp_path, defines=["-DSTALE_BEATS=2", scenarios("S_LOCKS")], optimize="-O2")
    print(f"safety, abandoned beats, locks: {check.summary()}")
    assert check.errors == 0, _failure(check, "a safety property broke")


@pytest.mark.timeout(600)
def test_without_beat_numbers_a_late_beat_gets_a_live_workers_job_rescued(
    tmp_path: Path,
) -> None:
    # The defect the model found: the late beat's older `holding` makes a job its worker
    # still runs look dropped (README.md, "An abandoned heartbeat").
    check = run_check(tmp_path, defines=["-DSTALE_BEATS=1", scenarios("S_LOCKS")])
    assert check.errors > 0, "a late, unnumbered beat should break safety"
    assert check.trail, "a broken property must leave a trail"


# -- a broken model fails, with a trail ----------------------------------------------

MUTANTS = {
    # The rescue trusts the database clock alone (an expired lease): a clock step
    # rescues a live worker's job.
    "rescue_without_the_beat_watch": (
        "#define STALE(r, j) (EXPIRED(j) && (QUIET(r, own[j]) || DROPPED(own[j], j)))",
        "#define STALE(r, j) (EXPIRED(j))",
        "S_CLOCK",
        None,
    ),
    # Worker writes match the state but not the token: a resumed stale attempt
    # completes the job that another worker now runs.
    "writes_not_fenced_by_the_token": (
        "#define FENCED(j, t) (tok[j] == (t) && st[j] == RUNNING)",
        "#define FENCED(j, t) (st[j] == RUNNING)",
        "S_CRASH",
        None,
    ),
    # The heartbeat's answer renews the fence point of a job row it skipped (held by a
    # foreign transaction) although the beat was not counted: the lease runs out and the
    # worker goes quiet while the worker still trusts the job.
    "a_skipped_row_renews_the_fence_point": (
        "#define SKIPPED_RENEWS 0",
        "#define SKIPPED_RENEWS 1",
        "S_LOCKS",
        None,
    ),
    # A beat that did not reach the worker's row (held) renews every fence point as if
    # it had been counted: the same break, for every job the beat did not extend.
    "an_uncounted_beat_renews_the_fence": (
        "#define UNCOUNTED_FENCES 0",
        "#define UNCOUNTED_FENCES 1",
        "S_LOCKS",
        None,
    ),
    # A worker that skips its round: the clock waits for it forever, and pan reports
    # the deadlock (the clock has no end label).
    "a_worker_that_never_does_its_round": (
        ":: atomic { ACTIVE(w) && !done[w] ->",
        ":: atomic { false && ACTIVE(w) && !done[w] ->",
        "S_CRASH",
        None,
    ),
    # Nobody settles a cancellation record once its job has stopped.
    "no_follow_up": (
        "#define FOLLOW_UP(j) if :: crec[j] == PENDING && st[j] != RUNNING -> "
        "crec[j] = SETTLED :: else -> skip fi",
        "#define FOLLOW_UP(j) skip",
        "S_REQUESTS",
        "every_cancellation_settles",
    ),
    # The rescue ignores holding: a job its worker fenced (its beats delayed past the
    # fence point) stays running for good while the worker beats on.
    "the_rescue_ignores_holding": (
        "#define HOLDING 1",
        "#define HOLDING 0",
        "S_NETWORK",
        "every_job_ends",
    ),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_a_model_that_breaks_a_property_fails_with_a_trail(tmp_path: Path, name: str) -> None:
    old, new, scenario, claim = MUTANTS[name]
    text = MODEL.read_text()
    assert text.count(old) == 1, f"the model no longer has {old!r}; update this mutant"
    check = run_check(
        tmp_path,
        defines=[scenarios(scenario)],
        claim=claim,
        model=text.replace(old, new),
    )
    print(f"mutant {name}: {check.summary()}")
    assert check.errors > 0, f"the mutant {name} passed: the check cannot see that break"
    assert check.trail, f"the mutant {name} failed without a trail:\n{check.output}"
    kinds = r"pan:1: (assertion violated|invalid end state|acceptance cycle)"
    found = re.search(kinds, check.output)
    assert found, check.output
    assert (found.group(1) == "acceptance cycle") == bool(claim), check.output
