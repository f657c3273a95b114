"""Drive real Jupyter servers and kernels from tests: start a server, run code over its websocket."""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_hpcai.demo import execute as run_code
from jupyter_hpcai.demo import request
from jupyter_hpcai.proc import wait_until


def wait_for_stream(client: Any, text: str, timeout: float = 60) -> None:
    """Read a kernel client's iopub until a stream message holds ``text``: the cell is running user code.

    Interrupt a cell only after this. A SIGINT that lands after the kernel went busy but before the cell's
    code started is caught by ipykernel's message dispatch, and no execute reply is ever sent.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = client.get_iopub_msg(timeout=timeout)
        if msg["msg_type"] == "stream" and text in msg["content"]["text"]:
            return
    raise AssertionError(f"no {text!r} within {timeout} s")


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
        return request(f"{self.url}{path}", self.token, method, body)


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
        wait_until(lambda: answers(server) or proc.poll() is not None, timeout=90, what=f"{app} to answer")
        assert proc.poll() is None, log.read_text()
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def answers(server: Server) -> bool:
    """The server answers HTTP (its log says "is running at" before it listens)."""
    try:
        return server.request("GET", "/api/status")[0] == 200
    except OSError:
        return False


async def execute(server: Server, kernel_id: str, code: str, timeout: float = 60) -> dict[str, Any]:
    """Run ``code`` in a server's kernel over its websocket: {"status", "stdout", "error"}."""
    return await run_code(server.url, server.token, kernel_id, code, timeout)
