"""More walltime for a running notebook job, through the hub: users cannot raise their own job's time limit in
Slurm, the hub (root) can, within the site's policy (``HPCSlurmSpawner.extend_max_walltime``).

``POST /hub/api/hpcai/extend {"seconds": N}`` with the notebook server's own token (the server extension and
``%hpc extend`` send it from the server's environment, in a header): the hub finds the spawner that token
belongs to, as batchspawner's own API does, and extends that spawner's job only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from jupyterhub.apihandlers import APIHandler, default_handlers
from tornado import web

from ..errors import HPCAIError
from ..replies import extend_seconds, refuse
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


def token_spawner(handler: APIHandler) -> Any:
    """The spawner of the request's user whose server's own token made the request, or None."""
    token = handler.get_auth_token()
    return next((s for s in handler.current_user.spawners.values() if s.api_token == token), None)


def own_spawner(handler: APIHandler) -> Any:
    """The notebook job whose server's own token made the request; 404 else."""
    spawner = token_spawner(handler)
    if spawner is None or not hasattr(spawner, "extend") or not getattr(spawner, "job_id", ""):
        raise web.HTTPError(404, "this token belongs to no running notebook job: send the server's own token")
    return spawner


class ExtendHandler(APIHandler):  # type: ignore[misc]
    """POST {"seconds": N}: extend the job of the server whose token authenticates the request."""

    @web.authenticated
    async def post(self) -> None:
        seconds = extend_seconds(self.get_json_body())
        spawner = own_spawner(self)
        try:
            granted = await spawner.extend(seconds)
        except HPCAIError as err:
            refuse(self, err)
            return
        self.finish(json.dumps(granted))


default_handlers.append((r"/api/hpcai/extend", ExtendHandler))
