"""GET /hpcai/api/allocation, GET /hpcai/api/recent-jobs, GET /hpcai/api/engines, POST /hpcai/api/engines/stop, POST /hpcai/api/stacks and
POST /hpcai/api/extend (all need the server's authentication); GET /hpcai/api/identity (the hub's check, no login)."""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import re
import time
from typing import Any

from jupyter_server.auth.decorator import allow_unauthenticated
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from .. import hub_client
from ..contract import IDENTITY_PATH, identity_proof, token_digest
from ..engines import listing
from ..errors import HPCAIError
from ..replies import extend_seconds, refuse
from ..scheduler import chosen
from ..scheduler.allocation import Allocation, project_budget
from ..scheduler.ends import explain


class AllocationHandler(APIHandler):  # type: ignore[misc]
    """The Slurm job this server runs in, with its project's GPU budget where the site keeps one
    (``allocation.project_budget``); ``{"in_job": false}`` outside one."""

    @web.authenticated
    async def get(self) -> None:
        alloc = await asyncio.to_thread(Allocation.current)
        body: dict[str, Any] = {"in_job": False} if alloc is None else {
            "in_job": True, **alloc.to_json(), "budget": await asyncio.to_thread(project_budget)}
        self.finish(json.dumps(body))


RECENT_KEPT_FOR = 60.0  # seconds the server keeps the user's recent job ends: one sacct a minute, whatever polls


class RecentJobsHandler(APIHandler):  # type: ignore[misc]
    """How the user's jobs of the last week that have ended ended, the latest first (at most 5), from Slurm's
    accounting: ``{"jobs": [{"job_id", "state", "said"}]}``, ``said`` in words with the advice that fits (empty
    where the site keeps no accounting)."""

    _kept: tuple[float, list[dict[str, str]]] | None = None

    @web.authenticated
    async def get(self) -> None:
        kept = RecentJobsHandler._kept
        if kept is None or time.monotonic() - kept[0] >= RECENT_KEPT_FOR:
            kept = RecentJobsHandler._kept = (time.monotonic(), await asyncio.to_thread(_recent_jobs))
        self.finish(json.dumps({"jobs": kept[1]}))


def _recent_jobs() -> list[dict[str, str]]:
    try:
        ends = chosen().recent_ends(getpass.getuser())
    except HPCAIError:
        return []
    return [{"job_id": e.job_id, "state": e.state, "said": explain(e)} for e in ends[:5]]


class EnginesHandler(APIHandler):  # type: ignore[misc]
    """The engine sets the user's kernels started, from ipyparallel's own cluster files."""

    @web.authenticated
    async def get(self) -> None:
        alloc = await asyncio.to_thread(Allocation.current)
        sets = await asyncio.to_thread(listing.list_engine_sets, alloc.job_id if alloc else None)
        self.finish(json.dumps({"engine_sets": sets}))


class StopEnginesHandler(APIHandler):  # type: ignore[misc]
    """POST {"cluster_id": ...}: stop one of this job's engine sets (one a kernel left running, say)."""

    @web.authenticated
    async def post(self) -> None:
        cluster_id = (self.get_json_body() or {}).get("cluster_id")
        if not isinstance(cluster_id, str) or not listing.SET_ID.fullmatch(cluster_id):
            raise web.HTTPError(400, 'send {"cluster_id": "<an engine set\'s id>"}')
        alloc = await asyncio.to_thread(Allocation.current)
        found = [s for s in await asyncio.to_thread(listing.job_sets, alloc.job_id if alloc else "local")
                 if s.cluster_id == cluster_id]
        if not found:
            refuse(self, HPCAIError(f"no engine set '{cluster_id}' in this job", "refresh the panel"), status=404)
            return
        await asyncio.to_thread(listing.stop_set, found[0])
        self.finish(json.dumps({"stopped": cluster_id}))


class StacksHandler(APIHandler):  # type: ignore[misc]
    """POST {"cluster_id": ..., "native": false}: every rank's Python stack, identical ones grouped (py-spy)."""

    @web.authenticated
    async def post(self) -> None:
        body = self.get_json_body() or {}
        cluster_id, native = body.get("cluster_id"), body.get("native", False)
        if not isinstance(cluster_id, str) or not isinstance(native, bool):
            raise web.HTTPError(400, 'send {"cluster_id": "<an engine set\'s id>", "native": false}')
        try:
            groups, read = await asyncio.to_thread(listing.stacks, cluster_id, native)
        except HPCAIError as err:
            refuse(self, err)
            return
        self.finish(json.dumps({"groups": groups, "read": read}))


class ExtendThroughHubHandler(APIHandler):  # type: ignore[misc]
    """POST {"seconds": N}: ask the hub for more walltime for this server's job (the site's policy decides)."""

    @web.authenticated
    async def post(self) -> None:
        seconds = extend_seconds(self.get_json_body())  # the hub's bounds, checked here first
        try:
            granted = await asyncio.to_thread(hub_client.extend, seconds)
        except HPCAIError as err:
            refuse(self, err)
            return
        self.finish(json.dumps(granted))


class IdentityHandler(APIHandler):  # type: ignore[misc]
    """GET ?nonce=N: this server's proof that it holds its hub token, which the hub checks before it routes the user
    here (contract.identity_proof). No login: the answer is a signature of the hub's nonce, nothing else."""

    @allow_unauthenticated
    def get(self) -> None:
        nonce = self.get_query_argument("nonce", "")
        token = os.environ.get("JUPYTERHUB_API_TOKEN", "")
        if not re.fullmatch(r"[0-9a-f]{32}", nonce) or not token:
            raise web.HTTPError(400, "a nonce of 32 hex digits, to a server the hub started")
        port = self.request.connection.stream.socket.getsockname()[1]  # where the hub's probe came in
        self.finish(json.dumps({"proof": identity_proof(token_digest(token), nonce, port)}))


def setup_handlers(web_app: Any) -> None:
    base = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [(url_path_join(base, "hpcai/api/allocation"), AllocationHandler),
                                 (url_path_join(base, "hpcai/api/recent-jobs"), RecentJobsHandler),
                                 (url_path_join(base, "hpcai/api/engines"), EnginesHandler),
                                 (url_path_join(base, "hpcai/api/engines/stop"), StopEnginesHandler),
                                 (url_path_join(base, "hpcai/api/stacks"), StacksHandler),
                                 (url_path_join(base, "hpcai/api/extend"), ExtendThroughHubHandler),
                                 (url_path_join(base, IDENTITY_PATH), IdentityHandler)])
