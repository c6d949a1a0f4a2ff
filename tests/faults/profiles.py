"""How big each scenario is: SHORT for ``make test``, FULL (the issue's counts) for
``make faults``. A scenario reads its numbers as ``profile["storm"]["kills"]``."""

from __future__ import annotations

from typing import Any

# The mixed scenario: seconds of traffic, then a drain of up to drain_timeout seconds.
_MIXED_SHORT = {
    "seconds": 14.0,
    "paced": 30,
    "failing_parents": 2,
    "bulk_size": 20,
    "txn_hold": 1.5,
    "drain_timeout": 25.0,
}
_MIXED_FULL = {
    "seconds": 120.0,
    "paced": 300,
    "failing_parents": 10,
    "bulk_size": 50,
    "txn_hold": 1.5,
    "drain_timeout": 120.0,
}

# Foreign locks: seconds of traffic; random holds of up to max_hold seconds; kill rounds
# that hold a running job of the victim for kill_hold seconds.
_FOREIGN_SHORT = {
    "seconds": 24.0,
    "max_hold": 6.0,
    "kill_hold": 6.0,
    "kill_rounds": 2,
    "live_rounds": 1,
    "holders": 2,
    "drain_timeout": 25.0,
}
_FOREIGN_FULL = {
    "seconds": 150.0,
    "max_hold": 20.0,
    "kill_hold": 20.0,
    "kill_rounds": 5,
    "live_rounds": 3,
    "holders": 2,
    "drain_timeout": 120.0,
}

# Durable steps: jobs of ``steps`` steps of ``ms`` milliseconds each, enqueued over
# ``seconds``, while ``kills`` SIGKILLs and ``freezes`` SIGSTOPs (past the lease) land.
_DURABLE_SHORT = {
    "jobs": 40,
    "steps": 5,
    "ms": (60, 140),
    "workers": 3,
    "concurrency": 4,
    "seconds": 8.0,
    "kills": 3,
    "freezes": 1,
}
_DURABLE_FULL = {
    "jobs": 1200,
    "steps": 5,
    "ms": (60, 200),
    "workers": 3,
    "concurrency": 4,
    "seconds": 120.0,
    "kills": 40,
    "freezes": 12,
}

SHORT: dict[str, dict[str, Any]] = {
    "storm": {"jobs": 300, "kills": 8, "workers": 3, "concurrency": 4, "ms": (40, 200)},
    "zombie": {"rounds": 2},
    "sigterm": {"rounds": 1, "short": 6, "long": 2},
    "rolling": {"jobs": 240, "workers": 3, "rounds": 3, "round_s": 1.5},
    "pg_restart": {"restarts": 1},
    "listen_kill": {"kills": 3},
    "partition": {"seconds": 6.0},
    "poison": {"poison": 2, "normal": 100},
    "hung": {"spin": 1, "block": 1, "force": 1, "normal": 6},
    "cancel_race": {"jobs": 120},
    "pause": {"jobs": 200},
    "sqlite_storm": {"jobs": 200, "kills": 6, "workers": 4, "concurrency": 3, "ms": (40, 200)},
    "sqlite_sigterm": {"rounds": 1, "short": 6, "long": 2},
    "sqlite_cancel_race": {"jobs": 60},
    "multihost": {"jobs": 120, "concurrency": 2, "ms": (200, 800), "rounds": 1},
    "sqlite_multihost": {"jobs": 120, "concurrency": 2, "ms": (200, 800), "rounds": 1},
    "mixed": _MIXED_SHORT,
    "sqlite_mixed": {**_MIXED_SHORT, "txn_hold": 0.5},
    "foreign_locks": _FOREIGN_SHORT,
    "sqlite_foreign_locks": _FOREIGN_SHORT,
    "failover": {"ms": (100, 400), "failovers": 1, "gap_s": 2.0, "warm_s": 3.0, "after_s": 3.0},
    "pgbouncer_restart": {
        "ms": (100, 400),
        "restarts": 2,
        "every_s": 2.0,
        "down_s": 0.5,
        "after_s": 2.0,
    },
    "hosts": {"keep": 16, "ms": (200, 600), "rounds": 1, "seconds": 5.0, "slow_s": 2.0},
    "durable": _DURABLE_SHORT,
    "sqlite_durable": _DURABLE_SHORT,
    "hooks": {"poison": 2, "normal": 100, "fail": 0.3},
    "sqlite_hooks": {"poison": 2, "normal": 60, "fail": 0.3},
}

FULL: dict[str, dict[str, Any]] = {
    "storm": {"jobs": 5000, "kills": 200, "workers": 3, "concurrency": 8, "ms": (100, 500)},
    "zombie": {"rounds": 50},
    "sigterm": {"rounds": 10, "short": 20, "long": 4},
    "rolling": {"jobs": 2000, "workers": 3, "rounds": 12, "round_s": 5.0},
    "pg_restart": {"restarts": 5},
    "listen_kill": {"kills": 20},
    "partition": {"seconds": 30.0},
    "poison": {"poison": 10, "normal": 1000},
    "hung": {"spin": 3, "block": 3, "force": 3, "normal": 30},
    "cancel_race": {"jobs": 2000},
    "pause": {"jobs": 2000},
    "sqlite_storm": {"jobs": 5000, "kills": 200, "workers": 4, "concurrency": 4, "ms": (50, 400)},
    "sqlite_sigterm": {"rounds": 10, "short": 20, "long": 4},
    "sqlite_cancel_race": {"jobs": 2000},
    "multihost": {"jobs": 2000, "concurrency": 4, "ms": (200, 800), "rounds": 5},
    "sqlite_multihost": {"jobs": 2000, "concurrency": 4, "ms": (200, 800), "rounds": 5},
    "mixed": _MIXED_FULL,
    "sqlite_mixed": {**_MIXED_FULL, "txn_hold": 0.5},
    "foreign_locks": _FOREIGN_FULL,
    "sqlite_foreign_locks": _FOREIGN_FULL,
    "failover": {"ms": (100, 600), "failovers": 3, "gap_s": 1.0, "warm_s": 10.0, "after_s": 10.0},
    "pgbouncer_restart": {
        "ms": (100, 600),
        "restarts": 10,
        "every_s": 4.0,
        "down_s": 1.0,
        "after_s": 5.0,
    },
    "hosts": {"keep": 24, "ms": (200, 800), "rounds": 3, "seconds": 15.0, "slow_s": 10.0},
    "durable": _DURABLE_FULL,
    "sqlite_durable": _DURABLE_FULL,
    "hooks": {"poison": 10, "normal": 1000, "fail": 0.3},
    "sqlite_hooks": {"poison": 10, "normal": 600, "fail": 0.3},
}

PROFILES = {"short": SHORT, "full": FULL}
