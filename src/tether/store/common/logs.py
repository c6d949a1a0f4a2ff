"""A job's own log (:class:`~tether.store.protocols.JobLogStore`).

Lines are written in batches under their jobs' leases, like artifacts: the leases are
checked in the writing transaction (on PostgreSQL under a key-share lock, held to the
commit), so a zombie's lines are refused and a deleted job's lines are never left
behind. Nothing waits on a row lock: a job whose row someone else holds (a delete in
progress, an operator's lock) is skipped and reported ``busy``, and its writer tries
again later. The bounds are applied here, in the same
transaction: a job's first lines are kept up to ``max_lines`` lines and ``max_bytes``
bytes, and the rest are counted in one last row of level ``dropped``. Each write is
three statements however many jobs it carries (the leases, the logs' tallies, the
lines), plus one per job whose log overflows. One writer per job at a time (its
worker's logbook), so the seqs a batch takes are free.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from tether.errors import RowLocked
from tether.joblog import DROPPED, LogBatch, LogLine, LogsWritten, PendingLine
from tether.store.common.base import SqlBase
from tether.store.driver import Tx


class LogsSql(SqlBase):
    """The lines a job's handler wrote."""

    async def append_log_batches(
        self, batches: Sequence[LogBatch], *, max_lines: int, max_bytes: int
    ) -> LogsWritten:
        q = self.sql.logs
        batches = [b for b in batches if b.lines or b.dropped]
        if not batches:
            return LogsWritten()
        leases = {"ids": [b.job_id for b in batches], "tokens": [b.lease_token for b in batches]}

        async def body(tx: Tx) -> LogsWritten:
            held = {int(r["id"]): int(r["attempt"]) for r in await tx.all(q.FENCE, leases)}
            busy: frozenset[int] = frozenset()
            if len(held) < len(batches) and q.BUSY is not None:
                # Skipped rows: locked by someone else, or not ours any more.
                busy = frozenset(int(r["id"]) for r in await tx.all(q.BUSY, leases)) - set(held)
            if not held:
                return LogsWritten(busy=busy)
            tallies = {int(r["job_id"]): r for r in await tx.all(q.TALLY, {"ids": list(held)})}
            rows: list[tuple[Any, ...]] = []
            overflow = []
            for batch in batches:
                attempt = held.get(batch.job_id)
                if attempt is None:
                    continue
                tally = tallies.get(batch.job_id)
                count = int(tally["lines"]) if tally else 0
                size = int(tally["size"]) if tally else 0
                last = int(tally["last"]) if tally else 0
                marker = tally["marker"] if tally else None
                kept = 0
                if marker is None:  # once a log is full, every later line is dropped
                    for line in batch.lines:
                        if count >= max_lines or size + line.size > max_bytes:
                            break
                        kept += 1
                        count += 1
                        size += line.size
                        rows.append(
                            (batch.job_id, last + kept, attempt, line.at, line.level, line.message)
                        )
                lost = len(batch.lines) - kept + batch.dropped
                if lost:
                    overflow.append(
                        {
                            "id": batch.job_id,
                            "seq": int(marker) if marker is not None else last + kept + 1,
                            "attempt": attempt,
                            "at": batch.lines[-1].at if batch.lines else time.time(),
                            "count": lost,
                        }
                    )
            if rows:
                await tx.run(q.APPEND, self._line_params(rows))
            for params in overflow:
                await tx.run(q.DROPPED, params)
            return LogsWritten(frozenset(held), busy)

        # Bounded all the same: a line's key or a log's 'dropped' row may be held by
        # another session (a zombie's write in flight, an operator).
        return await self._transact_bounded(body)

    def _line_params(self, rows: list[tuple[Any, ...]]) -> dict[str, Any]:
        if self.sql.logs.LINE_ROWS:
            return {"rows": rows}
        columns = ("job_ids", "seqs", "attempts", "ats", "levels", "messages")
        values = zip(*rows, strict=True)
        return {name: list(column) for name, column in zip(columns, values, strict=True)}

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
        if not lines and not dropped:
            return await self._log_fence(job_id, lease_token)
        batch = LogBatch(job_id, lease_token, list(lines), dropped)
        done = await self.append_log_batches([batch], max_lines=max_lines, max_bytes=max_bytes)
        if job_id in done.busy:
            raise RowLocked(f"job {job_id}'s row is locked by another session; no line written")
        return job_id in done.taken

    async def _log_fence(self, job_id: int, lease_token: int) -> bool:
        async def body(tx: Tx) -> bool:
            params = {"ids": [job_id], "tokens": [lease_token]}
            return bool(await tx.all(self.sql.logs.BUSY or self.sql.logs.FENCE, params))

        return await self._query(body)

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
