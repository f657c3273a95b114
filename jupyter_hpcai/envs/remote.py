"""Build an env as a Slurm job on the partition whose nodes will use it (GPUs, drivers, CUDA, NCCL).

The job runs the same `hpcai env build` on a compute node; this side follows its output file line
by line until the job ends and returns the build's exit status. Cancelling the job makes the build
in it stop the way Ctrl-C does: the previous env stays current.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import slurm
from ..errors import HPCAIError
from .store import Env


@dataclass(frozen=True)
class BuildJob:
    job_id: int
    log: Path


def submit(recipe: Path, env: Env, *, partition: str, gpus: int = 0, time_limit: str = "02:00:00",
           account: str | None = None, extra_args: tuple[str, ...] = ()) -> BuildJob:
    """Submit the build job (one node); its output goes to the env's private log folder."""
    logs = env.dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    logs.chmod(0o700)
    cmd = [sys.executable, "-m", "jupyter_hpcai.cli", "env", "build", str(recipe.absolute()), "--name", env.name,
           *extra_args]
    lines = ["#!/bin/bash", f"#SBATCH --job-name=hpcai-build-{env.name}", "#SBATCH --nodes=1", "#SBATCH --ntasks=1",
             f"#SBATCH --partition={partition}", f"#SBATCH --time={time_limit}", f"#SBATCH --output={logs}/job-%j.out"]
    lines += [f"#SBATCH --gpus={gpus}"] * bool(gpus) + [f"#SBATCH --account={account}"] * bool(account)
    lines += ["export PYTHONUNBUFFERED=1 COLUMNS=160", f"exec {shlex.join(cmd)}", ""]
    for value in (partition, time_limit, account or ""):
        if any(c.isspace() for c in value):
            raise HPCAIError(f"bad build job option {value!r}: no spaces or newlines", "e.g. --on-partition gpu")
    job = slurm.sbatch([], script="\n".join(lines))
    return BuildJob(job, logs / f"job-{job}.out")


def follow(job: BuildJob, on_line: Callable[[str], None]) -> int:
    """Stream the build job's output to ``on_line`` until it ends; its exit status."""
    return slurm.follow_output(job.job_id, job.log, on_line)


def cancel(job: BuildJob) -> None:
    from ..proc import run

    run(["scancel", str(job.job_id)], timeout=30)
