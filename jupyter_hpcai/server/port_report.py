"""The notebook job's server tells the hub its port once it listens there (runs in the Jupyter server, as the
user). ``hpcai-singleuser`` (singleuser.py) asks for it; the server extension (__init__.py) runs ``report`` on the
server's loop.

batchspawner's launcher reported a port it had only seen free, and then started the server: a server that found
the port taken by then listened elsewhere without a word (jupyter_server's port_retries), and the hub routed the
user to whatever held the reported port, another user's server or a process waiting for her cookies. Reported
from inside the server, the port is held by that server before the hub hears of it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

wanted = False  # hpcai-singleuser sets it, in this process, before it runs the server
LISTEN_WITHIN = 120.0  # seconds for the server to listen before it gives up reporting
TRIES = 5  # posts to the hub while it cannot be reached (it may be restarting)


def listening_port(server_app: Any) -> int | None:
    """The TCP port the server's HTTP server listens on, once it does (IPv4 and IPv6 sockets share it)."""
    sockets = getattr(getattr(server_app, "http_server", None), "_sockets", {})  # tornado TCPServer: fd -> socket
    ports = {s.getsockname()[1] for s in sockets.values() if s.family in (socket.AF_INET, socket.AF_INET6)}
    return ports.pop() if len(ports) == 1 else None


def post_port(port: int) -> tuple[int, bool]:
    """POST {"port": port} to the hub with the server's own token (HubAuth reads the job's environment): the hub's
    HTTP status, and whether that answer was to the first request. A request that failed after it was sent may
    have been recorded: only a refusal of the first request is sure to have left no port in the hub. Raises
    ``requests`` errors when no answer came."""
    import requests
    from jupyterhub.services.auth import HubAuth
    from jupyterhub.utils import url_path_join

    auth = HubAuth()
    tls: dict[str, Any] = {}
    if auth.certfile and auth.keyfile:  # the hub's internal_ssl
        tls["cert"] = (auth.certfile, auth.keyfile)
    if auth.client_ca:
        tls["verify"] = auth.client_ca
    attempt = 0
    while True:
        try:
            answer = requests.post(url_path_join(auth.api_url, "batchspawner"), json={"port": port}, timeout=30,
                                   headers={"Authorization": f"token {auth.api_token}"}, **tls)
            return answer.status_code, attempt == 0
        except requests.ConnectionError:  # the hub restarting; a timeout is not retried
            attempt += 1
            if attempt == TRIES:
                raise
            time.sleep(2 ** attempt)


def service_url_with(port: int) -> None:
    """JUPYTERHUB_SERVICE_URL with the port the server listens on, for the kernels and the processes it starts (the
    hub wrote it before any port was known)."""
    url = urlsplit(os.environ.get("JUPYTERHUB_SERVICE_URL", ""))
    if url.hostname:
        host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
        os.environ["JUPYTERHUB_SERVICE_URL"] = urlunsplit(url._replace(netloc=f"{host}:{port}"))


async def report(server_app: Any) -> None:
    """Once the server listens, report its port. A server the hub surely refused stops, so that its job ends and
    the spawn fails with the job's log instead of waiting out start_timeout. Any other failure keeps the server
    listening: the hub may have recorded the port, and a port given up after that is one another user could take
    and be routed to."""
    deadline = time.monotonic() + LISTEN_WITHIN
    while (port := listening_port(server_app)) is None:
        if time.monotonic() > deadline:
            server_app.log.error("jupyter_hpcai: the server does not listen on one TCP port after %g s; no port "
                                 "to report to the hub", LISTEN_WITHIN)
            server_app.stop()
            return
        await asyncio.sleep(0.05)
    service_url_with(port)
    try:
        status, first = await asyncio.to_thread(post_port, port)
    except Exception as err:  # requests' errors: no answer, so perhaps recorded
        server_app.log.error("jupyter_hpcai: no answer from the hub to the report of port %d (%s); the server keeps "
                             "listening there", port, err)
        return
    if status < 300:
        server_app.log.info("jupyter_hpcai: reported port %d to the hub", port)
    elif first:
        server_app.log.error("jupyter_hpcai: the hub refused the report of port %d (HTTP %d); stopping", port, status)
        server_app.stop()
    else:
        server_app.log.error("jupyter_hpcai: the hub answered HTTP %d to a repeated report of port %d; the server "
                             "keeps listening there", status, port)
