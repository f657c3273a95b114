"""Adversarial tests against the real hub (as root), Slurm and sudo: two unix users, alice and bob, hostile to each
other and to the site. Every attack is recorded with what was observed (conftest.attack) and must be blocked.

Each attack that could pass by accident has a control beside it: the same request by the right person succeeds
(alice's own token reaches her API, the right key reaches her controller, a plain failing job's log is shown)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from helpers.record import attack
from helpers.hub import BOB, USER, Hub, as_user, ensure_user, progress_events
from helpers.jupyter import Server, execute
from jupyter_hpcai import paths
from jupyter_hpcai.demo import loopback
from jupyter_hpcai.proc import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
BIN = Path(sys.executable).parent
LOGS = Path(".hpcai/logs")  # the demo hub's job log folder, in the user's home


def _chown(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def _home(user: str) -> Path:
    return Path(pwd.getpwnam(user).pw_dir)


@pytest.fixture
def readable_tmp() -> Iterator[Path]:
    """A folder every user can read (pytest's own are root's only)."""
    folder = Path(tempfile.mkdtemp(prefix="hpcai-security-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def bob(hub: Hub) -> str:
    ensure_user(BOB)
    hub.api("POST", f"/users/{BOB}")  # 201, or 409 when it exists
    return BOB


# -- what the hub reads and whom it spawns for -----------------------------------------------------------------

@dataclass
class Spawned:
    """What a failing spawn of alice's showed: the hub's words, its slowest answer to bob meanwhile, and what
    alice could read in the environments of her processes (the hub runs commands as her)."""

    said: str
    slowest: float
    tails: int  # alice's `tail` processes seen: the hub reading her log as her
    leaked: list[str]  # hub secrets found in an environment of one of alice's processes


def _hub_secrets(hub: Hub) -> dict[str, str]:
    """The hub's admin token and the proxy's auth token. JupyterHub puts the latter only into the environment it
    starts the proxy with, so it is read there (the proxy's pid file names it), never from the hub's own."""
    proxy = int((hub.state / "proxy.pid").read_text())
    environ = Path(f"/proc/{proxy}/environ").read_bytes().split(b"\0")
    found = dict(item.decode(errors="replace").split("=", 1) for item in environ if b"=" in item)
    token = found.get("CONFIGPROXY_AUTH_TOKEN", "")
    assert len(token) >= 32, "the proxy runs without an auth token of its own"
    return {"the hub's admin token": hub.token, "the proxy's auth token": token}


def _watch_alice(secrets_: dict[str, str], done: threading.Event, seen: dict[str, object]) -> None:
    """Read, as alice could, the environment of each of her processes until ``done``."""
    uid = pwd.getpwnam(USER).pw_uid
    tails: set[int] = set()
    leaked: set[str] = set()
    while not done.is_set():
        for proc in Path("/proc").iterdir():
            try:
                if not proc.name.isdigit() or proc.stat().st_uid != uid:
                    continue
                environ, cmdline = (proc / "environ").read_bytes(), (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"tail\0-c" in cmdline:
                tails.add(int(proc.name))
            leaked |= {what for what, value in secrets_.items() if value.encode() in environ}
        time.sleep(0.02)
    seen.update(tails=len(tails), leaked=sorted(leaked))


# how Slurm says a job whose log it could not open failed: 22.05 JobLaunchFailure, 24.11 RaisedSignal:53 (the step's
# own real-time signal)
LAUNCH_FAILED = re.compile(r"reason (JobLaunchFailure|RaisedSignal:\d+)")


def _failed_spawn(hub: Hub, target: Path) -> Spawned:
    """alice points the log paths of her next jobs at ``target`` (links in her own home), then spawns: Slurm
    cannot write the log there, so the job fails at launch, and the hub shows why with the log's last lines.
    What the hub said (REST reply and spawn progress), its slowest answer to bob meanwhile, what alice saw."""
    home, entry = _home(USER), pwd.getpwnam(USER)
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    next_id = int(re.search(r"NEXT_JOB_ID\s*=\s*(\d+)", config).group(1))  # type: ignore[union-attr]
    made = as_user(USER, "mkdir", "-p", "-m", "700", str(home / LOGS))
    assert made.returncode == 0, made.stderr
    links = [home / LOGS / f"jupyterhub-{n}.log" for n in range(next_id, next_id + 5)]
    for link in links:
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        os.lchown(link, entry.pw_uid, entry.pw_gid)
    slowest, done = 0.0, threading.Event()

    def other_user() -> None:
        nonlocal slowest
        while not done.is_set():
            start = time.monotonic()
            hub.api("GET", f"/users/{BOB}")
            slowest = max(slowest, time.monotonic() - start)
            time.sleep(0.2)

    seen: dict[str, object] = {}
    watchers = [threading.Thread(target=other_user, daemon=True),
                threading.Thread(target=_watch_alice, args=(_hub_secrets(hub), done, seen), daemon=True)]
    for watcher in watchers:
        watcher.start()
    said: list[str] = []
    try:
        status, body = hub.api("POST", f"/users/{USER}/server", {"profile": "1 node, 1 GPU (debug)"})
        said.append(json.dumps(body))
        if status < 400:
            said += _progress_until_failed(hub)
        wait_until(lambda: hub.server() is None, timeout=120, what="the failed spawn to clear")
    finally:
        done.set()
        for watcher in watchers:
            watcher.join(timeout=10)
        for link in links:
            link.unlink(missing_ok=True)
    return Spawned("\n".join(said), slowest, int(seen["tails"]), list(seen["leaked"]))  # type: ignore[call-overload]


def _progress_until_failed(hub: Hub, timeout: float = 120) -> list[str]:
    messages = []
    try:
        for event in progress_events(hub, USER, timeout):
            messages.append(event.get("message", ""))
            if event.get("failed") or event.get("ready"):
                break
    except urllib.error.HTTPError as err:  # the spawn ended before the stream opened
        messages.append(err.read().decode(errors="replace"))
    return messages


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Root's files that alice's links point at: one she may read, one only root may, a FIFO and a 2 GiB file
    she may read (each unwritable by her, so that the job's log cannot be opened there)."""
    private = tmp_path_factory.mktemp("root-only")
    folder = Path(tempfile.mkdtemp(prefix="hpcai-targets-"))
    folder.chmod(0o755)
    made = {"readable": folder / "readable.txt", "root-only": private / "secret", "fifo": folder / "fifo",
            "huge": folder / "huge.log"}
    made["readable"].write_text("a line alice may read\n")
    made["root-only"].write_text(ROOT_SECRET + "\n")
    made["root-only"].chmod(0o600)
    os.mkfifo(made["fifo"], 0o644)
    with open(made["huge"], "wb") as huge:
        huge.truncate(2 << 30)  # 2 GiB, sparse
        huge.seek((2 << 30) - 64)
        huge.write(b"\nthe last line of a 2 GiB file\n")
    for path in made.values():
        if path.parent == folder:
            path.chmod(0o644)
    yield made
    shutil.rmtree(folder, ignore_errors=True)


ROOT_SECRET = "ROOT-ONLY-" + secrets.token_hex(8)


@pytest.mark.alone  # how soon the hub answers bob is timed (under 1 s), not the other process's load
def test_a_failed_jobs_log_is_shown_as_its_user_could_read_it(hub: Hub, bob: str, targets: dict[str, Path]) -> None:
    """Control first: the hub does show the last lines of a log alice may read (so a block below is real)."""
    spawned = _failed_spawn(hub, targets["readable"])
    assert "a line alice may read" in spawned.said and "Last lines of" in spawned.said, spawned.said
    assert LAUNCH_FAILED.search(spawned.said), spawned.said
    attack("the hub answers bob while alice's job fails", spawned.slowest < 1,
           f"slowest answer {spawned.slowest:.2f} s")


@pytest.mark.parametrize("kind", ["root-only", "fifo", "huge"])
def test_the_job_log_path_cannot_make_the_hub_read_or_stall(hub: Hub, bob: str, targets: dict[str, Path],
                                                            kind: str) -> None:
    start = time.monotonic()
    spawned = _failed_spawn(hub, targets[kind])
    took = time.monotonic() - start
    what = {"root-only": "a link to a root-only file", "fifo": "a link to a FIFO",
            "huge": "a link to a 2 GiB file"}[kind]
    shown = "Job " in spawned.said and bool(LAUNCH_FAILED.search(spawned.said))
    attack(f"alice's job log as {what}: the spawn page shows only what alice may read",
           shown and ROOT_SECRET not in spawned.said,
           f"failure reported: {shown}; root-only text shown: {ROOT_SECRET in spawned.said}; "
           f"failed spawn took {took:.0f} s")
    attack(f"alice's job log as {what}: the hub answers another user meanwhile", spawned.slowest < 1,
           f"slowest answer {spawned.slowest:.2f} s")
    if kind == "huge":
        assert "the last line of a 2 GiB file" in spawned.said, spawned.said  # its end, read as alice
    if kind == "fifo":  # the hub's reader blocks on it for seconds: alice has all that time to read its environment
        assert spawned.tails, "the hub's tail of the FIFO was never seen"
        attack("alice reads the hub's secrets in the environment of what the hub runs as her", not spawned.leaked,
               f"{spawned.tails} reader process(es) of the hub seen as alice; hub secrets found: "
               f"{', '.join(spawned.leaked) or 'none'}")


@pytest.mark.parametrize("account", ["root", "munge", "hpcai-system", "nobody"])
def test_system_and_denied_accounts_get_no_server(hub: Hub, account: str) -> None:
    if account == "hpcai-system":
        try:
            pwd.getpwnam(account)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", account], check=True, timeout=60)
    hub.api("POST", f"/users/{account}")
    try:
        status, body = hub.api("POST", f"/users/{account}/server", {"profile": "1 node, 1 GPU (debug)"})
        wait_until(lambda: hub.api("GET", f"/users/{account}")[1]["servers"].get("") is None, timeout=60,
                   what="the refused spawn to clear")
        queued = subprocess.run(["squeue", "--noheader", "--user", account, f"--name=jupyterhub-{account}"],
                                capture_output=True, text=True, timeout=30).stdout
        uid = pwd.getpwnam(account).pw_uid
        reason = "denied users" if account == "nobody" else f"system account (uid {uid}, below 1000)"
        attack(f"spawn a server as {account} (uid {uid})",
               status == 403 and reason in body.get("message", "") and not queued.strip(),
               f"HTTP {status}: {body.get('message', '')[:120]}; squeue: {queued.strip() or 'nothing'}")
    finally:
        hub.api("DELETE", f"/users/{account}")


# -- bob against alice's running server, kernel and engines ----------------------------------------------------

ALICE_PROBE = """%load_ext jupyter_hpcai
%hpc start
import glob, json, os
from ipykernel import get_connection_file
import jupyter_hpcai.engines as E
c = E.current().set.cluster
security = os.path.join(c.profile_dir, "security")
client = json.load(open(os.path.join(security, f"ipcontroller-{c.cluster_id}-client.json")))
print("PROBE " + json.dumps({"connection": get_connection_file(), "security": security,
                             "cluster_files": sorted(glob.glob(security + "/*")), "client": client,
                             "set_folder": str(E.current().set.folder), "set_files": sorted(glob.glob(f"{E.current().set.folder}/*")),
                             "token": os.environ["JUPYTERHUB_API_TOKEN"], "job": os.environ["SLURM_JOB_ID"]}))
"""


@pytest.fixture(scope="module")
def alice(hub: Hub, bob: str) -> Iterator[dict]:  # type: ignore[type-arg]
    """alice's running server (1 node, 1 GPU) with a kernel whose engines run: what her kernel saw of it."""
    status, body = hub.api("POST", f"/users/{USER}/server", {"profile": "1 node, 1 GPU (debug)"})
    assert status in (201, 202), body
    hub.wait_ready()
    token = hub.user_token(USER)
    server = Server(hub.user_url(USER), token, Path("/dev/null"))
    status, kernel = server.request("POST", "/api/kernels", {"name": "python3"})
    assert status == 201, kernel
    result = asyncio.run(execute(server, kernel["id"], ALICE_PROBE, timeout=240))
    assert result["status"] == "ok", result
    probe = json.loads(next(ln for ln in result["stdout"].splitlines() if ln.startswith("PROBE "))[6:])
    target = hub.route(USER)["target"]
    yield {**probe, "server": target, "alice_token": token}
    server.request("DELETE", f"/api/kernels/{kernel['id']}")
    hub.stop_server()


def test_bob_cannot_read_alices_files(alice: dict, bob: str) -> None:  # type: ignore[type-arg]
    files = {"kernel connection file": alice["connection"],
             **{f"ipyparallel file {Path(f).name}": f for f in alice["cluster_files"]},
             **{f"engine set file {Path(f).name} (rank output, rank table)": f for f in alice["set_files"]},
             "job log": str(_home(USER) / LOGS / f"jupyterhub-{alice['job']}.log")}
    for what, path in files.items():
        mode = stat.S_IMODE(os.stat(path).st_mode)
        read = as_user(bob, "cat", "--", path)
        attack(f"bob reads alice's {what}", read.returncode != 0 and not read.stdout,
               f"mode {mode:o}: {read.stderr.strip()[:100]}")
    listing = as_user(bob, "ls", "--", alice["security"])
    attack("bob lists alice's ipyparallel security folder", listing.returncode != 0, listing.stderr.strip()[:100])
    assert len(alice["set_files"]) >= 2, alice["set_files"]  # each rank's output file and the rank table
    listing = as_user(bob, "ls", "--", alice["set_folder"])
    attack("bob lists alice's engine set folder (rank output, telemetry)", listing.returncode != 0,
           listing.stderr.strip()[:100])


def test_bob_cannot_read_alices_env_logs(bob: str, readable_tmp: Path) -> None:
    recipe = readable_tmp / "probe.yaml"
    recipe.write_text("name: hostile-probe\npython: /usr/bin/python3\npip: [/nonexistent/hpcai-no-such-package]\n")
    recipe.chmod(0o644)
    built = as_user(USER, str(BIN / "hpcai"), "env", "build", str(recipe), timeout=300)
    assert built.returncode != 0 and "Traceback" not in built.stdout + built.stderr, built.stdout + built.stderr
    logs = _home(USER) / ".local/share/hpcai/envs/hostile-probe/logs"
    found = sorted(logs.glob("*.log"))
    assert found, f"no build log in {logs}: {built.stdout}"
    for log in found:
        read = as_user(bob, "cat", "--", str(log))
        attack("bob reads alice's env build log", read.returncode != 0 and not read.stdout,
               f"folder mode {stat.S_IMODE(logs.stat().st_mode):o}: {read.stderr.strip()[:80]}")
    shutil.rmtree(logs.parent)


CONNECT = ("import ipyparallel as ipp, sys\n"
           "c = ipp.Client(sys.argv[1], timeout=5)\n"
           "print('CONNECTED', c.ids)\n")


def test_bob_cannot_drive_alices_engines_with_a_wrong_key(alice: dict, bob: str,  # type: ignore[type-arg]
                                                         readable_tmp: Path) -> None:
    right = readable_tmp / "right.json"
    right.write_text(json.dumps(alice["client"]))
    control = subprocess.run([sys.executable, "-c", CONNECT, str(right)], capture_output=True, text=True, timeout=60)
    assert "CONNECTED" in control.stdout, control.stderr  # the key does open alice's controller
    right.unlink()
    forged = readable_tmp / "forged.json"
    forged.write_text(json.dumps({**alice["client"], "key": secrets.token_hex(16)}))
    forged.chmod(0o644)
    tried = as_user(bob, sys.executable, "-c", CONNECT, str(forged), timeout=120)
    attack("bob connects to alice's ipyparallel controller with a wrong key",
           "CONNECTED" not in tried.stdout and "imeout" in tried.stderr,
           (tried.stderr.strip().splitlines() or ["no output"])[-1][:120])


def _get(url: str, token: str | None) -> tuple[int, str]:
    """GET without following redirects (a redirect to the hub's login is a refusal)."""
    url, host = loopback(url)
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", parts.path, headers={**host, **({"Authorization": f"token {token}"} if token else {})})
    resp = conn.getresponse()
    return resp.status, resp.read().decode(errors="replace")


def test_bob_cannot_reach_alices_server_or_its_hpcai_api(alice: dict, hub: Hub, bob: str) -> None:  # type: ignore[type-arg]
    api = f"/user/{USER}/hpcai/api/allocation"
    proxied = f"{hub.user_url(USER)}/hpcai/api/allocation"  # through the proxy, at her server's own origin
    status, body = _get(proxied, alice["alice_token"])
    assert status == 200 and alice["job"] in body, (status, body)  # control: alice's token reaches it
    bob_token = hub.user_token(bob)
    for what, url, token in (("through the proxy with bob's own token", proxied, bob_token),
                             ("through the proxy with no token", proxied, None),
                             ("directly at the server's address", f"{alice['server']}{api}", None),
                             ("directly with bob's token", f"{alice['server']}{api}", bob_token),
                             ("its Jupyter API directly", f"{alice['server']}/user/{USER}/api/kernels", None)):
        status, body = _get(url, token)
        attack(f"bob reaches alice's server {what}", status in (302, 401, 403) and alice["job"] not in body,
               f"HTTP {status}")


def test_alices_token_is_nowhere_bob_can_look(alice: dict, hub: Hub, bob: str, devcluster) -> None:  # type: ignore[no-untyped-def,type-arg]
    token = alice["token"]
    assert len(token) > 16
    for what, argv in (("ps (every process, with environments where readable)", ["ps", "-eww", "e", "-o", "args"]),
                       ("scontrol show job", ["scontrol", "show", "job", "-d", alice["job"]]),
                       ("squeue -o %all", ["squeue", "-o", "%all"]),
                       ("scontrol write batch_script", ["scontrol", "write", "batch_script", alice["job"], "-"])):
        seen = as_user(bob, *argv)
        # scontrol says a refusal on stderr and may still exit 0 ("job script retrieval failed: Invalid user id")
        denied = not seen.stdout.strip() and bool(re.search(r"failed|denied|invalid user", seen.stderr, re.I))
        shown = f"denied: {seen.stderr.strip().splitlines()[-1][:80]}" if denied else \
            f"exit {seen.returncode}, {len(seen.stdout.splitlines())} lines, no token"
        # alice's batch script is hers alone: Slurm must refuse it to bob outright, not just print no token
        attack(f"bob finds alice's hub token in {what}", token not in seen.stdout + seen.stderr
               and (denied or what != "scontrol write batch_script"), shown)
    state = str(devcluster.state_dir)
    held = subprocess.run(["grep", "-rlF", "--", token, state], capture_output=True, text=True,
                          timeout=120).stdout.split()
    searched = as_user(bob, "grep", "-rlF", "--", token, state, timeout=120)
    attack("bob finds alice's hub token in Slurm's state and spool files", not searched.stdout.strip(),
           f"root finds it in {len(held)} file(s) there ({', '.join(Path(h).parent.name for h in held) or 'none'}); "
           "bob in none")
    debug = sum(line.startswith("[D ") for line in Path(hub.log).read_text(errors="replace").splitlines())
    assert debug, "the tests' hub logs at DEBUG (batchspawner's submission logged the job's environment there)"
    for what, path in ((f"the hub's log ({debug} DEBUG lines)", hub.log),
                       ("alice's job log", _home(USER) / LOGS / f"jupyterhub-{alice['job']}.log")):
        attack(f"alice's hub token written to {what}", token not in Path(path).read_text(errors="replace"),
               f"{Path(path).stat().st_size} bytes read by root, no token")


def test_secret_files_are_private_from_their_first_byte(tmp_path: Path) -> None:
    """Created under a permissive umask, a secret and its folder are never readable by others."""
    old = os.umask(0o000)
    try:
        folder = paths.private_dir(tmp_path / "state" / "hub")
        paths.write_private(folder / "secret", "s3cret")
        with paths.open_private(folder / "log", "a") as out:
            out.write("line\n")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (folder, folder / "secret", folder / "log")}
    attack("secret files and their folder readable by others at creation",
           modes == {"hub": 0o700, "secret": 0o600, "log": 0o600}, f"modes {({k: oct(v) for k, v in modes.items()})}")
    (tmp_path / "elsewhere").write_text("x")
    (folder / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        paths.write_private(folder / "link", "through a link")
    assert (tmp_path / "elsewhere").read_text() == "x"


MARKUP = ("[/x]", "[bold]", "[rank 0 n1]")


def _hpcai(*args: str, root: Path) -> str:
    done = subprocess.run([str(BIN / "hpcai"), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HPCAI_ENV_ROOT": str(root), "COLUMNS": "250"})
    said = done.stdout + done.stderr
    assert "Traceback" not in said, said
    return said


def test_cli_prints_foreign_text_verbatim(tmp_path: Path) -> None:
    """Paths, recipe keys and tool output that look like rich markup print as they are (no MarkupError, nothing
    swallowed): in an error, a validation message and a failed verify step's output."""
    path = tmp_path / "m[/x]" / "nope[bold].yaml"
    said = _hpcai("env", "build", str(path), root=tmp_path / "envs")
    attack("a recipe path with rich markup in the CLI's error", str(path) in said, said.strip()[:120])
    recipe = tmp_path / "keys.yaml"
    recipe.write_text("name: keys\npython: /usr/bin/python3\n" + "".join(f"'bogus{m}': 1\n" for m in MARKUP))
    said = _hpcai("env", "preflight", str(recipe), root=tmp_path / "envs")
    attack("recipe keys with rich markup in the CLI's validation message",
           all(f"bogus{m}" in said for m in MARKUP), " ".join(ln.strip() for ln in said.splitlines()[:3])[:120])
    tool = tmp_path / "tool.yaml"
    tool.write_text("name: tool\npython: /usr/bin/python3\nverify:\n  commands:\n"
                    "    - run: printf '%s %s\\n' '[rank 0 n1]' '[bold]loud[/bold][/x]'\n"
                    "      expect: [never-printed]\n")
    said = _hpcai("env", "build", str(tool), root=tmp_path / "envs")  # the output, unlike the command, has no quotes
    attack("tool output with rich markup in a failed build's message", "[rank 0 n1] [bold]loud[/bold][/x]" in said,
           next((ln.strip() for ln in said.splitlines() if "rank 0" in ln), said.strip()[-120:])[:120])


def test_foreign_text_reaches_no_terminal_as_a_control_sequence() -> None:
    """A user's text in an admin's report (the site check prints what the user's job wrote): ESC, CSI and the
    other control characters print as U+FFFD, markup as it is; line breaks and tabs stay."""
    from jupyter_hpcai.cli import esc

    said = esc("\x1bc\x1b[2J[bold]x[/bold]\x9b31m\x07\ttab\nline")
    attack("a terminal reset and escape sequences in text an admin's command prints",
           not any(c in said for c in "\x1b\x9b\x07") and "[bold]x" in said.replace("\\", ""), repr(said))
    assert said.count("\ufffd") == 4 and "\ttab\nline" in said


def test_a_job_slurm_has_forgotten_is_never_a_success(devcluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A remote build whose job Slurm no longer knows (purged, or never there) has an unknown outcome: it raises."""
    from jupyter_hpcai.scheduler import slurm
    from jupyter_hpcai.errors import HPCAIError

    log = tmp_path / "job.out"
    log.write_text("building...\n")
    seen: list[str] = []
    with pytest.raises(HPCAIError) as err:
        slurm.follow_output(987654, log, seen.append)
    attack("a forgotten build job read as success",
           "outcome is unknown" in err.value.message and str(log) in err.value.hint, err.value.message[:100])
    assert seen == ["building..."]  # what it printed was still passed on


def test_secret_variables_never_reach_a_container() -> None:
    from jupyter_hpcai.contract import without_secrets

    environ = {"JUPYTERHUB_API_TOKEN": "t", "JPY_API_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "s", "db_password": "p",
               "SSH_KEY": "k", "JUPYTERHUB_SERVICE_PREFIX": "/user/a/", "SLURM_JOB_ID": "7", "PATH": "/bin"}
    assert without_secrets(environ) == {"JUPYTERHUB_SERVICE_PREFIX": "/user/a/", "SLURM_JOB_ID": "7", "PATH": "/bin"}
    site = {**environ, "HPCAI_CONTAINER_ENV_DENY": "SLURM_*"}  # a site's own list adds to the defaults
    assert set(without_secrets(site)) == {"JUPYTERHUB_SERVICE_PREFIX", "PATH", "HPCAI_CONTAINER_ENV_DENY"}
