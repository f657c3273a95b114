"""Every difference between the Slurm versions this project supports (22.05, the oldest, to 24.11, the newest
tested), in one place. Where the same words work on every version they are used everywhere, and the version is
read only where no such words exist (``version``, read once per process). Standard library only: ranks import it.

- srun reads ``SRUN_CPUS_PER_TASK`` in 22.05 to 23.02 and ``SLURM_CPUS_PER_TASK`` from 23.11: a step names its
  CPUs per task itself (``cpus_per_task``), which every version reads.
- ``SLURM_JOB_END_TIME`` exists from 23.02: a job's end is read from it where Slurm sets it (``job_end_time``),
  from the scheduler's record elsewhere.
- squeue's StdOut expands ``%j`` and ``%u`` up to 23.11, not from 24.05: the record's path is expanded here
  (``expand_output``), which leaves an expanded path as it is.
- 26.05 refuses ``--gres=gpu:N`` beside ``--gpus-per-node``: no job script asks for both (``gpu_options``).
- cgroup v2 is the default, and v1 deprecated from 25.05: the dev cluster's cgroup.conf says ``autodetect``.
- 24.11's slurmctld looks up the name of every peer that connects, and (24.11.5) accepts no other connection
  meanwhile: a login or hub address that DNS cannot name quickly delays every command (the dev cluster names its
  addresses in /etc/hosts).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from functools import cache

from ...errors import HPCAIError

CONFIG = "SLURM_CONF"
CPUS_PER_TASK = "SLURM_CPUS_PER_TASK"
END_TIME = "SLURM_JOB_END_TIME"  # epoch seconds, from 23.02


def version(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(major, minor) of the Slurm client on ``env``'s PATH, e.g. (24, 11): read once per process, PATH and config."""
    env = os.environ if env is None else env
    return _version(env.get("PATH", ""), env.get(CONFIG, ""))


@cache
def _version(path: str, conf: str) -> tuple[int, int]:
    try:
        out = subprocess.run(["sinfo", "--version"], capture_output=True, text=True, timeout=30,
                             env={**os.environ, "PATH": path, **({CONFIG: conf} if conf else {})}).stdout
    except (OSError, subprocess.TimeoutExpired) as err:
        raise HPCAIError(f"could not read Slurm's version (sinfo --version): {err}", "check that Slurm's client "
                         "commands are on PATH") from None
    found = re.search(r"(\d+)\.(\d+)", out)
    if not found:
        raise HPCAIError(f"sinfo --version said {out.strip()[:80]!r}, not a version", "check the Slurm client")
    return int(found.group(1)), int(found.group(2))


def cpus_per_task(env: Mapping[str, str]) -> list[str]:
    """srun's option for the CPUs each task of a step gets: the job's own (every version reads the option; srun
    stopped reading the job's variable in 22.05 and read it again from 23.11)."""
    value = env.get(CPUS_PER_TASK, "")
    return [f"--cpus-per-task={value}"] if value.isdigit() and int(value) > 1 else []


def cpus_per_task_in_shell() -> str:
    """The same, as a batch script's shell words."""
    return f"${{{CPUS_PER_TASK}:+--cpus-per-task=${CPUS_PER_TASK}}}"


def job_end_time(env: Mapping[str, str]) -> float | None:
    """When the job reaches its time limit as Slurm set it at the job's start (epoch seconds), from 23.02; None
    before (or for a job without a limit)."""
    value = env.get(END_TIME, "")
    return float(value) if value.isdigit() and int(value) > 0 else None


def expand_output(path: str, job_id: str, user: str) -> str:
    """squeue's StdOut with the patterns 24.05 and later leave as they are expanded (``%j``, ``%u``)."""
    return path.replace("%j", job_id).replace("%u", user)


def gpu_options(options: Sequence[str]) -> None:
    """Refuse options that ask for GPUs twice: ``--gres=gpu...`` beside ``--gpus-per-node`` (26.05 refuses it)."""
    gres = [o for o in options if re.match(r"--gres=(.*,)?gpu", o)]
    if gres and any(o.startswith("--gpus-per-node") for o in options):
        raise HPCAIError(f"{gres[0]} beside --gpus-per-node: Slurm 26.05 refuses a job that asks for GPUs both ways",
                         "ask for GPUs per node only (the profile's gpus_per_node); leave --gres=gpu out")
