"""Drive real Jupyter servers and kernels from tests: start a server, run code over its websocket."""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_hpcai.proc import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    token: str
    log: Path

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(f"{self.url}{path}", method=method, data=json.dumps(body).encode() if body else None,
                                     headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")


@contextmanager
def jupyter_server(tmp_path: Path, *, app: str = "jupyter_server", env: dict[str, str] | None = None) -> Iterator[Server]:
    """A real Jupyter server (``jupyter_server`` or ``jupyterlab``) on a free loopback port."""
    port, token = free_port(), secrets.token_hex(16)
    log = tmp_path / f"{app}.log"
    cmd = [sys.executable, "-m", app, "--no-browser", f"--port={port}", "--ip=127.0.0.1",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}", "--allow-root"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = Server(f"http://127.0.0.1:{port}", token, log)
    try:
        wait_until(lambda: _answers(server) or proc.poll() is not None, timeout=90, what=f"{app} to answer")
        assert proc.poll() is None, log.read_text()
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _answers(server: Server) -> bool:
    try:
        return server.request("GET", "/api/status")[0] == 200
    except OSError:
        return False


async def execute(server: Server, kernel_id: str, code: str, timeout: float = 60) -> dict[str, Any]:
    """Run ``code`` in a server's kernel over its websocket: {"status", "stdout", "error"}."""
    import asyncio

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    ws_url = server.url.replace("http", "ws") + f"/api/kernels/{kernel_id}/channels"
    conn = await websocket_connect(HTTPRequest(ws_url, headers={"Authorization": f"token {server.token}"}))
    msg_id = uuid.uuid4().hex
    conn.write_message(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test", "session": uuid.uuid4().hex,
                   "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False},
    }))
    result: dict[str, Any] = {"stdout": "", "error": None, "status": None}
    idle = False

    async def read() -> None:
        nonlocal idle
        while not (idle and result["status"]):
            msg = json.loads(await conn.read_message())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if kind == "stream":
                result["stdout"] += msg["content"]["text"]
            elif kind == "error":
                result["error"] = msg["content"]["ename"]
            elif kind == "execute_reply":
                result["status"] = msg["content"]["status"]
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                idle = True

    await asyncio.wait_for(read(), timeout)
    conn.close()
    return result
