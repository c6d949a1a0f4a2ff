"""Facts about processes on this host, to tell a dead worker from a slow one."""

from __future__ import annotations

import os
import socket


def hostname() -> str:
    """This host's name as workers record it."""
    return socket.gethostname()


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
