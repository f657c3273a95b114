"""How a job ended, in words, with the advice that fits (from the scheduler's accounting: ``interface.JobEnd``).
The hub's page of a server that failed, ``hpcai logs`` and the panel's recent jobs all say it this way. Standard
library only."""

from __future__ import annotations

from .interface import JobEnd


def in_words(seconds: int) -> str:
    """``40 s``, ``12 min``, ``2 h 5 min``."""
    if seconds < 60:
        return f"{seconds} s"
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours} h {minutes} min" if hours and minutes else f"{hours} h" if hours else f"{minutes} min"


def _after(end: JobEnd) -> str:
    return f"after {in_words(end.elapsed)}" if end.elapsed else "within a second"


# state -> what happened ({job}, {after}, {nodes}, {code}) and what to do
SAID = {
    "TIMEOUT": "Job {job} reached its time limit {after}. Ask for a longer walltime, extend the job before it ends "
               "(%hpc extend), or save checkpoints at the walltime signal.",
    "NODE_FAIL": "Job {job}: a node of {nodes} failed {after}. Nothing of yours caused it; start again (a profile "
                 "with no_kill lets an elastic run go on with the nodes left).",
    "PREEMPTED": "Job {job} was preempted {after} by a job of higher priority. Start again, or use a QOS or "
                 "partition that is not preemptible.",
    "COMPLETED": "Job {job} ended normally {after}.",
    "FAILED": "Job {job} failed {after} with exit code {code}. Its log says why (hpcai logs).",
}


def explain(end: JobEnd) -> str:
    """One or two sentences: what happened to the job, and what to do about it."""
    after = _after(end)
    if end.state == "OUT_OF_MEMORY":
        asked = f" (asked for {end.requested_memory})" if end.requested_memory else ""
        peak = f"; its largest step used {end.peak_memory}" if end.peak_memory else ""
        where = f" on {end.failed_node or end.nodes}" if end.failed_node or end.nodes else ""
        return (f"Job {end.job_id} ran out of memory{where} {after}{asked}{peak}. Ask for more memory (a profile "
                "with more, or --mem), or use less per rank (a smaller batch).")
    if end.state == "CANCELLED":
        who = end.cancelled_by
        by = "by you" if who and who == end.owner else f"by {who} (an admin)" if who else "by someone"
        return f"Job {end.job_id} was cancelled {by} {after}."
    code, _, signal = end.exit_code.partition(":")
    if end.state == "FAILED" and signal not in ("", "0"):
        return f"Job {end.job_id} was killed by signal {signal} {after}. Its log says why (hpcai logs)."
    said = SAID.get(end.state, "Job {job} ended {after}: " + end.state.lower().replace("_", " ") + ".")
    return said.format(job=end.job_id, after=after, nodes=end.nodes, code=code)
