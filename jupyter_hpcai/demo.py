"""The main job: a local Slurm, the tf-horovod-cpu env and its kernel, a hub with a demo user; `--check` walks
the whole path headless (spawn a 2-node server, run the demo notebook's cells: Horovod training on 4 ranks, stop)."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import kernelspec, paths
from .asuser import as_user
from .devcluster import DevCluster
from .devcluster.accounting import PROJECTS
from .envs import Builder, EnvStore, load_recipe, open_env
from .errors import HPCAIError
from .paths import open_private, private_dir, write_private
from .proc import wait_until
from .scheduler import chosen
from .scheduler.interface import TERMINAL_STATES

scheduler = chosen()
REPO = Path(__file__).resolve().parents[1]
DEMO_CONFIG = REPO / "spawner_config" / "demo_config.py"
DEMO_USER = "hpcai-demo"
HUB_HOST = "hub.localhost"  # the demo hub's name (each user's server on <user>.hub.localhost): browsers resolve it
Say = Callable[[str], None]


class HubProcess:
    """JupyterHub with spawner_config/demo_config.py, as a process of its own (it outlives this command)."""

    def __init__(self, state: Path, port: int, internal_port: int | None = None, proxy_api_port: int | None = None,
                 password: str = "", token: str = "", users: tuple[str, ...] = (DEMO_USER,),
                 config: Path = DEMO_CONFIG) -> None:
        self.state, self.port, self.users, self.config = state, port, users, config
        # unset: from the environment (the tests choose free ports), else next to the public port
        self.internal_port = internal_port or int(os.environ.get("HPCAI_HUB_INTERNAL_PORT") or port + 1)
        self.proxy_api_port = proxy_api_port or int(os.environ.get("HPCAI_PROXY_API_PORT") or port + 2)
        self.host = HUB_HOST
        self.url = f"http://{self.host}:{port}"  # what a browser opens; the users' servers on subdomains of it
        self.password, self.token = password, token
        self.log = state / "hub.log"

    def env(self) -> dict[str, str]:
        return {**os.environ, "HPCAI_HUB_DIR": str(self.state), "HPCAI_HUB_PORT": str(self.port),
                "HPCAI_HUB_INTERNAL_PORT": str(self.internal_port), "HPCAI_PROXY_API_PORT": str(self.proxy_api_port),
                "HPCAI_HUB_HOST": self.host, "HPCAI_HUB_API_TOKEN": self.token, "HPCAI_DEMO_PASSWORD": self.password,
                "HPCAI_DEMO_USERS": ",".join(self.users)}

    def start(self) -> subprocess.Popen[bytes]:
        private_dir(self.state)
        with open_private(self.log, "a") as out:
            proc = subprocess.Popen([str(Path(sys.executable).parent / "jupyterhub"), "-f", str(self.config)],
                                    cwd=self.state, env=self.env(),
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        (self.state / "hub.pid").write_text(str(proc.pid))
        try:
            wait_until(lambda: self.answers() or proc.poll() is not None, timeout=120, what="the hub to answer")
        except HPCAIError:
            HubProcess.stop(self)
            raise HPCAIError(f"the hub did not answer at {self.url} within 120 s; it and its proxy were stopped",
                             f"see {self.log}") from None
        if proc.poll() is not None:
            HubProcess.stop(self)  # its proxy: JupyterHub stops it only from the handlers a successful start installs
            raise start_failure(self.log.read_text(errors="replace"), self.log)
        return proc

    def stop(self) -> list[str]:
        """Stop the hub and its proxy (by their pid files) and wait until both are gone; what was running."""
        stopped = []
        for name, program in (("hub", "jupyterhub"), ("proxy", "configurable-http-proxy")):
            pid_file = self.state / f"{name}.pid"
            try:
                pid = int(pid_file.read_text())
            except (OSError, ValueError):
                continue
            if _running(pid, program):  # a stale pid file may name another process by now
                os.kill(pid, signal.SIGTERM)
                wait_until(lambda: not _running(pid, program), timeout=30, what=f"the {name} (pid {pid}) to exit")
                stopped.append(f"{name} (pid {pid})")
            pid_file.unlink(missing_ok=True)
        return stopped

    def answers(self) -> bool:
        try:
            return self.api("GET", "/")[0] == 200
        except OSError:
            return False

    def api(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        return request(f"{self.url}/hub/api{path}", token or self.token, method, body)

    def server(self, user: str) -> dict[str, Any] | None:
        return self.api("GET", f"/users/{user}")[1]["servers"].get("")

    def wait_ready(self, user: str, timeout: float = 300) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            server = self.server(user)
            if server is None:
                raise HPCAIError(f"the server of {user} stopped", f"see {self.log}")
            return server if server["ready"] else None

        return wait_until(ready, timeout=timeout, what=f"{user}'s server to be ready")

    def user_url(self, user: str, server: str = "") -> str:
        """The URL of ``user``'s server (``server``: a named one) as the hub names it, without the trailing slash: on
        the user's own origin (subdomain_host), or below the hub's where a config serves all on one."""
        found = (self.api("GET", f"/users/{user}")[1] or {}).get("servers", {}).get(server)
        if not found:
            raise HPCAIError(f"{user} has no server {server!r} on this hub", f"start it first; see {self.log}")
        url = str(found["url"]).rstrip("/")
        return url if "://" in url else f"http://{self.host}:{self.port}{url}"

    def stop_server(self, user: str) -> None:
        self.api("DELETE", f"/users/{user}/server")
        wait_until(lambda: self.server(user) is None, timeout=120, what=f"{user}'s server to stop")

    def user_token(self, user: str) -> str:
        status, body = self.api("POST", f"/users/{user}/tokens", {"note": "hpcai", "expires_in": 3600})
        if status != 201:
            raise HPCAIError(f"could not create a token for {user}: {body}")
        return str(body["token"])


def start_failure(log: str, path: Path) -> HPCAIError:
    """Why a hub exited at start, from its log: an address it could not listen on named, with what to check."""
    hub = re.search(r"Failed to bind hub to (\S+)", log)
    proxy = re.search(r"(EADDRINUSE|EADDRNOTAVAIL)[^\n]*?(\S+:\d+)\s*$", log, re.MULTILINE)
    if hub or proxy:
        errno = re.findall(r"\[Errno \d+\] ([^\n]+)", log)
        where = f"its API on {hub.group(1)}" if hub else f"its proxy on {proxy.group(2)}"  # type: ignore[union-attr]
        why = errno[-1] if hub and errno else proxy.group(1) if proxy else "see the log"
        return HPCAIError(f"the hub could not listen: {where} ({why}); it and its proxy were stopped",
                          "check that the address is this host's (ip -brief address; the dev cluster's bridge is "
                          "there only while the cluster is up: hpcai devcluster status) and that nothing else "
                          f"listens on the port (ss -ltnp); the hub's log: {path}")
    return HPCAIError(f"the hub exited at start; it and its proxy were stopped:\n{log[-2000:]}", f"see {path}")


def _running(pid: int, program: str) -> bool:
    """Whether ``pid`` is a live (not zombie) process whose command line names ``program``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return program.encode() in cmdline and state != "Z"


def loopback(url: str) -> tuple[str, dict[str, str]]:
    """``url`` as this host opens it, and the Host header it needs: a ``*.localhost`` name (the demo hub's, and each
    user's origin below it) is loopback, as browsers resolve it; the C library does not resolve it."""
    parts = urllib.parse.urlsplit(url)
    name = parts.hostname or ""
    if name != "localhost" and not name.endswith(".localhost"):
        return url, {}
    return parts._replace(netloc=f"127.0.0.1:{parts.port or 80}").geturl(), {"Host": parts.netloc}


def request(url: str, token: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    """A JSON request with a token header (never in the URL): (status, decoded body; {"message": text} when not JSON)."""
    url, host = loopback(url)
    req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json",
                                          **host})
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


async def execute(base_url: str, token: str, kernel_id: str, code: str, timeout: float = 60) -> dict[str, Any]:
    """Run ``code`` in a Jupyter server's kernel over its websocket: {"status", "stdout", "error"}."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    ws_url, host = loopback(base_url.replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels")
    conn = await websocket_connect(HTTPRequest(ws_url, headers={"Authorization": f"token {token}", **host}))
    msg_id = uuid.uuid4().hex
    conn.write_message(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "hpcai", "session": uuid.uuid4().hex,
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
            kind, content = msg["header"]["msg_type"], msg["content"]
            if kind == "stream":
                result["stdout"] += content["text"]
            elif kind == "error":
                result["error"] = f"{content['ename']}: {content['evalue']}"
            elif kind == "execute_reply":
                result["status"] = content["status"]
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True

    try:
        await asyncio.wait_for(read(), timeout)
    finally:
        conn.close()
    return result


def ensure_user(name: str, projects: tuple[str, ...] | None = None) -> None:
    """The unix user ``name``, made if missing; another process making users at once (it holds /etc/passwd's lock,
    or made this one first) is waited for. Where the dev cluster keeps accounting, the user gets associations with
    ``projects`` (default: its first), as a site's admin gives each new user."""

    def made() -> bool:
        try:
            return bool(pwd.getpwnam(name))
        except KeyError:
            return subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name],
                                  capture_output=True, timeout=60).returncode == 0

    wait_until(made, timeout=60, what=f"the user {name} to exist (useradd)")
    cluster = DevCluster.load()
    if cluster.running():
        cluster.enrol(name, projects)


def prepare(say: Say) -> HubProcess:
    """Dev cluster up, env built (or reused) with its kernel, demo user, hub running. The env builds in a thread
    while the user, the examples and the hub (which do not need it) come up; each phase says how long it took."""
    running = DevCluster.load()  # the one in HPCAI_DEVCLUSTER_DIR as it was set up, when it runs
    cluster = running if running.running() else DevCluster()
    with timed(say, "dev cluster"):
        cluster.up()
    os.environ.update(cluster.variables())  # before the env's build starts: threads share the environment
    os.environ.setdefault("HPCAI_DEMO_NOTEBOOK", "demo.ipynb")  # the demo hub opens JupyterLab on it
    say(f"dev cluster up: {', '.join(n for n in cluster.node_names)} ({cluster.gpus_per_node} fake GPUs each)")
    with ThreadPoolExecutor(1, thread_name_prefix="hpcai-demo-env") as pool:
        building = pool.submit(_build_env, say)
        with timed(say, "demo user, examples and hub"):
            ensure_user(DEMO_USER, PROJECTS)  # in both projects: the form offers a choice of account
            for line in copy_examples(DEMO_USER):
                say(line)
            state = paths.hub_dir()
            hub = HubProcess(state, int(os.environ.get("HPCAI_HUB_PORT", "8000")), password=_secret(state, "password"),
                             token=_secret(state, "api_token"))
            if not hub.answers():
                hub.start()
            hub.api("POST", f"/users/{DEMO_USER}")
        building.result()
    return hub


def _build_env(say: Say) -> None:
    """The tf-horovod-cpu env, a site env (every user of the hub, and `hpcai env list`, find it without settings),
    and its kernel."""
    with timed(say, "env tf-horovod-cpu"):
        result = Builder(load_recipe(REPO / "recipes" / "tf-horovod-cpu.yaml"), store=EnvStore(), site=True,
                         progress=lambda e: say(f"  env {e.phase}: {e.message}") if e.state == "done" else None).run()
        say(f"env tf-horovod-cpu {'reused' if result.up_to_date else 'built'}: {result.build.prefix}")
        spec = kernelspec.install(open_env(result.env_dir), prefix=sys.prefix, display_name="Python (tf-horovod-cpu)")
        say(f"kernel installed: {spec}")


@contextmanager
def timed(say: Say, phase: str) -> Iterator[None]:
    """Say how long ``phase`` took once it is done."""
    start = time.monotonic()
    yield
    say(f"[{phase}: {time.monotonic() - start:.0f} s]")


# copy_examples' program, run as the user in their home: every read and write there is the user's own, a link is
# never followed (a notebook at a link counts as changed; a link at the record is replaced), each file is replaced
# whole (a temporary file, then os.replace); one JSON line per example: {"name", "copied"}.
_COPY_EXAMPLES = r"""
import hashlib, json, os, stat, sys, uuid

def read(name):
    # name's bytes when it is a regular file, None when absent; OSError for anything else (a link, a folder)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{name} is not a regular file")
        return f.read()

def replace(name, blob):
    tmp = f".{name}.{uuid.uuid4().hex}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666), "wb") as out:
        out.write(blob)
    os.replace(tmp, name)

data = json.load(sys.stdin)
os.chdir(data["home"])
try:
    copied = json.loads(read(data["record"]) or "{}")
except (OSError, ValueError):
    copied = {}
copied = copied if isinstance(copied, dict) else {}
for name, text in data["examples"].items():
    blob = text.encode()
    try:
        have = read(name)
        kept = have is not None and hashlib.sha256(have).hexdigest() != copied.get(name)
    except OSError:
        kept = True
    if not kept:
        replace(name, blob)
        copied[name] = hashlib.sha256(blob).hexdigest()
    print(json.dumps({"name": name, "copied": not kept}))
replace(data["record"], json.dumps(copied).encode())
"""


def copy_examples(user: str) -> list[str]:
    """Put examples/*.ipynb into ``user``'s home, refreshed on each run, never over a copy the user changed
    (the hashes of what was copied are kept beside them); what was done, one line each. Root only reads the
    examples: the home is read and written as the user (_COPY_EXAMPLES), so their files are already theirs."""
    home = Path(pwd.getpwnam(user).pw_dir)
    examples = {p.name: p.read_text(encoding="utf-8") for p in sorted((REPO / "examples").glob("*.ipynb"))}
    replies = as_user(user, _COPY_EXAMPLES, {"home": str(home), "record": ".hpcai-examples.json",
                                             "examples": examples}, hint=f"{home} must be a folder {user} can write")
    return [f"example notebook: {home / r['name']}" if r["copied"] else
            f"kept {home / r['name']}: changed since it was copied (delete it to get the current example)"
            for r in replies if r["name"] in examples]  # only the names sent: the user's process may be tampered with


def _secret(state: Path, name: str) -> str:
    path = private_dir(state) / name
    if not path.exists():
        write_private(path, secrets.token_hex(12))
    return path.read_text().strip()


NOTEBOOK = REPO / "examples" / "demo.ipynb"
# What each code cell of the demo notebook must show, in the notebook's order: (step, the cell's first line,
# patterns that must all match its output; the step's line shows the first one's match). The check runs the
# notebook's own cells, the ones the tutorial shows.
NOTEBOOK_CHECKS = [
    ("load the extension", "%load_ext jupyter_hpcai", []),
    ("open the panel", "%hpc panel", []),
    ("a Horovod world of 4 ranks, its output collapsed", "%%horovod_run --output collapse",
     [r"^\[all 4 ranks\] Horovod world of 4 ranks$"]),
    ("train a small Keras model on 4 ranks", "%%horovod_run --output rank0 --timeout 900",
     [r"\d+ samples/sec on 4 ranks$"]),
    ("the status of the 4 ranks", "%hpc status",
     [r"^\s*3\s+n2\b.*\byes$", r"^\s*0\s+n1\b.*\byes$", r"^\s*1\s+n1\b.*\byes$", r"^\s*2\s+n2\b.*\byes$"]),
    ("stop the engines", "%hpc stop", [r"^engines stopped$"]),
]
CELL_SECONDS = 960  # the longest a cell may run: the training cell's own --timeout, and a margin


def notebook_cells(notebook: Path) -> list[str]:
    """The code cells of ``notebook``, as the user runs them."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells if c["cell_type"] == "code"]


def check_cells(notebook: Path = NOTEBOOK) -> list[tuple[str, str, list[str]]]:
    """The check's cells: where JupyterLab opens, then every code cell of the demo notebook with what it must show
    (an error names a cell the check does not know)."""
    cells = notebook_cells(notebook)
    firsts = [cell.splitlines()[0] if cell.strip() else "" for cell in cells]
    known = [first for _, first, _ in NOTEBOOK_CHECKS]
    if firsts != known:
        raise HPCAIError(f"the code cells of {notebook} begin {firsts}, and the demo check knows {known}",
                         "say what each cell's output must show in jupyter_hpcai.demo.NOTEBOOK_CHECKS")
    opens = ("JupyterLab opens the demo notebook", "import os; print(os.environ.get('JUPYTERHUB_DEFAULT_URL'))",
             [r"^/lab/tree/demo\.ipynb$"])
    return [opens] + [(name, code, expect) for (name, _, expect), code in zip(NOTEBOOK_CHECKS, cells)]


def _shown(result: dict[str, Any], expect: list[str]) -> tuple[bool, str]:
    """Whether a cell ran and showed what it must; what its step's line says (what is missing, when not)."""
    if result["status"] != "ok":
        return False, str(result["error"])
    out = result["stdout"].strip()
    found = [re.search(pattern, out, re.M) for pattern in expect]
    if all(found):
        return True, found[0].group(0).strip() if found else ""
    missing = ", ".join(f"`{p}`" for p, f in zip(expect, found) if not f)
    return False, f"no line matches {missing}; its output ended: " + " | ".join(out.splitlines()[-5:])


def check(hub: HubProcess, say: Say) -> int:
    """Walk the path headless; print each step's result; return the number of failed steps."""
    failures = 0
    cells = check_cells()  # a notebook the check does not know fails before anything starts

    def step(name: str, ok: bool, detail: str = "") -> None:
        nonlocal failures
        failures += not ok
        say(f"[{'ok' if ok else 'FAILED'}] {name}" + (f": {detail}" if detail else ""))

    status, body = hub.api("POST", f"/users/{DEMO_USER}/server", {"profile": "2 nodes x 2 GPUs", "nodes": 2,
                                                                   "gpus_per_node": 2})
    step("spawn a 2-node server through the REST API", status in (201, 202), "" if status in (201, 202) else str(body))
    if status not in (201, 202):
        return failures
    job: dict[str, str] = {}
    try:
        hub.wait_ready(DEMO_USER)
        job = _job_of(DEMO_USER)
        nodes = scheduler.expand_hostlist(job.get("NodeList", ""))
        step("server ready", job.get("JobState") == "RUNNING" and len(nodes) == 2,
             f"Slurm job {job.get('JobId', '(none)')} {job.get('JobState', 'not found').lower()} on {', '.join(nodes)}")
        base, token = hub.user_url(DEMO_USER), hub.user_token(DEMO_USER)
        kernel = request(f"{base}/api/kernels", token, "POST", {"name": "hpcai-tf-horovod-cpu"})[1] or {}
        step("open a kernel from the tf-horovod-cpu env", "id" in kernel, kernel.get("message", ""))
        if "id" not in kernel:
            return failures
        for name, code, expect in cells:
            try:
                result = asyncio.run(execute(base, token, kernel["id"], code, timeout=CELL_SECONDS))
            except TimeoutError:
                step(name, False, f"no answer within {CELL_SECONDS} s")
                break
            step(name, *_shown(result, expect))
        request(f"{base}/api/kernels/{kernel['id']}", token, "DELETE")
    finally:
        hub.stop_server(DEMO_USER)
        if job:
            ended = _ended(job["JobId"])
            step("stop the server", ended is not None, f"job {job['JobId']} {ended or 'still there'}")
    return failures


def _job_of(user: str) -> dict[str, str]:
    """scontrol's record of the one job ``user`` has in the queue ({} when none)."""
    jobs = scheduler.user_jobs(user)
    return (scheduler.job_info(jobs[0]) or {}) if len(jobs) == 1 else {}


def _ended(job_id: str, timeout: float = 60) -> str | None:
    """How the job ended, as Slurm says it ("CANCELLED", "COMPLETED", or "gone from Slurm"); None if it still runs."""
    def state() -> str | None:
        info = scheduler.job_info(job_id)
        if info is None:
            return "gone from Slurm"
        return info["JobState"] if info["JobState"] in TERMINAL_STATES else None

    try:
        return wait_until(state, timeout=timeout, what=f"job {job_id} to end")
    except HPCAIError:
        return None


def stop(say: Say) -> None:
    """Stop what `hpcai demo` started: the hub and its proxy, then the dev cluster (which cancels every job,
    the notebook servers' too). Harmless when nothing runs."""
    for what in HubProcess(paths.hub_dir(), 0).stop():
        say(f"stopped the {what}")
    cluster = DevCluster.load()
    jobs = scheduler.user_jobs("", env={**os.environ, **cluster.variables()}) if cluster.running() else []
    cluster.down()
    say(f"dev cluster stopped ({len(jobs)} job(s) cancelled)" if jobs else "dev cluster stopped")
