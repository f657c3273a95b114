"""What a job's state means to the person waiting for it."""

from __future__ import annotations

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
    "None": "being scheduled",
}


def pending_message(job_id: str, reason: str, start: str) -> str:
    """One line for the spawn page: job id, why it waits, when it is expected to start."""
    said = REASONS.get(reason, reason or "pending")
    when = f"; expected start {start.replace('T', ' ')}" if start and start not in ("N/A", "Unknown") else ""
    return f"Job {job_id} is pending: {said} [{reason}]{when}"
