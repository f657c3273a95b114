"""The one endpoint through which a notebook job's server reports to the hub: ``POST /hub/api/batchspawner``.

batchspawner's own handler at that path (registered by ``import batchspawner``) sets every attribute named in
the request body on the spawner, so a user's server could set ``exec_prefix``, ``batch_cancel_cmd`` or
another user's ``job_id`` and have the root hub run it. This module takes that handler out of the hub's
handlers and puts this one at the same path: batchspawner-singleuser still sends ``{"port": N}`` there, and
that is all it accepts: a port from 1024 to 65535, from the server's own token, while its start is pending and
no port is set. Anything else is refused with 400 and the reason; the log names the user, never the body.
"""

from __future__ import annotations

import json

import batchspawner.api
from jupyterhub.apihandlers import APIHandler, default_handlers
from tornado import web

from .extend import token_spawner

PATH = r"/api/batchspawner"


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


class PortHandler(APIHandler):  # type: ignore[misc]
    """POST {"port": N}: the port the starting server of this token's spawner listens on."""

    @web.authenticated
    def post(self) -> None:
        spawner = token_spawner(self)
        try:
            if spawner is None:
                raise web.HTTPError(400, "this token belongs to no server of this user: send the server's own token")
            port = checked_port(self.get_json_body())
            if not spawner.pending == "spawn" or spawner.port:
                raise web.HTTPError(400, "this server is not starting, or has reported its port already")
        except web.HTTPError as err:
            self.log.warning("Refused a port report for %s: %s", self.current_user.name, err.log_message)
            raise
        spawner.port = port
        self.log.info("Server of %s reported port %d", self.current_user.name, port)
        self.set_status(201)
        self.finish(json.dumps({"message": "port recorded"}))


def install() -> None:
    """Replace batchspawner's handler in the hub's API handlers by this one (idempotent)."""
    default_handlers[:] = [h for h in default_handlers
                           if h[1] is not batchspawner.api.BatchSpawnerAPIHandler and h[0] != PATH]
    default_handlers.append((PATH, PortHandler))


install()
