"""The hub's view of its notebook jobs: one scheduler query per cycle serves every spawner's poll, start loop and
progress stream, and submissions go through a bounded queue.

``JobStates``: the jobs any spawner asked about recently are asked for in one ``squeue`` per ``interval``
(concurrent callers share the query in flight; a job submitted since waits for the next cycle's); a job the
query asked for and did not find is asked for on its own (``scheduler.job_info``) before anyone calls it gone;
a query that fails raises, which the spawner reads as UNKNOWN (the job is kept), never as gone. The
scheduler calls of the last minute are counted and logged once a minute.

``SubmitQueue``: at most ``limit`` submissions (``sbatch --test-only`` and ``sbatch``, each a sudo) at once; the
others wait in order and can say their place.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from ..scheduler import chosen

scheduler = chosen()

# the queries' own threads: a storm of forms, starts and checks on the default pool never delays the cycle's squeue;
# nor do the records asked for fresh (extend, a follow-up's wait) while the controller is slow
POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="hpcai-job-states")
FRESH_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="hpcai-job-fresh")
FORGET_AFTER = 300  # seconds: a job nobody asked about for this long leaves the query
LOG_EVERY = 60


class JobStates:
    """Slurm's record of the hub's jobs, one query per cycle for all of them."""

    def __init__(self) -> None:
        self._asked: dict[str, float] = {}  # job id -> when a spawner last asked (monotonic)
        self._snapshot: dict[str, dict[str, str]] = {}
        self._queried: set[str] = set()  # the jobs the snapshot's query asked for
        self._taken = float("-inf")  # when the snapshot was taken (monotonic)
        self._query: asyncio.Future[tuple[dict[str, dict[str, str]], set[str]]] | None = None
        self.calls: deque[float] = deque()  # when each scheduler call of the last minute was made
        self._logged = time.monotonic()

    async def info(self, job_id: str, interval: float, log: logging.Logger | None = None) -> dict[str, str] | None:
        """Slurm's record of ``job_id`` (None: Slurm no longer knows it) from this cycle's query; raises
        HPCAIError when Slurm did not answer."""
        now = time.monotonic()
        self._asked[job_id] = now
        if now - self._taken >= interval:
            await self._refresh()
        if job_id not in self._queried:  # new since the last query (just submitted): the next cycle's includes it
            await asyncio.sleep(max(0.0, self._taken + interval - time.monotonic()))
            if job_id not in self._queried:
                await self._refresh()
        if job_id in self._snapshot:
            found = self._snapshot[job_id]
        else:  # asked for, and missing: gone, or just out of squeue's sight; its own answer decides
            self._count()
            found = await asyncio.get_running_loop().run_in_executor(FRESH_POOL, scheduler.job_info, job_id)
        self._log(log)
        return found

    async def fresh(self, job_id: str) -> dict[str, str] | None:
        """Slurm's record of ``job_id`` now, asked for on its own (what a decision on a value the hub itself just
        changed needs: an extend's time limit); the cycle's snapshot takes it too."""
        self._count()
        found = await asyncio.get_running_loop().run_in_executor(FRESH_POOL, scheduler.job_info, job_id)
        if found is not None and job_id in self._snapshot:
            self._snapshot[job_id] = found
        return found

    async def _refresh(self) -> None:
        if self._query is None:  # the first caller of the cycle asks; the others wait for its answer
            self._query = asyncio.ensure_future(self._ask())
        query = self._query
        try:
            self._snapshot, self._queried = await asyncio.shield(query)
            self._taken = time.monotonic()
        finally:
            if self._query is query and query.done():
                self._query = None

    async def _ask(self) -> tuple[dict[str, dict[str, str]], set[str]]:
        """The cycle's squeue, for the jobs asked about by then (the task starts after the callers that are ready
        in this turn of the event loop, so a storm of polls joins one query)."""
        ids = [job for job, at in self._asked.items() if time.monotonic() - at < FORGET_AFTER]
        self._asked = {job: self._asked[job] for job in ids}
        self._count()
        return await asyncio.get_running_loop().run_in_executor(POOL, scheduler.jobs_info, ids), set(ids)

    def _count(self) -> None:
        self.calls.append(time.monotonic())

    def per_minute(self) -> int:
        """Scheduler calls in the last minute."""
        while self.calls and time.monotonic() - self.calls[0] > 60:
            self.calls.popleft()
        return len(self.calls)

    def _log(self, log: logging.Logger | None) -> None:
        if log is not None and time.monotonic() - self._logged >= LOG_EVERY:
            self._logged = time.monotonic()
            log.info("Slurm job states: %d scheduler calls in the last minute, for %d jobs", self.per_minute(),
                     len(self._asked))


class SubmitQueue:
    """At most ``limit`` submissions at once, the others waiting in the order they came."""

    def __init__(self) -> None:
        self._running = 0
        self._waiting: list[asyncio.Future[None]] = []

    def place(self, ticket: object) -> int:
        """How many requests wait before ``ticket`` (0: it is being submitted, or was)."""
        return next((i + 1 for i, f in enumerate(self._waiting) if getattr(f, "ticket", None) is ticket), 0)

    @asynccontextmanager
    async def slot(self, ticket: object, limit: int) -> AsyncIterator[None]:
        if self._running >= limit or self._waiting:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            turn.ticket = ticket  # type: ignore[attr-defined]
            self._waiting.append(turn)
            try:
                await turn
            except BaseException:
                if turn in self._waiting:
                    self._waiting.remove(turn)
                elif turn.done() and not turn.cancelled():
                    self._release()  # given the slot as it was cancelled: pass it on
                raise
        else:
            self._running += 1
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self._waiting:
            turn = self._waiting.pop(0)
            if not turn.done():
                turn.set_result(None)  # the slot passes on: _running stays
                return
        self._running -= 1

