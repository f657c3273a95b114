"""A user's notebook job logs (``hpcai logs``; runs as the user): the log of their latest server job, or of one
job, printed whole or followed while the job runs. The hub's jobs write them to ``HPCSlurmSpawner.job_log_dir``,
by default ``~/.hpcai/logs/jupyterhub-JOBID.log``, private to the user and deleted after a few weeks."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from . import slurm
from .errors import HPCAIError

DEFAULT_DIR = Path("~/.hpcai/logs")
PATTERN = "jupyterhub-*.log"
LIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "REQUEUED")


def find(folder: Path, job: str | None = None) -> Path:
    """The log of ``job`` (Slurm's own path for it while Slurm knows the job, else in ``folder``), or the newest
    log in ``folder``."""
    folder = folder.expanduser()
    if job is not None:
        if not job.isdigit():
            raise HPCAIError(f"{job!r} is not a Slurm job id", "give the number squeue shows, or no job for the latest")
        path = Path((slurm.job_info(job) or {}).get("StdOut") or folder / f"jupyterhub-{job}.log")
        if not path.is_file():
            raise HPCAIError(f"no log of job {job}: {path} is not there",
                             f"see the logs in {folder} (hpcai logs with no job: the latest)")
        return path
    logs = sorted((p for p in folder.glob(PATTERN) if p.is_file() and not p.is_symlink()),
                  key=lambda p: p.lstat().st_mtime)
    if not logs:
        raise HPCAIError(f"no notebook job log in {folder}",
                         "start a server from the hub first; a site may keep them elsewhere: --dir FOLDER")
    return logs[-1]


def job_of(path: Path) -> str:
    """The job id in a log's name (jupyterhub-JOBID.log)."""
    return path.stem.removeprefix("jupyterhub-")


def follow(path: Path, write: Callable[[str], None], interval: float = 0.5) -> None:
    """Write the log, then what the job adds to it, until the job ends (or Slurm no longer knows it)."""
    with open(path, errors="replace") as log:
        while True:
            running = (slurm.job_info(job_of(path)) or {}).get("JobState") in LIVE_STATES
            if text := log.read():
                write(text)
            if not running:
                return
            time.sleep(interval)
