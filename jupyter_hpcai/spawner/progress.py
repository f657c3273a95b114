"""What a job's state means to the person waiting for it, and one start's events for every page that watches it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

# squeue's pending reasons, said plainly (the scheduler's word stays in brackets).
REASONS = {
    "Resources": "waiting for resources: the nodes or GPUs asked for are busy",
    "Priority": "waiting behind jobs with higher priority",
    "Dependency": "waiting for another job it depends on",
    "QOSMaxGRESPerUser": "you are at your GPU limit for this QOS; it starts when one of your jobs ends",
    "QOSMaxJobsPerUserLimit": "you are at your limit of running jobs for this QOS",
    "AssocGrpGRES": "your account is at its GPU limit",
    "ReqNodeNotAvail": "a node it needs is unavailable (down, drained or reserved)",
    "PartitionNodeLimit": "more nodes than the partition allows",
    "PartitionTimeLimit": "longer than the partition allows",
    "BeginTime": "waiting for its start time",
    "JobHeldUser": "held by you (scontrol release JOBID lets it start)",
    "JobHeldAdmin": "held by an admin",
    "None": "being scheduled",
}


def pending_message(job_id: str, reason: str, start: str) -> str:
    """One line for the spawn page: job id, why it waits, when it is expected to start."""
    said = REASONS.get(reason, reason or "pending")
    when = f"; expected start {start.replace('T', ' ')}" if start and start not in ("N/A", "Unknown") else ""
    return f"Job {job_id} is pending: {said} [{reason}]{when}"


class Feed:
    """One start's spawn-page events: made by one producer, read by every stream that watches the start (each from
    the first event kept), so that a user's hundred open spawn pages cost the hub one watcher, and Slurm nothing
    more. ``owner`` names the start (JupyterHub's spawn future)."""

    KEEP = 50  # the latest events a page that opens later is shown (a follow-up may wait for hours)

    def __init__(self, events: AsyncIterator[dict[str, Any]], owner: object) -> None:
        self.owner = owner
        self._events: list[dict[str, Any]] = []
        self._dropped = 0  # events made before the first kept one
        self._ended = False
        self._changed = asyncio.Condition()
        self._task = asyncio.ensure_future(self._make(events))

    async def _make(self, events: AsyncIterator[dict[str, Any]]) -> None:
        try:
            async for event in events:
                async with self._changed:
                    self._events.append(event)
                    if len(self._events) > self.KEEP:
                        del self._events[0]
                        self._dropped += 1
                    self._changed.notify_all()
        finally:
            async with self._changed:
                self._ended = True
                self._changed.notify_all()

    async def read(self) -> AsyncIterator[dict[str, Any]]:
        """Every event kept, from the first, then each as it comes; until the producer ends. (A reader slower than
        KEEP events skips what was dropped meanwhile.)"""
        seen = 0  # events made before the next one to read
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda: self._dropped + len(self._events) > seen or self._ended)
                new, ended = self._events[max(0, seen - self._dropped):], self._ended
                seen = self._dropped + len(self._events)
            for event in new:
                yield event
            if ended:
                return
