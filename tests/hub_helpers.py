"""A real JupyterHub (demo config: HPCSlurmSpawner, configurable-http-proxy, DummyAuthenticator) for tests."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from jupyter_helpers import free_port
from jupyter_hpcai.proc import wait_until

REPO = Path(__file__).resolve().parents[1]
USER = "hpcai-alice"
PASSWORD = "demo-" + secrets.token_hex(4)


def ensure_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True, timeout=60)


class Hub:
    def __init__(self, state: Path) -> None:
        self.state = state
        self.port, self.internal_port, self.proxy_api_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = secrets.token_hex(16)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = state / "hub.log"

    def env(self) -> dict[str, str]:
        return {**os.environ, "HPCAI_HUB_DIR": str(self.state), "HPCAI_HUB_PORT": str(self.port),
                "HPCAI_HUB_INTERNAL_PORT": str(self.internal_port), "HPCAI_PROXY_API_PORT": str(self.proxy_api_port),
                "HPCAI_HUB_API_TOKEN": self.token, "HPCAI_DEMO_PASSWORD": PASSWORD}

    def start(self) -> None:
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen([str(Path(sys.executable).parent / "jupyterhub"), "-f",
                                          str(REPO / "spawner_config" / "demo_config.py")],
                                         cwd=self.state, env=self.env(), stdout=out, stderr=subprocess.STDOUT)
        wait_until(lambda: self._answers() or self.proc.poll() is not None, timeout=120, what="the hub to answer")  # type: ignore[union-attr]
        assert self.proc.poll() is None, self.log.read_text()[-3000:]

    def _answers(self) -> bool:
        try:
            return self.api("GET", "/")[0] == 200
        except OSError:
            return False

    def stop(self, proxy: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)
        if proxy:
            pid_file = self.state / "proxy.pid"
            if pid_file.exists():
                try:
                    os.kill(int(pid_file.read_text()), signal.SIGTERM)
                except (ProcessLookupError, ValueError):
                    pass

    def api(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        req = urllib.request.Request(f"{self.url}/hub/api{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"token {token or self.token}"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                return err.code, json.loads(raw)
            except ValueError:
                return err.code, {"message": raw.decode(errors="replace")}

    def server(self, user: str = USER) -> dict[str, Any] | None:
        return self.api("GET", f"/users/{user}")[1]["servers"].get("")

    def wait_ready(self, user: str = USER, timeout: float = 180) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            server = self.server(user)
            if server is None:
                raise AssertionError(f"the server of {user} stopped:\n{self.log.read_text()[-3000:]}")
            return server if server["ready"] else None

        return wait_until(ready, timeout=timeout, what=f"{user}'s server to be ready")

    def stop_server(self, user: str = USER) -> None:
        self.api("DELETE", f"/users/{user}/server")
        wait_until(lambda: self.server(user) is None, timeout=120, what=f"{user}'s server to stop")

    def user_token(self, user: str = USER) -> str:
        status, body = self.api("POST", f"/users/{user}/tokens", {"note": "tests", "expires_in": 3600})
        assert status == 201, body
        return body["token"]
