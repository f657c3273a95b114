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
from ..jobscript import JobScript
from ..proc import run
from .build import BuildRequest
from .store import EnvStore


@dataclass(frozen=True)
class BuildJob:
    job_id: int
    log: Path


def submit(request: BuildRequest, store: EnvStore, partition: str) -> BuildJob:
    """Submit the build job (one node); its output goes to the env's private log folder."""
    recipe = request.recipe()
    env = store.env(request.name or recipe.name, site=request.site)
    env.require_writable("build")
    gpus = recipe.build.gpus if request.gpus is None else request.gpus
    time_limit = request.time_limit or recipe.build.time
    logs = env.dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    logs.chmod(0o700)
    cmd = [sys.executable, "-m", "jupyter_hpcai.cli", "env", "build", str(request.recipe_path.absolute()), "--name",
           env.name, *request.job_args()]
    job = JobScript(name=f"hpcai-build-{env.name}", nodes=1, time=time_limit, partition=partition,
                    account=request.account or None, output=f"{logs}/job-%j.out",
                    extra=("--ntasks=1", *([f"--gpus={gpus}"] if gpus else [])),
                    body=f"export PYTHONUNBUFFERED=1 COLUMNS=160\nexec {shlex.join(cmd)}\n").submit()
    return BuildJob(job, logs / f"job-{job}.out")


def follow(job: BuildJob, on_line: Callable[[str], None]) -> int:
    """Stream the build job's output to ``on_line`` until it ends; its exit status."""
    return slurm.follow_output(job.job_id, job.log, on_line)


def cancel(job: BuildJob) -> None:
    run(["scancel", str(job.job_id)], timeout=30)
