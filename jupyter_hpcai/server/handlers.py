"""GET /hpcai/api/allocation and GET /hpcai/api/engines (both need the server's authentication)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from ..allocation import Allocation
from ..engines.listing import list_engine_sets


class AllocationHandler(APIHandler):  # type: ignore[misc]
    """The Slurm job this server runs in; ``{"in_job": false}`` outside one."""

    @web.authenticated
    async def get(self) -> None:
        alloc = await asyncio.to_thread(Allocation.current)
        body: dict[str, Any] = {"in_job": False} if alloc is None else {"in_job": True, **alloc.to_json()}
        self.finish(json.dumps(body))


class EnginesHandler(APIHandler):  # type: ignore[misc]
    """The engine sets the user's kernels started, from ipyparallel's own cluster files."""

    @web.authenticated
    async def get(self) -> None:
        self.finish(json.dumps({"engine_sets": await asyncio.to_thread(list_engine_sets)}))


def setup_handlers(web_app: Any) -> None:
    base = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [(url_path_join(base, "hpcai/api/allocation"), AllocationHandler),
                                 (url_path_join(base, "hpcai/api/engines"), EnginesHandler)])
