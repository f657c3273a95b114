"""The site's policy for more walltime on a running notebook job (runs in the hub): users cannot raise their own
job's time limit in Slurm, the hub (root) can, within ``HPCSlurmSpawner.extend_max_walltime``. The request comes
through hub_api.py; ``HPCSlurmSpawner.extend`` applies it.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import HPCAIError
from ..slurm import format_duration, parse_duration


def new_limit(policy: Mapping[str, str], partition: str, limit: int, add: int, scheduler_max: int | None) -> int:
    """The job's new time limit in seconds, or an error that says why not. ``policy``: partition (or ``*``)
    -> the longest walltime a notebook job may be extended to; ``scheduler_max``: the partition's own limit
    (with the admin's ``limits``), which the policy never exceeds."""
    allowed = policy.get(partition, policy.get("*"))
    if not allowed:
        raise HPCAIError(f"this site does not extend notebook jobs on partition {partition}",
                         "save your work (%hpc checkpoint) and start a new server, or %hpc continue")
    ceiling = parse_duration(str(allowed))
    if ceiling is None:
        raise HPCAIError(f"the site's extend policy for {partition} is not a walltime: {allowed!r}",
                         "tell the hub's admin: HPCSlurmSpawner.extend_max_walltime takes HH:MM:SS per partition")
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
