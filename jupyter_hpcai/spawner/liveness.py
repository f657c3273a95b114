"""Whether the server on a job's port is the user's own (runs in the hub): at start, until it answers and proves it
holds the server's token; while it runs, at most every PROBE_EVERY seconds, ending a job whose server is gone.
A mixin of HPCSlurmSpawner: it uses the spawner's job, server, token and cancel."""

from __future__ import annotations

import asyncio
import hmac
import re
import secrets
import time

from batchspawner import JobStatus
from jupyterhub.utils import url_path_join
from tornado.httpclient import HTTPClientError
from tornado.iostream import StreamClosedError
from tornado.simple_httpclient import SimpleAsyncHTTPClient

from ..contract import IDENTITY_PATH, identity_proof
from ..errors import HPCAIError

IDENTITY_BYTES = 4096  # of the answer to the hub's identity check
SILENT_FOR = 300.0  # seconds without a proof from a running server's port before its job is ended
HOLDS_ITS_PORT = ("SUSPENDED", "STOPPED", "RESIZING", "SIGNALING")  # a started job's processes live on: not probed
PROBE_EVERY = 10.0  # seconds: a running server's port is asked at most this often, however many polls want it


class ServerCheck:
    """The identity check of a job's server: ``_wait_until_listening`` at start, ``_server_gone`` at each poll."""

    _last_proof = 0.0  # time.monotonic() of the running server's last proof (or of this hub's first look)
    _probing: tuple[float, tuple[str, int], asyncio.Future[str]] | None = None  # the last probe: when, where, answer

    async def _server_gone(self) -> bool:
        """Whether this started job's server is gone from its port, its route to go now (the job cancelled where it
        would run on): the job is no longer running (COMPLETING as its server ended, or requeued), so that its port is
        free for anyone on the node to take; or something else answers there (another user's process on the port the
        server gave up); or no proof came for SILENT_FOR seconds (nothing listens, or a squatter hangs on the probe
        alone; time, not probes: users' page loads poll too, and a server may stall a while on a slow file system).
        A job whose processes live on stopped (SUSPENDED, STOPPED), RESIZING or SIGNALING holds its port: kept unprobed.
        A job the cancel failed for is kept, to be tried again at the next poll."""
        server, job = self.server, self.job_id
        if self._spawn_pending or self._stop_pending or server is None or not (server.ip and server.port and job) \
                or not self.token_digest():
            return False
        state = (self.job_status.split() or [""])[0]
        if state in HOLDS_ITS_PORT:
            self._last_proof = time.monotonic()  # its grace counts from when it runs again
            return False
        if state != "RUNNING":
            self.log.warning("%s: job %s is %s; its server's port is no longer its own, so its route goes now",
                             self._log_name, job, state or "gone")
            if state != "COMPLETING" and not await self._cancel_quietly():  # a requeued job would run on unseen
                return False
            self.clear_state()
            return True
        found, asked = await self._probe(server.ip, server.port)
        if job != self.job_id or self._spawn_pending or self._stop_pending:  # it stopped or restarted meanwhile
            return False
        now = time.monotonic()
        if found == "proven":
            self._last_proof = asked
        elif not self._last_proof:
            self._last_proof = now  # a restarted hub counts from its first look
        if found == "proven" or (found in ("refused", "silent") and now - self._last_proof < SILENT_FOR):
            return False
        self.log.warning("%s: its server no longer answers on %s:%s (%s); cancelling job %s", self._log_name,
                         server.ip, server.port, found, job)
        if not await self._cancel_quietly():
            return False
        self.clear_state()
        return True

    async def _wait_until_listening(self) -> None:
        """Wait until this user's server answers on the port it reported and proves it holds the server's token
        (``_identity``). Whatever else answers there, such as another user's process on a port the server gave
        up, fails the start: the hub never routes a user to it. A server that dies at start (a broken config in
        the user's home, say) ends its job: the spawn then fails with the job's state and log, where JupyterHub,
        left to find it dead, would answer a bare 500."""
        while (found := await self._identity(self.ip, self.port)) in ("refused", "silent"):
            if await self.query_job_status() == JobStatus.NOTFOUND:
                raise HPCAIError(await self._failure_report("ended before the Jupyter server answered"))
            await asyncio.sleep(self.startup_poll_interval)
        if found == "proven":
            return
        await self._cancel_quietly()
        where = f"what answers on {self.ip}:{self.port}, the port {self.user.name}'s server reported,"
        raise HPCAIError(f"{where} has no jupyter_hpcai identity endpoint: the server extension is off in that "
                         "server's config, or it is not that server; the job was cancelled" if found == "no endpoint"
                         else f"{where} is not that server (it cannot prove it holds the server's token); the job "
                         "was cancelled", "start the server again; tell the site's admins if it happens again")

    async def _identity(self, ip: str, port: int) -> str:
        """What answers on ``ip:port``: "proven" (an HMAC of a fresh nonce under this server's token,
        contract.identity_proof), "refused" (nothing listens), "silent" (no HTTP answer: cut, timed out), "no
        endpoint" (404) or "not proven". The answer may be anyone's: at most IDENTITY_BYTES of body and 8 KiB of
        headers within 5 s, read by tornado's own client (JupyterHub may have made curl the default one), and only an
        exact body is taken."""
        nonce = secrets.token_hex(16)
        base = self.server.base_url if self.server is not None else self.user.url
        host = f"[{ip}]" if ":" in ip else ip
        client = SimpleAsyncHTTPClient(force_instance=True, max_body_size=IDENTITY_BYTES, max_header_size=8192)
        try:
            answer = await client.fetch(f"http://{host}:{port}{url_path_join(base, IDENTITY_PATH)}?nonce={nonce}",
                                        request_timeout=5, follow_redirects=False, raise_error=False)
        except ConnectionRefusedError:
            return "refused"
        except (OSError, StreamClosedError, HTTPClientError):
            return "silent"
        except Exception:  # an answer that is not HTTP tornado takes
            return "not proven"
        finally:
            client.close()
        if answer.code == 599:  # tornado's code for no HTTP answer
            return "silent"
        if answer.code == 404:
            return "no endpoint"
        proof = re.fullmatch(rb'\s*\{\s*"proof"\s*:\s*"([0-9a-f]{64})"\s*\}\s*', answer.body or b"")
        expected = identity_proof(self.token_digest(), nonce, port).encode()
        return "proven" if answer.code == 200 and proof and hmac.compare_digest(proof.group(1), expected) \
            else "not proven"

    async def _probe(self, ip: str, port: int) -> tuple[str, float]:
        """What answers on the running server's port (``_identity``) and when it was asked: asked at most once every
        PROBE_EVERY seconds, one probe at a time, however many polls want it (every load of a user's hub home page
        polls their servers)."""
        now = time.monotonic()
        if self._probing is None or self._probing[1] != (ip, port) \
                or (self._probing[2].done() and now - self._probing[0] >= PROBE_EVERY):
            self._probing = (now, (ip, port), asyncio.ensure_future(self._identity(ip, port)))
        asked, _, answer = self._probing
        return await asyncio.shield(answer), asked
