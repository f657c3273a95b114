"""A follow-up notebook job, queued through the hub (``%hpc continue``): the same options, as a named server
that Slurm starts once the current job ends (``--dependency=afterany``), where ``%hpc restore`` loads the
checkpoints the walltime hooks wrote.

``POST /hub/api/hpcai/continue`` with the notebook server's own token (as for extend.py): the hub finds that
server's spawner and starts the user's server ``after-<job>`` with that spawner's validated options, its start
timeout long enough to wait in the queue for the rest of the current job. Asked again, it answers with the
follow-up already queued. A user has at most one follow-up waiting: each is a pending spawn for hours, and
pending spawns count against JupyterHub's ``concurrent_spawn_limit`` for everyone.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections import defaultdict
from typing import Any

from jupyterhub.apihandlers import APIHandler, default_handlers
from tornado import web

from ..allocation import end_time
from ..errors import HPCAIError
from ..replies import refuse
from .extend import own_spawner

QUEUED_WITHIN = 30  # seconds for the follow-up's sbatch to answer with a job id
_LOCKS: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)  # user name -> held while a follow-up is asked


def follow_up_name(job_id: str) -> str:
    """The named server of job ``job_id``'s follow-up."""
    return f"after-{int(job_id)}"


def _seconds_left(job_id: str) -> int:
    end = end_time(job_id)
    return max(0, int((end - dt.datetime.now()).total_seconds())) if end else 0


class ContinueHandler(APIHandler):  # type: ignore[misc]
    """POST: queue the follow-up of the job whose server's token authenticates the request."""

    @web.authenticated
    async def post(self) -> None:
        current = own_spawner(self)
        user = self.current_user
        if not self.allow_named_servers:
            refuse(self, HPCAIError("this hub does not allow named servers, so no follow-up job can wait beside "
                                    "this one", "%hpc checkpoint, stop this server and start a new one, then "
                                    "%hpc restore there (admins: JupyterHub.allow_named_servers = True)"))
            return
        name = follow_up_name(current.job_id)
        async with _LOCKS[user.name]:  # the check and the spawn as one step: requests at once queue one follow-up
            follower = user.spawners[name] if name in user.orm_spawners else None
            if follower is None or not (follower.active or follower.pending):
                waiting = next((s for n, s in user.spawners.items() if n.startswith("after-") and s.pending == "spawn"),
                               None)
                if waiting is not None:  # each waits as a pending spawn, which counts against concurrent_spawn_limit
                    refuse(self, HPCAIError(f"a follow-up job of yours already waits: server {waiting.name} (Slurm "
                                            f"job {waiting.job_id or 'not yet submitted'})",
                                            "one follow-up per user waits at a time: let it start, or stop it on the "
                                            "hub's home page"))
                    return
                follower = await self._spawn(user, name, current)
        deadline = time.monotonic() + QUEUED_WITHIN
        while not follower.job_id and (follower.pending or follower.active) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        if not follower.job_id:
            raise web.HTTPError(500, f"the follow-up server {name} has no Slurm job yet: see the hub's log")
        self.finish(json.dumps({"server": name, "url": f"{user.server_url(name)}lab", "job_id": follower.job_id,
                                "after": current.job_id}))

    async def _spawn(self, user: Any, name: str, current: Any) -> Any:
        """Start the named server ``name`` with ``current``'s options, waiting in Slurm's queue for its job."""
        await self._check_named_server_request(user, name, name)
        follower = user.get_or_create_spawner(name, name, replace_failed=True)
        follower.follows = current.job_id
        # it waits in the queue for the rest of this job, then starts as any server does
        follower.start_timeout = max(follower.start_timeout,
                                     await asyncio.to_thread(_seconds_left, current.job_id) + current.start_timeout)
        await self.spawn_single_user(user, name, name, options=dict(current.user_options or {}))
        return follower


default_handlers.append((r"/api/hpcai/continue", ContinueHandler))
