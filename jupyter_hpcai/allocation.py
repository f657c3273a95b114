"""The Slurm allocation a process runs in: job id, nodes, GPUs per node, tasks, time left."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from . import slurm


@dataclass(frozen=True)
class Allocation:
    """A Slurm job as seen from inside it."""

    job_id: str
    partition: str
    nodes: list[str]
    gpus_per_node: int
    cpus_per_node: int
    tasks: int
    gpus_here: list[str]  # CUDA_VISIBLE_DEVICES on this node, as Slurm set it
    end_time: dt.datetime | None  # None for jobs without a time limit

    @classmethod
    def current(cls, environ: Mapping[str, str] | None = None, *, query_end: bool = True) -> Allocation | None:
        """The allocation of this process, or None outside a Slurm job."""
        env = os.environ if environ is None else environ
        job_id = env.get("SLURM_JOB_ID")
        if not job_id:
            return None
        gpus_here = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
        return cls(
            job_id=job_id,
            partition=env.get("SLURM_JOB_PARTITION", ""),
            nodes=slurm.expand_hostlist(env.get("SLURM_JOB_NODELIST", env.get("SLURMD_NODENAME", ""))),
            gpus_per_node=_gpus_per_node(env, gpus_here),
            cpus_per_node=int(env.get("SLURM_CPUS_ON_NODE", "0") or 0),
            tasks=int(env.get("SLURM_NTASKS", "1") or 1),
            gpus_here=gpus_here,
            end_time=_end_time(job_id, env) if query_end else None,
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
        return data


def _gpus_per_node(env: Mapping[str, str], gpus_here: list[str]) -> int:
    for key in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        value = env.get(key, "").split(":")[-1]
        if value.isdigit():
            return int(value)
    return len(gpus_here)


def _end_time(job_id: str, env: Mapping[str, str]) -> dt.datetime | None:
    info = slurm.job_info(job_id, env)
    end = (info or {}).get("EndTime", "")
    try:
        return dt.datetime.fromisoformat(end)
    except ValueError:  # "Unknown", or no record
        return None
