"""A job's own log (:class:`~tether.store.protocols.JobLogStore`).

Lines are written in batches under the job's lease, like an artifact: the lease is
checked in the writing transaction (on PostgreSQL under a key-share lock that waits,
bounded, only for a delete of the job's row), so a zombie's lines are refused and a
deleted job's lines are never left behind. The bounds are applied here, in the same
transaction: the job's first lines are kept up to ``max_lines`` lines and
``max_bytes`` bytes, and the rest are counted in one last row of level ``dropped``.
One writer per job at a time (its worker's log service), so the seqs a batch takes
are free.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from tether.joblog import DROPPED, LogLine, PendingLine
from tether.store.common.base import SqlBase
from tether.store.driver import Tx


class LogsSql(SqlBase):
    """The lines a job's handler wrote."""

    async def append_logs(
        self,
        job_id: int,
        lease_token: int,
        lines: Sequence[PendingLine],
        *,
        max_lines: int,
        max_bytes: int,
        dropped: int = 0,
    ) -> bool:
        q = self.sql.logs

        async def body(tx: Tx) -> bool:
            held = await tx.one(q.FENCE, {"id": job_id, "token": lease_token})
            if held is None:
                return False
            if not lines and not dropped:
                return True
            tally = await tx.one(q.TALLY, {"id": job_id})
            assert tally is not None
            count, size, last = int(tally["lines"]), int(tally["size"]), int(tally["last"])
            marker = tally["marker"]
            kept: list[PendingLine] = []
            if marker is None:  # once the log is full, every later line is dropped
                for line in lines:
                    if count >= max_lines or size + line.size > max_bytes:
                        break
                    kept.append(line)
                    count += 1
                    size += line.size
            attempt = int(held["attempt"])
            params: dict[str, Any] = {"id": job_id, "attempt": attempt}
            if kept:
                await tx.run(
                    q.APPEND,
                    params
                    | {
                        "seqs": list(range(last + 1, last + 1 + len(kept))),
                        "ats": [line.at for line in kept],
                        "levels": [line.level for line in kept],
                        "messages": [line.message for line in kept],
                    },
                )
            lost = len(lines) - len(kept) + dropped
            if lost:
                seq = int(marker) if marker is not None else last + len(kept) + 1
                at = lines[-1].at if lines else time.time()
                await tx.run(q.DROPPED, params | {"seq": seq, "at": at, "count": lost})
            return True

        return await self._transact_bounded(body)

    async def logs(self, job_id: int, *, after: int = 0, limit: int = 1000) -> list[LogLine]:
        async def body(tx: Tx) -> list[LogLine]:
            params = {"id": job_id, "after": max(0, after), "limit": max(0, limit)}
            rows = await tx.all(self.sql.logs.LINES, params)
            return [self._line(r) for r in rows]

        return await self._query(body)

    def _line(self, row: Any) -> LogLine:
        at = self._rows.time(row["at"])
        assert at is not None
        level, message = row["level"], row["message"]
        dropped = 0
        if level == DROPPED:
            dropped = int(message)
            message = f"{dropped} more line(s) dropped: the job's log is full"
        return LogLine(
            job_id=int(row["job_id"]),
            seq=int(row["seq"]),
            attempt=int(row["attempt"]),
            at=at,
            level=level,
            message=message,
            dropped=dropped,
        )
