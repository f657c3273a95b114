"""A real JupyterHub (demo config: HPCSlurmSpawner, configurable-http-proxy, DummyAuthenticator) for tests."""

from __future__ import annotations

import secrets
import signal
import subprocess
from pathlib import Path

from jupyter_helpers import free_port
from jupyter_hpcai.demo import HubProcess, ensure_user

USER = "hpcai-alice"
BOB = "hpcai-bob"  # the other user: hostile to alice in the security tests
PASSWORD = "demo-" + secrets.token_hex(4)
__all__ = ["BOB", "PASSWORD", "USER", "Hub", "ensure_user"]


class Hub(HubProcess):
    """The demo hub on free ports, with a fresh admin token; restartable in place."""

    def __init__(self, state: Path) -> None:
        super().__init__(state, free_port(), free_port(), free_port(), password=PASSWORD, token=secrets.token_hex(16),
                         users=(USER, BOB))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> subprocess.Popen[bytes]:
        self.proc = super().start()
        return self.proc

    def stop(self, proxy: bool = False) -> None:
        """Stop the hub (and the proxy too, when asked: a hub restart keeps it)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)
        if proxy:
            super().stop()

    def kill(self) -> None:
        """SIGKILL the hub (its proxy keeps running, as after a crash)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=60)

    def server(self, user: str = USER) -> dict | None:  # type: ignore[type-arg,override]
        return super().server(user)

    def wait_ready(self, user: str = USER, timeout: float = 180) -> dict:  # type: ignore[type-arg,override]
        return super().wait_ready(user, timeout)

    def stop_server(self, user: str = USER) -> None:  # type: ignore[override]
        super().stop_server(user)

    def user_token(self, user: str = USER) -> str:  # type: ignore[override]
        return super().user_token(user)
