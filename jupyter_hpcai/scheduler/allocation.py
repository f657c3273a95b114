"""The allocation a process runs in: job id, nodes, GPUs per node, tasks, time left."""

from __future__ import annotations

import datetime as dt
import getpass
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import HPCAIError
from . import chosen

JOB_STATE_VAR = "HPCAI_JOB_STATE"  # the notebook job's private folder; its batch script makes it (spawner/script.py)
WARNING_VAR = "HPCAI_WALLTIME_WARNING"  # seconds before the walltime at which the scheduler signals the job
SIGNAL_MARK = "walltime"  # the file the batch shell writes when the scheduler's signal comes: the time it came


@dataclass(frozen=True)
class Allocation:
    """A job as seen from inside it."""

    job_id: str
    partition: str
    nodes: list[str]
    gpus_per_node: int
    cpus_per_node: int
    tasks: int
    gpus_here: list[str]  # CUDA_VISIBLE_DEVICES on this node, as the scheduler set it
    end_time: dt.datetime | None  # None for jobs without a time limit

    @classmethod
    def current(cls, environ: Mapping[str, str] | None = None, *, query_end: bool = True) -> Allocation | None:
        """The allocation of this process, or None outside a job."""
        env = os.environ if environ is None else environ
        scheduler = chosen()
        environment = scheduler.environment
        job_id = environment.job_id(env)
        if not job_id:
            return None
        gpus_here = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
        return cls(
            job_id=job_id,
            partition=env.get(environment.PARTITION, ""),
            nodes=scheduler.expand_hostlist(env.get(environment.NODES[0], env.get(environment.NODE_NAME, ""))),
            gpus_per_node=_gpus_per_node(env, gpus_here),
            cpus_per_node=int(env.get(environment.CPUS_ON_NODE, "0") or 0),
            tasks=int(env.get(environment.TASKS, "1") or 1),
            gpus_here=gpus_here,
            end_time=end_time(job_id, env) if query_end else None,
        )

    def seconds_left(self, now: dt.datetime | None = None) -> float | None:
        """Walltime left, or None without a time limit."""
        if self.end_time is None:
            return None
        return max(0.0, (self.end_time - (now or dt.datetime.now())).total_seconds())

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * len(self.nodes)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["end_time"] = self.end_time.isoformat() if self.end_time else None
        data["seconds_left"] = self.seconds_left()
        data["walltime_signal"], data["walltime_warning"] = walltime_signal(), walltime_warning()
        return data


def _gpus_per_node(env: Mapping[str, str], gpus_here: list[str]) -> int:
    found = chosen().environment.gpus_on_node(env)
    return len(gpus_here) if found is None else found


def end_time(job_id: str, env: Mapping[str, str] | None = None) -> dt.datetime | None:
    """When job ``job_id`` reaches its time limit, or None (no limit, or no record)."""
    info = chosen().job_info(job_id, env)
    end = (info or {}).get("EndTime", "")
    try:
        return dt.datetime.fromisoformat(end)
    except ValueError:  # "Unknown", or no record
        return None


def walltime_signal(environ: Mapping[str, str] | None = None) -> float | None:
    """When the scheduler's walltime signal reached this job (its batch shell wrote the time down), or None: not yet,
    or not a notebook job that asked for one."""
    folder = (os.environ if environ is None else environ).get(JOB_STATE_VAR)
    if not folder:
        return None
    try:
        return float((Path(folder) / SIGNAL_MARK).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


BUDGET_KEPT_FOR = 300.0  # seconds a process keeps its job's project budget: read once per panel's few minutes, not per poll
_budget: tuple[float, dict[str, Any] | None] | None = None  # (when read, what was read)


def project_budget(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The GPU budget of the project this job runs under, {"account", "gpu_hours", "gpu_hours_left"}, or None (no
    job, no accounting, no budget on its account, or the accounting did not answer). Read at most once per
    BUDGET_KEPT_FOR seconds in a process."""
    global _budget
    if _budget is not None and time.monotonic() - _budget[0] < BUDGET_KEPT_FOR:
        return _budget[1]
    env = os.environ if environ is None else environ
    account = env.get(chosen().environment.ACCOUNT, "")
    try:
        found = chosen().associations(getpass.getuser(), env) if account else None
    except HPCAIError:
        found = None
    project = found.account(account) if found else None
    said = None if project is None or project.gpu_hours_left is None else {
        "account": account, "gpu_hours": (project.gpu_minutes or 0) / 60, "gpu_hours_left": project.gpu_hours_left}
    _budget = (time.monotonic(), said)
    return said


def walltime_end(signal: float, environ: Mapping[str, str] | None = None) -> float:
    """When the job reaches its walltime (epoch seconds), its signal having come at ``signal``: the signal comes
    ``walltime_warning`` seconds before it, and never before the end the scheduler gave the job at its start (an
    extended job is signalled again before its new end). No query."""
    env = os.environ if environ is None else environ
    return max(signal + walltime_warning(env), chosen().environment.end_time(env) or 0.0)


def walltime_warning(environ: Mapping[str, str] | None = None) -> int:
    """Seconds before the walltime at which the job is signalled (0: it is not)."""
    value = (os.environ if environ is None else environ).get(WARNING_VAR, "")
    return int(value) if value.isdigit() else 0
