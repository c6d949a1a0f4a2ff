"""Facts about processes, to tell a dead worker from a slow one.

A pid names a process only within one PID namespace of one running kernel. Two hosts
may share a name (two VMs called ``ubuntu``, containers on the host's network), and one
host runs many PID namespaces (containers, ``unshare --pid``), so a worker records where
its pid means something (:class:`PidSpace`), and another worker checks that pid only
from the same place (:func:`process_gone`). Everywhere else, a worker is judged by its
database session (PostgreSQL) and by the expiry of its leases.
"""

from __future__ import annotations

import functools
import os
import socket
from dataclasses import dataclass

BOOT_ID = "/proc/sys/kernel/random/boot_id"
MACHINE_ID = ("/etc/machine-id", "/var/lib/dbus/machine-id")


def hostname() -> str:
    """This host's name as workers record it (for people; it identifies nothing)."""
    return socket.gethostname()


@dataclass(frozen=True)
class PidSpace:
    """Where a pid names one process: a kernel boot, a PID namespace, a machine.

    A field is ``None`` where it cannot be read; pids are comparable only between two
    spaces that are :attr:`known` and equal.
    """

    boot_id: str | None
    pid_ns: str | None
    machine_id: str | None

    @property
    def known(self) -> bool:
        """Whether this process can judge pids at all: the boot and namespace are known."""
        return self.boot_id is not None and self.pid_ns is not None


@dataclass(frozen=True)
class WorkerProcess:
    """A worker's process as its row records it."""

    pid: int
    pid_start: int | None
    space: PidSpace


def _read_first(*paths: str) -> str | None:
    for path in paths:
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                value = f.read().strip()
        except OSError:
            continue
        if value:
            return value
    return None


def _pid_ns() -> str | None:
    """This process's PID namespace (``pid:[inode]``), if ``/proc`` shows it.

    A ``/proc`` mounted for another namespace (``unshare --pid`` without
    ``--mount-proc``) lists other processes under our pids: then no pid can be checked
    through it, and the namespace counts as unknown.
    """
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


@functools.cache
def pid_space() -> PidSpace:
    """This process's :class:`PidSpace` (read once: it cannot change while we run)."""
    return PidSpace(
        boot_id=_read_first(BOOT_ID), pid_ns=_pid_ns(), machine_id=_read_first(*MACHINE_ID)
    )


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; everything after its ')' is fixed.
    return raw[raw.rfind(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """The process start time in clock ticks since boot (Linux), or ``None``."""
    fields = _stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def pid_alive(pid: int, expected_start: int | None) -> bool:
    """Whether ``pid`` is still the same live process (not a zombie, not a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat(pid)
    if fields is None:
        return True  # no /proc: trust the signal check
    if fields[0] in ("Z", "X"):
        return False
    return expected_start is None or int(fields[19]) == expected_start


def process_gone(proc: WorkerProcess, here: PidSpace | None = None) -> bool:
    """Whether a worker's process is known to be gone, judged from ``here`` (this
    process's space by default).

    Only a worker in the same known space can be checked by pid; for any other the
    answer is ``False`` (not known gone), and its session or lease expiry decides.
    """
    here = pid_space() if here is None else here
    if not here.known or proc.space != here:
        return False
    return not pid_alive(proc.pid, proc.pid_start)
