"""Whether a worker's pid can be checked from here: the decision behind dead-worker
detection."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys

import pytest

from tether.procinfo import PidSpace, WorkerProcess, pid_space, process_gone, start_time

HERE = PidSpace(boot_id="boot-1", pid_ns="pid:[4026531836]", machine_id="machine-1")


def exited_pid() -> int:
    """The pid of a child process that has exited and been reaped."""

    async def run() -> int:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
        await proc.wait()
        return proc.pid

    return asyncio.run(run())


def test_this_process_knows_its_pid_space() -> None:
    space = pid_space()
    assert space.known
    with open("/proc/sys/kernel/random/boot_id") as f:
        assert space.boot_id == f.read().strip()
    assert space.pid_ns == os.readlink("/proc/self/ns/pid")


def test_a_gone_process_in_the_same_space_is_gone() -> None:
    assert process_gone(WorkerProcess(exited_pid(), None, pid_space()))


def test_a_live_process_in_the_same_space_is_not_gone() -> None:
    me = os.getpid()
    assert not process_gone(WorkerProcess(me, start_time(me), pid_space()))


def test_a_reused_pid_in_the_same_space_is_gone() -> None:
    me = os.getpid()
    start = start_time(me)
    assert start is not None
    assert process_gone(WorkerProcess(me, start - 1, pid_space()))


def test_a_pid_from_another_boot_namespace_or_machine_is_never_judged() -> None:
    gone = exited_pid()
    for field in ("boot_id", "pid_ns", "machine_id"):
        there = dataclasses.replace(pid_space(), **{field: "elsewhere"})
        assert not process_gone(WorkerProcess(gone, None, there)), field


def test_the_decision_compares_the_space_given() -> None:
    gone = exited_pid()
    assert not process_gone(WorkerProcess(gone, None, pid_space()), HERE)
    assert process_gone(WorkerProcess(gone, None, HERE), HERE)


def test_no_pid_is_judged_from_an_unknown_space() -> None:
    blind = PidSpace(boot_id=None, pid_ns=None, machine_id=None)
    gone = exited_pid()
    assert not process_gone(WorkerProcess(gone, None, blind), blind)
    half = dataclasses.replace(HERE, pid_ns=None)
    assert not process_gone(WorkerProcess(gone, None, half), half)


def test_a_missing_machine_id_matches_only_a_missing_machine_id() -> None:
    gone = exited_pid()
    no_machine = dataclasses.replace(HERE, machine_id=None)
    assert process_gone(WorkerProcess(gone, None, no_machine), no_machine)
    assert not process_gone(WorkerProcess(gone, None, no_machine), HERE)


def _space_in(*unshare: str) -> str:
    """``repr(pid_space())`` as a process started under ``unshare`` sees it."""
    code = "from tether.procinfo import pid_space; print(repr(pid_space()))"
    done = subprocess.run(
        [*unshare, sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0 and "unshare" in done.stderr:
        pytest.skip(f"cannot unshare here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_process_in_its_own_pid_namespace_has_another_space() -> None:
    there = _space_in("unshare", "--pid", "--fork", "--mount-proc")
    here = pid_space()
    assert f"boot_id={here.boot_id!r}" in there and f"machine_id={here.machine_id!r}" in there
    assert "pid_ns=None" not in there and f"pid_ns={here.pid_ns!r}" not in there


def test_a_proc_of_another_pid_namespace_makes_the_space_unknown() -> None:
    # Without --mount-proc, /proc lists the parent namespace's processes under our pids.
    there = _space_in("unshare", "--pid", "--fork")
    assert "pid_ns=None" in there
