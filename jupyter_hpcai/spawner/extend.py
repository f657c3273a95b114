"""The site's policy for more walltime on a running notebook job (runs in the hub): users cannot raise their own
job's time limit in Slurm, the hub (root) can, within ``HPCSlurmSpawner.extend_max_walltime``. The request comes
through hub_api.py; ``HPCSlurmSpawner.extend`` applies it.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import HPCAIError
from ..scheduler.durations import format_duration, parse_duration


def allowed(policy: Mapping[str, str], partition: str) -> int:
    """The longest walltime ``policy`` (partition, or ``*``, -> HH:MM:SS) lets a job on ``partition`` be extended to,
    in seconds; or the error that says why not (no question to Slurm needed)."""
    ceiling = policy.get(partition, policy.get("*"))
    if not ceiling:
        raise HPCAIError(f"this site does not extend notebook jobs on partition {partition}",
                         "save your work (%hpc checkpoint) and start a new server, or %hpc continue")
    seconds = parse_duration(str(ceiling))
    if seconds is None:
        raise HPCAIError(f"the site's extend policy for {partition} is not a walltime: {ceiling!r}",
                         "tell the hub's admin: HPCSlurmSpawner.extend_max_walltime takes HH:MM:SS per partition")
    return seconds


def new_limit(policy: Mapping[str, str], partition: str, limit: int, add: int, scheduler_max: int | None) -> int:
    """The job's new time limit in seconds, or an error that says why not. ``policy``: partition (or ``*``)
    -> the longest walltime a notebook job may be extended to; ``scheduler_max``: the partition's own limit
    (with the admin's ``limits``), which the policy never exceeds."""
    ceiling = allowed(policy, partition)
    if scheduler_max:
        ceiling = min(ceiling, scheduler_max)
    wanted = limit + add
    if wanted > ceiling:
        room = ceiling - limit
        raise HPCAIError(f"the job's walltime would be {format_duration(wanted)}, over {format_duration(ceiling)}, the "
                         f"most this site allows on {partition}",
                         f"ask for at most {format_duration(room)} more" if room >= 60 else
                         "the job is at its longest: save your work (%hpc checkpoint) and %hpc continue")
    return wanted
