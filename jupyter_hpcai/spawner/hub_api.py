"""Every HTTP endpoint jupyter-hpcai adds to the hub (runs in the hub, as root), each for a notebook job's server
and only with that server's own token (the server extension and the magics send it from the server's
environment, in a header). The site template and the demo config register them explicitly, as the hub loads its
config (before it builds its routes):

    jupyter_hpcai.spawner.hub_api.register()

(into the hub's API handlers, as batchspawner registers its own: JupyterHub's ``extra_handlers`` is deprecated).

- ``POST /hub/api/batchspawner {"port": N}``: the port the starting server listens on, and nothing else.
  batchspawner's own handler at that path sets every attribute named in the body on the spawner, so a user's
  server could set ``exec_prefix``, ``batch_cancel_cmd`` or another user's ``job_id`` and have the root hub run
  it. ``register`` takes it out of the hub's handlers, and importing this module makes batchspawner's handler
  class itself answer as ours, so that even a hub that built its routes before (a config that imports this
  package only at the first spawn) never runs batchspawner's.
- ``POST /hub/api/hpcai/extend {"seconds": N}``: more walltime for the token's job, within the site's policy
  (``HPCSlurmSpawner.extend``).
- ``POST /hub/api/hpcai/continue``: a follow-up notebook job (``%hpc continue``): the same options, as the named
  server ``after-<job>``, which Slurm starts once the current job ends (``--dependency=afterany``). Asked again,
  it answers with the follow-up already queued. A user has at most one follow-up waiting: each is a pending spawn
  for hours, and pending spawns count against JupyterHub's ``concurrent_spawn_limit`` for everyone.

Each takes from the user's share (fairness.py: ``HPCSlurmSpawner.hub_api_per_minute`` requests a minute per user
and endpoint; an extend runs one at a time per user); over it, 429 with ``Retry-After``. A refusal is
``{"error", "hint"}`` (replies.refuse) or a 400 with the reason; the log names the user, never the body.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hmac
import json
import time
from collections import defaultdict
from typing import Any

import batchspawner.api
from jupyterhub.apihandlers import APIHandler, default_handlers
from jupyterhub.handlers.base import BaseHandler
from tornado import web

from ..contract import token_digest
from ..errors import HPCAIError
from ..replies import extend_seconds, refuse
from .fairness import SHARES, TooMany

PORT_PATH = r"/api/batchspawner"
QUEUED_WITHIN = 30  # seconds for a follow-up's sbatch to answer with a job id


def checked_port(body: object) -> int:
    """The body's port: exactly ``{"port": N}``, N a whole number from 1024 to 65535; else 400 with the reason."""
    if not isinstance(body, dict) or set(body) != {"port"}:
        got = f"{len(body)} keys" if isinstance(body, dict) else type(body).__name__  # never the body's own text
        raise web.HTTPError(400, f'send {{"port": N}} and nothing else (got {got})')
    port = body["port"]
    if not isinstance(port, int) or isinstance(port, bool) or not 1024 <= port <= 65535:
        # the proxy and the hub connect to it: never a node's privileged service
        raise web.HTTPError(400, "the port must be a whole number from 1024 to 65535")
    return port


def token_spawner(handler: APIHandler) -> Any:
    """The spawner of the request's user whose server's own token made the request, or None."""
    digest = token_digest(handler.get_auth_token() or "")  # the spawner keeps its token's digest across restarts
    return next((s for s in handler.current_user.spawners.values()
                 if (kept := s.token_digest() if hasattr(s, "token_digest") else "")
                 and hmac.compare_digest(kept, digest)), None)


def own_job(handler: APIHandler) -> Any:
    """The notebook job whose server's own token made the request; 404 else."""
    spawner = token_spawner(handler)
    if spawner is None or not hasattr(spawner, "extend") or not getattr(spawner, "job_id", ""):
        raise web.HTTPError(404, "this token belongs to no running notebook job: send the server's own token")
    return spawner


def too_many(handler: APIHandler, err: TooMany) -> None:
    """Answer a request over its user's share: 429, when to ask again, and the reason (logged with the user)."""
    handler.log.warning("Refused %s for %s: %s", handler.request.path, handler.current_user.name, err.message)
    handler.set_header("Retry-After", str(err.retry_after))
    refuse(handler, err, 429)


class PortHandler(APIHandler):  # type: ignore[misc]
    """POST {"port": N}: the port the starting server of this token's spawner listens on."""

    @web.authenticated
    def post(self) -> None:
        spawner = token_spawner(self)
        try:
            if spawner is None:
                raise web.HTTPError(400, "this token belongs to no server of this user: send the server's own token")
            SHARES.take(self.current_user.name, "port report", spawner.hub_api_per_minute)
            port = checked_port(self.get_json_body())
            if not spawner.pending == "spawn" or spawner.port:
                raise web.HTTPError(400, "this server is not starting, or has reported its port already")
        except TooMany as err:
            too_many(self, err)
            return
        except web.HTTPError as err:
            self.log.warning("Refused a port report for %s: %s", self.current_user.name, err.log_message)
            raise
        spawner.port = port
        self.log.info("Server of %s reported port %d", self.current_user.name, port)
        self.set_status(201)
        self.finish(json.dumps({"message": "port recorded"}))


class ExtendThroughHubHandler(APIHandler):  # type: ignore[misc]
    """POST {"seconds": N}: extend the job of the server whose token authenticates the request."""

    @web.authenticated
    async def post(self) -> None:
        seconds = extend_seconds(self.get_json_body())
        spawner = own_job(self)
        user = self.current_user.name
        try:
            with SHARES.one_at_a_time(user, "extend"):  # the requests meanwhile take nothing of the user's share
                SHARES.take(user, "extend", spawner.hub_api_per_minute)
                granted = await spawner.extend(seconds)
        except TooMany as err:
            too_many(self, err)
            return
        except HPCAIError as err:
            refuse(self, err)
            return
        self.finish(json.dumps(granted))


def follow_up_name(job_id: str) -> str:
    """The named server of job ``job_id``'s follow-up."""
    return f"after-{int(job_id)}"


async def _seconds_left(spawner: Any) -> int:
    """Seconds until ``spawner``'s job reaches its time limit, from its record as it is now (the hub's shared
    queries); 0 without a limit or a record."""
    info = await spawner.queries.fresh_job_info(spawner.job_id) or {}
    try:
        end = dt.datetime.fromisoformat(info.get("EndTime", ""))
    except ValueError:  # "Unknown", or no record
        return 0
    return max(0, int((end - dt.datetime.now()).total_seconds()))


class ContinueHandler(APIHandler):  # type: ignore[misc]
    """POST: queue the follow-up of the job whose server's token authenticates the request."""

    _locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)  # user name -> held while one is asked

    @web.authenticated
    async def post(self) -> None:
        current = own_job(self)
        user = self.current_user
        try:
            SHARES.take(user.name, "continue", current.hub_api_per_minute)
        except TooMany as err:
            too_many(self, err)
            return
        if not self.allow_named_servers:
            refuse(self, HPCAIError("this hub does not allow named servers, so no follow-up job can wait beside "
                                    "this one", "%hpc checkpoint, stop this server and start a new one, then "
                                    "%hpc restore there (admins: JupyterHub.allow_named_servers = True)"))
            return
        name = follow_up_name(current.job_id)
        async with self._locks[user.name]:  # the check and the spawn as one step: requests at once queue one
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
        follower.follow(current.job_id, await _seconds_left(current))
        await self.spawn_single_user(user, name, name, options=dict(current.user_options or {}))
        return follower


HANDLERS: list[tuple[str, type[APIHandler]]] = [
    (PORT_PATH, PortHandler),
    (r"/api/hpcai/extend", ExtendThroughHubHandler),
    (r"/api/hpcai/continue", ContinueHandler),
]


def register() -> None:
    """Our handlers into the hub's API handlers, batchspawner's taken out, and the hub's pages kept to the hub's own
    origin (the hub config calls it; idempotent)."""
    ours = {path for path, _ in HANDLERS}
    default_handlers[:] = [h for h in default_handlers
                           if h[0] not in ours and h[1] is not batchspawner.api.BatchSpawnerAPIHandler] + HANDLERS
    if BaseHandler.prepare is not _prepare_on_the_hubs_origin:
        _prepared[:] = [BaseHandler.prepare]
        BaseHandler.prepare = _prepare_on_the_hubs_origin


def on_a_users_origin(handler: BaseHandler) -> bool:
    """Whether a request for one of the hub's own pages came to a user's origin (``<user>.<the hub's domain>``): the
    proxy sends every name to the hub, and a page there would run beside what that user's server serves, its cookies
    (a login's) set where that user's server receives them."""
    domain = handler.settings.get("domain", "")
    return bool(handler.settings.get("subdomain_host") and domain) \
        and handler.request.host_name.lower().endswith(f".{domain.lower()}") \
        and handler.request.path.startswith(handler.hub.base_url)


_prepared: list[Any] = []  # JupyterHub's own BaseHandler.prepare, which ours runs after its check


async def _prepare_on_the_hubs_origin(self: BaseHandler) -> None:
    """JupyterHub's prepare, for a request on the hub's origin (or the servers' internal API); a page asked for on
    a user's origin is sent to the hub's own (GET, HEAD), or refused."""
    if on_a_users_origin(self):
        self.log.warning("Refused %s %s on a user's origin (%s)", self.request.method, self.request.path,
                         self.request.host_name)
        if self.request.method not in ("GET", "HEAD"):
            raise web.HTTPError(403, "the hub answers on its own origin only")
        self.redirect(f"{self.settings['subdomain_host']}{self.request.uri}")
        raise web.Finish()
    await _prepared[0](self)


def registered() -> bool:
    """Whether the hub's API handlers serve ours at our paths (the first match is what tornado serves)."""
    served = {}
    for path, handler, *_ in default_handlers:
        served.setdefault(path, handler)
    return all(served.get(path) is handler for path, handler in HANDLERS)


# batchspawner's handler class answers as ours wherever a hub routes to it
batchspawner.api.BatchSpawnerAPIHandler.post = PortHandler.post
