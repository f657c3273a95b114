"""The notebook job's server start (hpcai-singleuser): the real jupyterhub-singleuser reports its port to the hub
only once it listens there, and never a port another process holds; the hub's check of what answers on that port
(HPCSlurmSpawner._wait_until_listening) takes only the server that proves it holds the server's token. The hub here
is a small HTTP endpoint of the test's (on loopback) that records the report and, as it arrives, looks at who
listens on the reported port; the check is the real spawner's, made from the demo config."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from batchspawner import JobStatus
from jupyterhub.objects import Server

from helpers.record import attack
from helpers.sockets import Listener, listeners
from jupyter_hpcai.errors import HPCAIError
from jupyter_hpcai.proc import wait_until
from jupyter_hpcai.spawner import liveness
from jupyter_hpcai.spawner.spawner import offline_spawner

LAUNCHER = str(Path(sys.executable).parent / "hpcai-singleuser")
DEMO = Path(__file__).resolve().parents[1] / "spawner_config" / "demo_config.py"
SERVER = str(Path(sys.executable).parent / "jupyterhub-singleuser")


def _listeners(port: int | None = None) -> list[Listener]:
    """The sockets listening on TCP ``port`` (any port: None), IPv4 and IPv6."""
    return [found for table in ("/proc/net/tcp", "/proc/net/tcp6") for found in listeners(Path(table).read_text(), port)]


def _listening_ports_of(pid: int) -> set[int]:
    mine = _sockets_of(pid)
    return {found.port for found in _listeners() if found.inode in mine}


def _sockets_of(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


class JSONHandler(BaseHTTPRequestHandler):
    """Answers with JSON, logs nothing."""

    def _answer(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, int]:
    """``handler`` served on a loopback port, in a thread: the server and its port."""
    http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    return http, http.server_address[1]


class FakeHub:
    """POST /hub/api/batchspawner records the port and, at that moment, which pids' sockets listen on it."""

    def __init__(self, token: str) -> None:
        self.token = token  # the server's own
        self.reports: list[dict[str, object]] = []
        self.server_pid = 0
        hub = self

        class Handler(JSONHandler):
            def do_GET(self) -> None:  # the server's version check and the like
                self._answer(200, {"version": "6.1.1"})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/hub/api/batchspawner":
                    port = json.loads(body)["port"]
                    held = {found.inode for found in _listeners(port)}
                    hub.reports.append({"port": port, "token": self.headers.get("Authorization") == f"token {token}",
                                        "listening": bool(held),
                                        "by_server": bool(held) and held <= _sockets_of(hub.server_pid)})
                    self._answer(201, {"message": "port recorded"})
                else:
                    self._answer(200, {})

        self.http, self.port = _serve(Handler)


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    fake = FakeHub(secrets.token_hex(16))
    yield fake
    fake.http.shutdown()


def _start(hub: FakeHub, token: str, service_port: int, tmp_path: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "JUPYTERHUB_API_TOKEN": token, "JUPYTERHUB_API_URL": f"http://127.0.0.1:{hub.port}/hub/api",
           "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{service_port}/user/alice/",
           "JUPYTERHUB_SERVICE_PREFIX": "/user/alice/", "JUPYTERHUB_BASE_URL": "/", "JUPYTERHUB_USER": "alice",
           "JUPYTERHUB_CLIENT_ID": "jupyterhub-user-alice", "JUPYTERHUB_HOST": "",
           "JUPYTERHUB_OAUTH_CALLBACK_URL": "/user/alice/oauth_callback", "HOME": str(tmp_path),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}
    return subprocess.Popen([LAUNCHER, SERVER, "--allow-root", f"--ServerApp.root_dir={tmp_path}"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path)


def test_the_server_reports_the_port_it_listens_on_never_one_another_holds(hub: FakeHub, tmp_path: Path) -> None:
    """bob listens on the port in alice's JUPYTERHUB_SERVICE_URL (where a server that retried ports would have gone
    elsewhere while the hub routed her to bob): her server reports the port its own socket listens on."""
    bob = socket.create_server(("127.0.0.1", 0))
    server = _start(hub, hub.token, bob.getsockname()[1], tmp_path)
    hub.server_pid = server.pid
    try:
        report = wait_until(lambda: hub.reports[0] if hub.reports or server.poll() is not None else None,
                            timeout=90, what="alice's server to report its port")
        out = b""
        if server.poll() is not None:
            out = server.stdout.read() if server.stdout else b""
        assert hub.reports, out.decode(errors="replace")
        port = report["port"]
        attack("bob holds the port in alice's service URL: her server reports his port",
               port != bob.getsockname()[1], f"she reported {port}, bob holds {bob.getsockname()[1]}")
        attack("alice's server reports a port before it listens there (another could take it meanwhile)",
               bool(report["listening"]) and bool(report["by_server"]),
               f"at the report, port {port} was {'listened on by her server' if report['by_server'] else 'not hers'}")
        assert report["token"], "the report carries the server's own token"
        assert len(hub.reports) == 1
        with socket.create_connection(("127.0.0.1", int(port)), timeout=5):  # control: she is reachable there
            pass
    finally:
        server.terminate()
        server.wait(timeout=30)
        bob.close()


def test_a_server_the_hub_refuses_stops(hub: FakeHub, tmp_path: Path) -> None:
    """A report the hub does not take (403 here) stops the server: its job ends and the spawn fails
    with the job's log, instead of waiting out the start timeout."""

    def refuse(self: BaseHTTPRequestHandler) -> None:
        self.send_response(403)
        self.end_headers()

    hub.http.RequestHandlerClass.do_POST = refuse  # type: ignore[attr-defined]
    server = _start(hub, hub.token, 1, tmp_path)
    try:
        code = server.wait(timeout=90)
    finally:
        if server.poll() is None:
            server.kill()
    out = server.stdout.read().decode(errors="replace") if server.stdout else ""
    assert "the hub refused the report of port" in out and "HTTP 403" in out, out
    assert code is not None


def test_a_report_the_hub_may_have_recorded_keeps_the_port(hub: FakeHub, tmp_path: Path) -> None:
    """The hub reads the report and the connection drops before its answer; the repeated report is refused (the
    port was recorded). The server keeps listening there: a port given up after the hub recorded it is one bob
    could bind and have alice routed to."""
    tries: list[int] = []

    def record_then_drop(self: BaseHTTPRequestHandler) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        tries.append(1)
        if len(tries) == 1:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.send_response(400)
        self.send_header("Content-Length", "0")
        self.end_headers()

    hub.http.RequestHandlerClass.do_POST = record_then_drop  # type: ignore[attr-defined]
    server = _start(hub, hub.token, 1, tmp_path)
    hub.server_pid = server.pid
    try:
        wait_until(lambda: len(tries) >= 2 or server.poll() is not None or None, timeout=90, what="a repeated report")
        time.sleep(2)  # what the server does with the refusal
        still = server.poll() is None and bool(_listening_ports_of(server.pid))
        attack("a report whose answer was lost frees the port the hub recorded", still,
               "her server still listens" if still else f"her server exited ({server.poll()}) or stopped listening")
    finally:
        server.terminate()
        out = server.communicate(timeout=30)[0].decode(errors="replace")
    assert "keeps listening there" in out, out


class Squatter:
    """bob's process on a port: answers every GET with a made-up proof (bob does not have alice's token)."""

    def __init__(self) -> None:
        class Handler(JSONHandler):
            def do_GET(self) -> None:
                self._answer(200, {"proof": "0" * 64})

        self.http, self.port = _serve(Handler)


def _poller(conf: Path, state: dict[str, object], port: int, slurm_says: str = "RUNNING") -> tuple[Any, list[str]]:
    """A restarted hub's spawner of alice's job (no token: JupyterHub keeps none across a restart, only the saved
    digest), its server recorded on ``port``; Slurm says ``slurm_says`` of the job, and cancels are recorded."""
    spawner = offline_spawner(conf, "alice")
    spawner.load_state(state)
    spawner.job_id, spawner.api_token = "4242", ""
    cancelled: list[str] = []

    async def query() -> JobStatus:  # as HPCSlurmSpawner.query_job_status reads Slurm's states
        spawner.job_status = f"{slurm_says} n1"
        return {"RUNNING": JobStatus.RUNNING, "COMPLETING": JobStatus.RUNNING,
                "STOPPED": JobStatus.UNKNOWN}.get(slurm_says, JobStatus.PENDING)

    async def cancel() -> None:
        cancelled.append(spawner.job_id)

    spawner.query_job_status, spawner.cancel_batch_job = query, cancel
    spawner.server = Server(ip="127.0.0.1", port=port, base_url="/user/alice/")
    return spawner, cancelled


def test_the_hub_routes_only_to_the_server_that_proves_its_token(hub: FakeHub, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """bob answers on the port alice's server reported (as he could on a port her server gave up): the hub's check
    fails her start instead of routing her to him. Once her server runs, the hub's poll (a restarted hub's too)
    ends her job when her server is gone from its port while the job lives on (an epilogue, a requeue): at once
    when bob answers there, or when Slurm no longer says the job runs (COMPLETING, requeued: its port is free to
    take); after SILENT_FOR (shortened here) when nothing listens or bob holds the port and stays silent on the
    probe. Controls: her real server passes both checks; a suspended or stopped job is kept, not probed."""
    monkeypatch.setattr(liveness, "SILENT_FOR", 1.0)
    conf = tmp_path / "conf.py"
    conf.write_text(f"c = get_config()\nload_subconfig({str(DEMO)!r})\n")
    spawner = offline_spawner(conf, "alice")
    spawner.api_token, spawner.ip = hub.token, "127.0.0.1"
    bob, silent, free = Squatter(), socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    free_port = free.getsockname()[1]
    free.close()  # nothing listens there
    server = _start(hub, hub.token, 1, tmp_path)
    hub.server_pid = server.pid
    try:
        spawner.port = bob.port
        with pytest.raises(HPCAIError) as refused:
            asyncio.run(spawner._wait_until_listening())
        attack("bob answers on the port alice's server reported: the hub routes her to him",
               "is not that server" in refused.value.message, refused.value.message[:120])
        report = wait_until(lambda: hub.reports[0] if hub.reports or server.poll() is not None else None,
                            timeout=90, what="alice's server to report its port")
        spawner.port = int(report["port"])  # type: ignore[call-overload]
        asyncio.run(spawner._wait_until_listening())  # returns: her server proved it holds her token
        state = spawner.get_state()
        hers, cancelled = _poller(conf, state, spawner.port)
        assert [asyncio.run(hers.poll()) for _ in range(3)] == [None] * 3 and cancelled == []
        for held in ("SUSPENDED", "STOPPED"):  # its processes live on, stopped: they hold the port, cannot answer
            suspended, cancelled = _poller(conf, state, bob.port, held)
            assert asyncio.run(suspended.poll()) is None and cancelled == [], held
        for ended, cancels in (("COMPLETING", []), ("PENDING", ["4242"])):  # her server ended; a requeue runs again
            gone, cancelled = _poller(conf, state, spawner.port, ended)
            polled = asyncio.run(gone.poll())
            attack(f"alice's job is {ended} after her server ended: the hub keeps routing her to its port",
                   polled == 1 and cancelled == cancels and gone.job_id == "",
                   f"the hub's poll answered {polled} at once; jobs cancelled: {cancelled}")
        for who, port in (("bob answers on its port", bob.port), ("nothing listens on its port", free_port),
                          ("bob holds its port and stays silent on the probe", silent.getsockname()[1])):
            gone, cancelled = _poller(conf, state, port)
            polls = [asyncio.run(gone.poll())]
            if polls[0] is None:  # no answer: ended only once SILENT_FOR has passed without a proof
                time.sleep(1.1)
                polls.append(asyncio.run(gone.poll()))
            attack(f"alice's server is gone and {who}: the hub keeps routing her there",
                   polls[-1] == 1 and cancelled == ["4242"] and (len(polls) == 1) == (who.startswith("bob answers")),
                   f"the hub's polls answered {polls}; jobs cancelled: {cancelled}")
    finally:
        bob.http.shutdown()
        silent.close()
        server.terminate()
        server.wait(timeout=30)


# What the server imports before it can listen (jupyterhub-singleuser, and JupyterLab's server extension), timed in a
# fresh interpreter; then a schema that checks an IRI, as jupyter_events' would.
IMPORTS = r"""
import json, sys, time
{defer}
start = time.perf_counter()
import jupyterhub.singleuser, jupyterlab.labapp
took = time.perf_counter() - start
loaded = "lark" in sys.modules  # rfc3987_syntax's parser generator
from jsonschema import Draft202012Validator, FormatChecker
check = Draft202012Validator({{"type": "string", "format": "iri"}}, format_checker=FormatChecker())
print(json.dumps({{"took": took, "loaded": loaded, "valid": check.is_valid("http://例え.jp/パス?q=1"),
                  "invalid": check.is_valid("http://a b/"), "real": type(sys.modules["rfc3987_syntax"]).__name__}}))
"""
DEFER = "from jupyter_hpcai.server.deferred import defer_rfc3987_syntax; defer_rfc3987_syntax()"


def _server_imports(deferred: bool) -> dict[str, Any]:
    code = IMPORTS.format(defer=DEFER if deferred else "")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_the_server_builds_the_iri_grammar_only_when_a_schema_checks_an_iri(bench: list[str]) -> None:
    """hpcai-singleuser defers rfc3987_syntax (server/deferred.py): the server's imports build no grammar parser,
    and an IRI format check still answers right, with the real module from then on. Printed: the imports' time
    against the same imports that build it (alternating)."""
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for i in range(4):
        for deferred in (True, False) if i % 2 else (False, True):
            runs[deferred].append(_server_imports(deferred))
    for deferred, found in runs.items():
        for run in found:
            assert run["loaded"] is not deferred, run  # deferred: no parser yet; else jsonschema built it
            assert run["valid"] is True and run["invalid"] is False and run["real"] == "module", run
    took = {deferred: statistics.median(run["took"] for run in found) for deferred, found in runs.items()}
    bench.append(f"notebook server's imports before it listens (jupyterhub.singleuser, JupyterLab): rfc3987_syntax "
                 f"deferred {took[True]:.2f} s / imported {took[False]:.2f} s = {took[True] / took[False]:.2f} "
                 "(4 rounds alternating, medians)")


def test_the_server_extension_loads_no_ipyparallel() -> None:
    """The server extension reads the job's engine sets as files (engines/listing.py): a server starts without
    ipyparallel (the engines package imports its names at first use), and the kernel's names are still there."""
    code = ("import sys, jupyter_hpcai.server, jupyter_hpcai.server.handlers\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'ipyparallel'))\n"
            "import jupyter_hpcai.engines as E\n"
            "print({'Engines', 'current', 'plan'} <= set(dir(E)))\n"  # tab completion lists them before their use
            "print(E.Engines.__module__, E.current.__module__, E.plan.__module__, 'ipyparallel' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.splitlines() == ["[]", "True", "jupyter_hpcai.engines.engines jupyter_hpcai.engines.engines "
                                              "jupyter_hpcai.engines.launch True"], done.stdout
    with pytest.raises(AttributeError, match="has no attribute 'Engine'"):
        __import__("jupyter_hpcai.engines").engines.Engine  # noqa: B018 - a misspelt name says so
