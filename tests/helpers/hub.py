"""A real JupyterHub (demo config: HPCSlurmSpawner, configurable-http-proxy, DummyAuthenticator) for tests."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.request import Request, urlopen

from helpers.jupyter import free_port
from jupyter_hpcai.scheduler import slurm
from jupyter_hpcai import demo
from jupyter_hpcai.demo import DEMO_CONFIG, HubProcess, loopback
from jupyter_hpcai.devcluster.accounting import PROJECTS
from jupyter_hpcai.devcluster.pytest_plugin import worker_number
from jupyter_hpcai.proc import wait_until

_WORKER = str(worker_number() or "")  # each of the run's processes has users of its own, as it has a cluster
USER = f"hpcai-alice{_WORKER}"
BOB = f"hpcai-bob{_WORKER}"  # the other user: hostile to alice in the security tests
PASSWORD = "demo-" + secrets.token_hex(4)
__all__ = ["BOB", "CHROMIUM_ARGS", "PASSWORD", "USER", "Hub", "as_user", "ensure_user", "every_gpu_held",
           "demo_config_with", "logged_in_page", "progress_events", "server_token"]


def ensure_user(name: str) -> None:
    """The unix user ``name`` with its associations: alice in both projects (climate her default), others in one."""
    demo.ensure_user(name, PROJECTS if name == USER else None)


class Hub(HubProcess):
    """The demo hub on free ports, with a fresh admin token; restartable in place."""

    def __init__(self, state: Path, users: tuple[str, ...] = (USER, BOB), environ: dict[str, str] | None = None,
                 config: Path = DEMO_CONFIG) -> None:
        super().__init__(state, free_port(), free_port(), free_port(), password=PASSWORD, token=secrets.token_hex(16),
                         users=users, config=config)
        self.environ = environ or {}  # more of the hub's environment (the demo config's knobs)
        self.proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        return {**super().env(), **self.environ}

    def start(self) -> subprocess.Popen[bytes]:
        self.proc = super().start()
        return self.proc

    def stop(self, proxy: bool = False) -> None:
        """Stop the hub (and the proxy too, when asked; else the next start finds the proxy by its pid file and
        replaces it, as JupyterHub does)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)
        if proxy:
            super().stop()

    def kill(self) -> None:
        """SIGKILL the hub (its proxy runs on until the next start replaces it, as after a crash)."""
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

    def route(self, user: str = USER) -> dict[str, Any] | None:
        """The proxy's route to ``user``'s default server, if it has one (keyed by the user's origin, then path)."""
        routes = self.api("GET", "/proxy")[1]
        return next((route for key, route in routes.items() if key.endswith(f"/user/{user}/")), None)


CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def logged_in_page(playwright: Any, hub: Hub, user: str = USER) -> tuple[Any, Any]:
    """Headless Chromium logged in to ``hub`` as ``user``: (browser, page)."""
    browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", PASSWORD)
    page.click("#login_submit")
    return browser, page


def demo_config_with(folder: Path, settings: str) -> Path:
    """A hub config in ``folder``: the demo's, then ``settings`` (lines of config a test changes)."""
    path = folder / "hub_config.py"
    path.write_text(f"load_subconfig({str(DEMO_CONFIG)!r})\n{settings}\n")
    return path


def progress_events(hub: Hub, user: str = USER, timeout: float = 60, server: str = "") -> Iterator[dict[str, Any]]:
    """The events of the spawn progress stream of ``user``'s server (``server``: a named one), read as the spawn page
    reads them (with the hub's admin token); an HTTPError when there is no start to watch."""
    path = f"/servers/{server}/progress" if server else "/server/progress"
    url, host = loopback(f"{hub.url}/hub/api/users/{user}{path}")
    request = Request(url, headers={"Authorization": f"token {hub.token}", "Accept": "text/event-stream", **host})
    with urlopen(request, timeout=timeout) as stream:
        for line in stream:
            if line.startswith(b"data:"):
                yield json.loads(line[5:])


@contextlib.contextmanager
def every_gpu_held(tmp_path: Path) -> Iterator[None]:
    """A job holding every GPU of both nodes while the block runs; a server's job waits behind it."""
    release = tmp_path / "release"
    blocker = slurm.submit(["-N2", "--gpus-per-node=4", "--partition=debug", f"--output={tmp_path}/b.out",
                            "--wrap", f"while [ ! -e {release} ]; do sleep 0.2; done"])
    try:
        wait_until(lambda: slurm.job_info(blocker)["JobState"] == "RUNNING", timeout=60, what="the blocker job")  # type: ignore[index]
        yield
    finally:
        release.touch()
        subprocess.run(["scancel", str(blocker)], timeout=30, check=False)


def server_token(user: str, job: str) -> str:
    """The hub token ``user``'s server in Slurm job ``job`` holds (JUPYTERHUB_API_TOKEN in its environment, which
    its user can read)."""
    uid = pwd.getpwnam(user).pw_uid

    def found() -> str | None:
        for proc in Path("/proc").iterdir():
            try:
                if not proc.name.isdigit() or proc.stat().st_uid != uid:
                    continue
                text = (proc / "environ").read_text(errors="replace")
                env = dict(item.split("=", 1) for item in text.split("\0") if "=" in item)
            except OSError:
                continue
            if env.get("SLURM_JOB_ID") == job and env.get("JUPYTERHUB_API_TOKEN"):
                return env["JUPYTERHUB_API_TOKEN"]
        return None

    return wait_until(found, timeout=30, what=f"{user}'s server token")


def as_user(user: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``user`` (their uid, gid and groups; a clean environment, with the cluster's SLURM_CONF and
    PATH, whose Slurm client may be the dev cluster's own)."""
    return subprocess.run(["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--reset-env",
                           "env", f"SLURM_CONF={os.environ['SLURM_CONF']}", f"PATH={os.environ['PATH']}", *argv],
                          capture_output=True, text=True, timeout=timeout)
