"""What a job's state means to the person waiting for it, and one start's events for every page that watches it."""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import AsyncIterator
from typing import Any

from ..errors import HPCAIError
from ..scheduler import chosen
from ..scheduler.ends import explain
from ..scheduler.interface import TERMINAL_STATES, JobEnd
from .as_user import command_env, run_as_user

scheduler = chosen()

LOG_TAIL_BYTES = 8192  # of a failed job's log, shown on the spawn page

# squeue's pending reasons, said plainly (the scheduler's word stays in brackets).
REASONS = {
    "Resources": "waiting for resources: the nodes or GPUs asked for are busy",
    "Priority": "waiting behind jobs with higher priority",
    "Dependency": "waiting for another job it depends on",
    "QOSMaxGRESPerUser": "you are at your GPU limit for this QOS; it starts when one of your jobs ends",
    "QOSMaxJobsPerUserLimit": "you are at your limit of running jobs for this QOS",
    "AssocGrpGRES": "your account is at its GPU limit",
    "AssocGrpGRESMinutes": "your project's GPU hours are used up (sshare shows them); ask for more, or use another"
                           " account",
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


class StartProgress:
    """A mixin of HPCSlurmSpawner: what a start says, on its spawn pages (``progress``) and when it fails
    (``_failure_report``, with the job log's last lines read as its user)."""

    _feed: Feed | None = None  # this start's spawn-page events, made once for every stream that reads them
    _report: tuple[str, asyncio.Future[str]] | None = None  # (job id, its failure report), made once per job

    async def progress(self) -> Any:
        """Spawn-page events: job id, state, the scheduler's pending reason and expected start. One watcher per start
        makes them (progress.Feed), however many pages read them: N streams cost the hub and Slurm what one does."""
        if self._feed is None or self._feed.owner is not self._spawn_future:
            self._feed = Feed(self._progress_events(), self._spawn_future)
        async for event in self._feed.read():
            yield event

    async def _progress_events(self) -> Any:
        """This start's events, each once, while it is pending (JupyterHub stops reading once the server is up)."""
        last = ""
        while self._spawn_pending:
            place = self.queries.place(self)
            if not self.job_id and place:
                message, pct = (f"Waiting to submit: number {place} in the hub's queue (it submits "
                                f"{self.max_concurrent_submits} requests at a time)"), 2
            elif not self.job_id:
                message, pct = "Checking the request with the scheduler and submitting the job...", 5
            else:
                try:
                    info = await self._job_info() or {}
                except HPCAIError:  # Slurm did not answer this time: say nothing new
                    await asyncio.sleep(1)
                    continue
                state = info.get("JobState", "")
                if state == "PENDING":
                    message, pct = pending_message(self.job_id, info.get("Reason", ""), info.get("StartTime", "")), 30
                    if self._held_seen is not None and self.held_start_timeout:  # said every 10 s, not every second
                        left = self.held_start_timeout - self._held_for
                        message += (f"; the hub cancels it in about {max(0, round(left, -1)):.0f} s unless it is "
                                    "released")
                elif state in ("RUNNING", "CONFIGURING"):
                    message, pct = (f"Job {self.job_id} is running on {info.get('NodeList', '?')}; "
                                    "waiting for the Jupyter server to start"), 70
                elif state and state not in TERMINAL_STATES:  # SUSPENDED, REQUEUED, STOPPED...: it may go on
                    message, pct = f"Job {self.job_id} is {state.lower()}", 50
                else:
                    yield {"progress": 100, "failed": True, "message": await self._failure_report("is not running")}
                    return
            if message != last:
                yield {"progress": pct, "message": message}
                last = message
            await asyncio.sleep(1)

    async def _failure_report(self, what: str) -> str:
        """What became of this start's job, with the last lines of its log: made once per job, however many ask
        (the start, and every spawn page watching it)."""
        if self._report is None or self._report[0] != self.job_id:
            self._report = (self.job_id, asyncio.ensure_future(self._report_on(what)))
        return await asyncio.shield(self._report[1])

    async def _report_on(self, what: str) -> str:
        info = await self._job_info() or {}
        state, reason, code = info.get("JobState", "gone"), info.get("Reason", ""), info.get("ExitCode", "")
        lines = [f"Job {self.job_id} {what}: state {state}" + (f", reason {reason}" if reason not in ("", "None") else "")
                 + (f", exit code {code}" if code else "")]
        if state == "gone" or state in TERMINAL_STATES:  # the accounting says how it ended, where the site keeps it
            end = await asyncio.to_thread(self._job_end)
            lines += [explain(end)] if end else []
        if info.get("StdOut"):
            tail = await self._log_tail(info["StdOut"])
            # indented: in the hub's log, where this report lands too, no line the user wrote looks like the hub's own
            lines += [f"Last lines of {info['StdOut']}:", *(f"  | {line}" for line in tail)] if tail else []
        return "\n".join(lines)

    def _job_end(self) -> JobEnd | None:
        """How the job ended, where the accounting says so of this user's job (never another user's job of a reused
        id)."""
        try:
            end = scheduler.job_end(self.job_id)
        except HPCAIError as err:
            self.log.warning("%s: how job %s ended could not be read: %s", self._log_name, self.job_id, err)
            return None
        return end if end and end.owner == self.user.name else None

    async def _log_tail(self, path: str, lines: int = 15) -> list[str]:
        """The last lines of the job's log, read as the job's user: the path is in their home, so they decide what
        it is (a link to a root-only file, a FIFO, a huge file), and the hub never opens it with its own rights.
        At most LOG_TAIL_BYTES, within a few seconds, off the event loop; nothing when the user cannot read it."""
        argv = [*shlex.split(self.exec_prefix.format(username=self.user.name)),
                "timeout", "5", "tail", "-c", str(LOG_TAIL_BYTES), "--", path]
        code, out, _ = await run_as_user(argv, command_env(), None, 10, self.job_umask)
        if code != 0:
            return []
        text = out.decode(errors="replace")
        return ["".join(c for c in line if c.isprintable() or c == "\t") for line in text.splitlines()[-lines:]]
