"""A user's notebook job logs (``hpcai logs``; runs as the user): the log of their latest server job, or of one
job, printed whole or followed while the job runs. The hub's jobs write them to ``HPCSlurmSpawner.job_log_dir``,
by default ``~/.hpcai/logs/jupyterhub-JOBID.log``, private to the user and deleted after a few weeks."""

from __future__ import annotations

import getpass
import re
import time
from collections.abc import Callable
from pathlib import Path

from .errors import HPCAIError
from .scheduler import chosen
from .scheduler.ends import explain
from .scheduler.interface import TERMINAL_STATES

scheduler = chosen()

DEFAULT_DIR = Path("~/.hpcai/logs")
NAME = re.compile(r"jupyterhub-(\d+)\.log")


def find(folder: Path, job: str | None = None) -> Path:
    """The log of ``job`` (Slurm's own path for it while Slurm knows the job, else in ``folder``), or the newest
    log in ``folder``."""
    folder = folder.expanduser()
    if job is not None:
        if not job.isdigit():
            raise HPCAIError(f"{job!r} is not a Slurm job id", "give the number squeue shows, or no job for the latest")
        info = scheduler.job_info(job) or {}
        if info and info["UserName"] != getpass.getuser():  # its log path is that user's to choose
            raise HPCAIError(f"job {job} is {info['UserName']}'s", f"read it as that user: sudo -u {info['UserName']} "
                                                                  f"hpcai logs {job}")
        path = Path(info.get("StdOut") or folder / f"jupyterhub-{job}.log")
        if not path.is_file():
            raise HPCAIError(f"no log of job {job}: {path} is not there",
                             f"see the logs in {folder} (hpcai logs with no job: the latest)")
        return path
    logs = sorted((p for p in folder.glob("jupyterhub-*.log") if NAME.fullmatch(p.name) and p.is_file()
                   and not p.is_symlink()), key=lambda p: p.lstat().st_mtime)
    if not logs:
        raise HPCAIError(f"no notebook job log in {folder}",
                         "start a server from the hub first; a site may keep them elsewhere: --dir FOLDER")
    return logs[-1]


def job_of(path: Path) -> str:
    """The job id in a log's name (jupyterhub-JOBID.log)."""
    found = NAME.fullmatch(path.name)
    if not found:
        raise HPCAIError(f"{path.name} is not a notebook job's log (jupyterhub-JOBID.log)", "name the job: hpcai logs JOB")
    return found[1]


def ending(path: Path) -> str | None:
    """How the log's job ended, in words (the scheduler's accounting), once it has left the queue; None while it
    runs, where the site keeps no accounting, or for a log not named after its job."""
    found = NAME.fullmatch(path.name)
    if not found or ((scheduler.job_info(found[1]) or {}).get("JobState") or "COMPLETED") not in TERMINAL_STATES:
        return None
    try:
        end = scheduler.job_end(found[1])
    except HPCAIError:
        return None
    return explain(end) if end else None


def follow(path: Path, write: Callable[[str], None], interval: float = 0.5) -> None:
    """Write the log, then what the job adds to it, until the job ends (or Slurm no longer knows it)."""
    with open(path, errors="replace") as log:
        while True:
            state = (scheduler.job_info(job_of(path)) or {}).get("JobState")
            running = bool(state) and state not in TERMINAL_STATES
            if text := log.read():
                write(text)
            if not running:
                return
            time.sleep(interval)
