"""HPCSlurmSpawner against a real JupyterHub, configurable-http-proxy and the dev Slurm, as a real unix user."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import re
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers.hub import USER, Hub, as_user, ensure_user, every_gpu_held, progress_events
from helpers.record import attack
from helpers.jupyter import Server, execute
from jupyter_hpcai.scheduler import slurm
from jupyter_hpcai.scheduler.interface import TERMINAL_STATES
from jupyter_hpcai.devcluster import SEPARATE
from jupyter_hpcai.proc import wait_until
from jupyter_hpcai.scheduler.interface import Partition
from jupyter_hpcai.spawner.options import OptionsError, Profile, merge_limits, validate
from jupyter_hpcai.spawner.queries import SharedQueries

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
PROFILES = [Profile(name="debug", partition="debug", nodes=1, gpus_per_node=1, walltime="01:00:00"),
            Profile(name="big", partition="gpu", nodes=2, gpus_per_node=2, walltime="02:00:00")]
PARTS = [Partition("gpu", 2, 2, 4, 8, 86400, True), Partition("debug", 2, 2, 4, 8, 7200)]
LIMITS = merge_limits(PARTS, {"debug": {"max_walltime": "01:00:00"}})


# -- options, limits and the script (no hub) ---------------------------------------------------------

def test_profile_defaults_and_user_overrides() -> None:
    options, profile = validate({"profile": "big", "nodes": "1", "walltime": "00:30:00"}, PROFILES, LIMITS, {})
    assert (options.partition, options.nodes, options.gpus_per_node, options.walltime) == ("gpu", 1, 2, "00:30:00")
    assert profile.name == "big"


def test_admin_limits_narrow_the_scheduler() -> None:
    assert LIMITS["debug"].max_walltime == 3600 and LIMITS["gpu"].max_walltime == 86400
    assert merge_limits(PARTS, {"gpu": {"max_nodes": 1}})["gpu"].max_nodes == 1
    assert list(merge_limits(PARTS, {}, ["gpu"])) == ["gpu"]


@pytest.mark.parametrize(("raw", "field", "message"), [
    ({"gpus_per_node": "-1"}, "gpus_per_node", "must be 0 or more, not -1"),
    ({"nodes": "0"}, "nodes", "must be 1 or more, not 0"),
    ({"nodes": "99"}, "nodes", "more than the 2 allowed"),
    ({"nodes": "1.5"}, "nodes", "whole number"),
    ({"account": "x\n#SBATCH --uid=0"}, "account", "not allowed"),
    ({"partition": "gpu;reboot"}, "partition", "not allowed"),
    ({"partition": "nosuch"}, "partition", "unknown partition 'nosuch'"),
    ({"walltime": "99:00:00"}, "walltime", "longer than 01:00:00"),
    ({"walltime": "$(reboot)"}, "walltime", "HH:MM:SS"),
    ({"profile": "root"}, "profile", "unknown profile"),
    ({"uid": "0"}, "uid", "unknown option"),
    ({"environment": "other"}, "environment", "unknown environment"),
])
def test_bad_options_name_the_field(raw: dict[str, str], field: str, message: str) -> None:
    with pytest.raises(OptionsError) as err:
        validate({"profile": "debug", **raw}, PROFILES, LIMITS, {"tf": "TF"})
    assert message in err.value.errors[field]


def test_a_start_validates_its_options_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            bench: list[str]) -> None:
    """The form's check, then the start's and its two scripts' (the test submission's and the submission's): one
    validation, where issue 56 counted four. Options that differ from the checked ones (in type too), settings that
    changed since (a group's override), or a check older than a start's, are validated again."""
    from jupyter_hpcai.spawner import form, spawner as module

    checked: list[dict[str, object]] = []

    def counted(raw, *args):  # type: ignore[no-untyped-def]
        checked.append(dict(raw))
        return validate(raw, *args)

    monkeypatch.setattr(form, "validate", counted)
    monkeypatch.setattr(module.HPCSlurmSpawner, "_limits", lambda self: LIMITS)  # not sinfo: no cluster here
    monkeypatch.setattr(module.HPCSlurmSpawner, "_environments", lambda self: {})
    monkeypatch.setattr(SharedQueries, "associations", lambda self, user, log=None: None)  # nor its accounting
    config = tmp_path / "jupyterhub_config.py"
    config.write_text(f"c.HPCSlurmSpawner.profiles = {[p.model_dump() for p in PROFILES]!r}\n")
    spawner = module.offline_spawner(config, "nobody")
    spawner.user_options = asyncio.run(spawner.options_from_form({"profile": ["debug"], "nodes": ["1"]}))
    first, again = spawner.job_script(), spawner.job_script()
    assert len(checked) == 1 and first == again and "--partition=debug" in first
    bench.append(f"the spawner's validations of one start's options (the form's check, the start's, its two scripts'): "
                 f"{len(checked)} now; 4 before the change (issue 56's count in the code of b157952)")
    spawner.user_options = {**spawner.user_options, "walltime": "00:30:00"}  # not what the form's check returned
    assert "--time=00:30:00" in spawner.job_script() and len(checked) == 2
    monkeypatch.setattr(form, "CHECK_KEPT_FOR", -1.0)  # a check older than that is not a start's: checked again
    spawner.job_script()
    assert len(checked) == 3
    monkeypatch.setattr(form, "CHECK_KEPT_FOR", 60.0)
    spawner.user_options = {**spawner.user_options, "nodes": True}  # equal to the checked 1, but no whole number
    with pytest.raises(OptionsError) as err:
        spawner.job_script()
    assert "nodes" in err.value.errors and len(checked) == 4
    spawner.user_options = {**spawner.user_options, "nodes": 1}
    spawner.job_script()
    spawner.profiles = [PROFILES[1].model_dump()]  # a group's override (or a pre-spawn hook) after the form's check
    with pytest.raises(OptionsError) as err:
        spawner.job_script()
    assert len(checked) == 5  # the 1 above was the cached one
    attack("a profile the user's group override removes, checked by the form before the override, reaches the script",
           "unknown profile" in err.value.errors.get("profile", ""), f"the start's check said {err.value.errors}")


def test_start_estimates_in_words() -> None:
    from jupyter_hpcai.spawner.estimates import Estimate

    answer = "sbatch: Job 12 to start at 2026-12-02T14:20:00 using 4 processors on nodes n[1-2] in partition gpu"
    start = slurm.expected_start(answer)
    assert start == time.mktime((2026, 12, 2, 14, 20, 0, 0, 0, -1))
    assert slurm.expected_start("sbatch: error: Batch job submission failed") is None
    now = start - 2 * 3600
    assert Estimate(now + 30).words(now) == "starts now"
    assert Estimate(start).words(now) == "expected start 14:20 (in about 2 h)"
    assert Estimate(start, ("00:30:00", now)).words(now) == "expected start 14:20 (in about 2 h); 00:30:00 starts now"
    assert Estimate(now + 1200).words(now).endswith("(in about 20 min)")
    assert Estimate(None).words(now) == "no start estimate from Slurm"


def test_multi_node_jobs_ask_for_nodes_of_their_users_alone() -> None:
    """torch's rendezvous takes no key: a job of two nodes or more asks for --exclusive=user unless its profile says
    otherwise; a one-node job shares as the partition allows; a site's or profile's own --exclusive (whole nodes)
    is kept, never replaced by the weaker one (sbatch takes the last)."""
    from jupyter_hpcai.spawner import script
    from jupyter_hpcai.spawner.options import SpawnOptions

    def asked(nodes: int, site: tuple[str, ...] = (), **profile: object) -> list[str]:
        options = SpawnOptions(profile="p", partition="gpu", nodes=nodes, gpus_per_node=2, walltime="01:00:00")
        text = script.render(options, Profile(name="p", partition="gpu", **profile), user="alice",  # type: ignore[arg-type]
                             homedir="/home/alice", keepvars="PATH", cmd=["jupyterhub-singleuser"], site_options=site)
        return [line for line in text.splitlines() if line.startswith("#SBATCH --exclusive")]

    assert asked(2) == ["#SBATCH --exclusive=user"] and asked(1) == []
    assert asked(2, exclusive_user=False) == [] and asked(1, exclusive_user=True) == ["#SBATCH --exclusive=user"]
    assert asked(2, ("--exclusive",)) == ["#SBATCH --exclusive"]
    assert asked(2, extra_sbatch=["--exclusive"]) == ["#SBATCH --exclusive"]


def test_a_profile_gives_each_rank_its_cpus_and_memory() -> None:
    """cpus_per_gpu and mem_per_gpu: one rank per GPU, so --cpus-per-task and --mem-per-gpu, asked for only when the
    job has GPUs; memory asked for two ways (the site's --mem beside a profile's mem_per_gpu) is refused before
    sbatch would refuse it."""
    from jupyter_hpcai.errors import HPCAIError
    from jupyter_hpcai.spawner import script
    from jupyter_hpcai.spawner.options import SpawnOptions

    def asked(gpus: int, site: tuple[str, ...] = ()) -> list[str]:
        options = SpawnOptions(profile="p", partition="gpu", nodes=1, gpus_per_node=gpus, walltime="01:00:00")
        text = script.render(options, Profile(name="p", partition="gpu", cpus_per_gpu=4, mem_per_gpu="16G"),
                             user="alice", homedir="/home/alice", keepvars="PATH", cmd=["jupyterhub-singleuser"],
                             site_options=site)
        return [line for line in text.splitlines() if line.startswith(("#SBATCH --cpus", "#SBATCH --mem"))]

    assert asked(2) == ["#SBATCH --cpus-per-task=4", "#SBATCH --mem-per-gpu=16G"]
    assert asked(0) == []  # no GPUs: the site's defaults
    with pytest.raises(HPCAIError, match="asks for memory two ways"):
        asked(2, ("--mem=64G",))
    with pytest.raises(ValueError, match="mem_per_gpu"):
        Profile(name="p", partition="gpu", mem_per_gpu="16 GB")


def test_preview_prints_the_quoted_script(devcluster) -> None:  # type: ignore[no-untyped-def]
    ensure_user(USER)  # a user of the site's accounting: the preview checks the options against their associations
    out = subprocess.run(["hpcai", "spawner", "preview", "--config", "spawner_config/demo_config.py",
                          "--profile", "2 nodes x 2 GPUs", "--option", "walltime=00:20:00", "--user", USER],
                         capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[1],
                         env={**os.environ, "PATH": f"{Path(os.sys.executable).parent}:{os.environ['PATH']}"})
    assert out.returncode == 0, out.stdout + out.stderr
    script = out.stdout
    for line in ("#SBATCH --partition=gpu", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2",
                 "#SBATCH --gpus-per-node=2", "#SBATCH --time=00:20:00", "export HPCAI_ENV=tf-horovod-cpu"):
        assert line in script
    assert "JUPYTERHUB_API_TOKEN=" not in script
    assert not any(line.lstrip().startswith("srun") for line in script.splitlines())  # one server, in the batch step
    bad = subprocess.run(["hpcai", "spawner", "preview", "--config", "spawner_config/demo_config.py",
                          "--option", "nodes=2\n#SBATCH --uid=0", "--user", USER], capture_output=True, text=True,
                         timeout=60,
                         cwd=Path(__file__).resolve().parents[1],
                         env={**os.environ, "PATH": f"{Path(os.sys.executable).parent}:{os.environ['PATH']}"})
    assert bad.returncode == 1 and "nodes: must be a whole number" in bad.stdout and "Traceback" not in bad.stderr


# -- through the hub ------------------------------------------------------------------------------

def _run_in_server(hub: Hub, code: str) -> str:
    """Start a kernel in the user's server through the proxy and run ``code``; its stdout."""
    server = Server(hub.user_url(USER), hub.user_token(), Path("/dev/null"))
    status, kernel = server.request("POST", "/api/kernels", {"name": "python3"})
    assert status == 201, kernel
    try:
        result = asyncio.run(execute(server, kernel["id"], code, timeout=120))
    finally:
        server.request("DELETE", f"/api/kernels/{kernel['id']}")
    assert result["status"] == "ok", result
    return result["stdout"]


ENV_PROBE = ("import os, json; print(json.dumps({k: os.environ.get(k) for k in ('CUDA_VISIBLE_DEVICES', 'SLURM_JOB_ID', "
             "'SLURM_JOB_NUM_NODES', 'SLURM_JOB_NODELIST', 'SLURMD_NODENAME', 'HPCAI_ENV', 'JUPYTERHUB_API_TOKEN')}))")


def _job_of_user() -> dict[str, str]:
    jobs = subprocess.run(["squeue", "--noheader", "--user", USER, "--format=%i"], capture_output=True, text=True,
                          timeout=30, check=True).stdout.split()
    assert len(jobs) == 1, jobs
    return slurm.job_info(jobs[0]) or {}


@pytest.mark.oldest_slurm
def test_rest_spawn_one_node_one_gpu(hub: Hub, bench: list[str]) -> None:
    start = time.monotonic()
    status, body = hub.api("POST", f"/users/{USER}/server", {"profile": "1 node, 1 GPU (debug)"})
    assert status in (201, 202), body
    hub.wait_ready()
    spawn_seconds = time.monotonic() - start
    job = _job_of_user()
    seen = json.loads(_run_in_server(hub, ENV_PROBE))
    assert seen["SLURM_JOB_ID"] == job["JobId"] and seen["SLURM_JOB_NUM_NODES"] == "1"
    assert seen["CUDA_VISIBLE_DEVICES"] is not None and len(seen["CUDA_VISIBLE_DEVICES"].split(",")) == 1
    assert seen["HPCAI_ENV"] == "tf-horovod-cpu" and job["Partition"] == "debug"
    queued = _seconds(job["StartTime"]) - _seconds(job["SubmitTime"])
    bench.append(f"spawn: REST spawn-to-ready {spawn_seconds:.1f} s / sbatch-to-RUNNING {queued:.0f} s "
                 f"(Slurm's 1 s resolution) + server start; hub overhead = {spawn_seconds - queued:.1f} s")
    hub.stop_server()
    assert slurm.job_info(job["JobId"])["JobState"] in TERMINAL_STATES  # type: ignore[index]


def _seconds(stamp: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(stamp).timestamp()


# Inside the server's node: where the server listens (the URL the hub gave it), and what answers there.
BIND_PROBE = """
import json, os, socket, urllib.parse
url = urllib.parse.urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
def dial(host):
    try:
        socket.create_connection((host, url.port), timeout=5).close()
        return "open"
    except OSError as err:
        return type(err).__name__
print(json.dumps({"host": url.hostname, "loopback": dial("127.0.0.1"), "node": dial(url.hostname)}))
"""


def test_rest_spawn_two_nodes_one_server(hub: Hub, devcluster) -> None:  # type: ignore[no-untyped-def]
    status, body = hub.api("POST", f"/users/{USER}/server", {"profile": "2 nodes x 2 GPUs", "nodes": 2, "gpus_per_node": 2})
    assert status in (201, 202), body
    hub.wait_ready()
    job = _job_of_user()
    bound = json.loads(_run_in_server(hub, BIND_PROBE))  # this came through the hub's proxy to that address
    print(f"dev cluster: {devcluster.mode}; the server listens on {bound}")
    assert bound["host"] == devcluster.node_address("n1") and bound["node"] == "open"
    if devcluster.mode == SEPARATE:  # on its node's address only: the hub reached it there, not on a loopback
        assert bound["loopback"] == "ConnectionRefusedError", bound
    seen = json.loads(_run_in_server(hub, ENV_PROBE))
    assert seen["SLURM_JOB_NUM_NODES"] == "2" and slurm.expand_hostlist(seen["SLURM_JOB_NODELIST"]) == ["n1", "n2"]
    assert len(seen["CUDA_VISIBLE_DEVICES"].split(",")) == 2 and seen["SLURMD_NODENAME"] == "n1"
    servers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _in_job(p, job["JobId"])
               and b"jupyterhub-singleuser" in _read(p / "cmdline")]
    assert len(servers) == 1, "exactly one Jupyter server for a 2-node job"
    hub.stop_server()


def test_job_logs_are_private_pruned_and_printed_by_hpcai_logs(hub: Hub) -> None:
    """A server's job writes its log to ~/.hpcai/logs (0700, the log 0600), never beside the user's notebooks;
    it deletes the user's logs older than job_log_max_age (14 days), only those; `hpcai logs` prints the latest."""
    home = Path(pwd.getpwnam(USER).pw_dir)
    logs = home / ".hpcai" / "logs"
    made = as_user(USER, "sh", "-c", f"mkdir -p {logs} && touch -d '30 days ago' {logs}/jupyterhub-1.log "
                                     f"{logs}/notes.txt && touch -d '2 days ago' {logs}/jupyterhub-2.log")
    assert made.returncode == 0, made.stderr
    hub.api("POST", f"/users/{USER}/server", {"profile": "1 node, 1 GPU (debug)"})
    try:
        hub.wait_ready()
        job = _job_of_user()["JobId"]
        log = logs / f"jupyterhub-{job}.log"
        assert log.is_file() and stat.S_IMODE(log.stat().st_mode) == 0o600 and stat.S_IMODE(logs.stat().st_mode) == 0o700
        assert not list(home.glob(f"*{job}*")), "no log of this job beside the user's notebooks"
        kept = {p.name for p in logs.iterdir()}
        assert "jupyterhub-1.log" not in kept and {log.name, "jupyterhub-2.log", "notes.txt"} <= kept, kept
        hpcai = [f"HOME={home}", str(Path(sys.executable).parent / "hpcai"), "logs"]
        for argv in ([], [job]):
            shown = as_user(USER, *hpcai, *argv)
            assert shown.returncode == 0 and shown.stdout and log.read_text().startswith(shown.stdout), shown
            assert shown.stderr.strip() == f"==> {log} <==", shown.stderr
        missing = as_user(USER, *hpcai, "999999")
        assert missing.returncode == 1 and "no log of job 999999" in missing.stdout and "hint:" in missing.stdout, missing
        stopper = threading.Timer(3, hub.stop_server)
        stopper.start()
        followed = as_user(USER, *hpcai, "--follow", timeout=120)  # returns once the job has ended
        stopper.join()
        assert followed.returncode == 0 and followed.stdout.startswith(shown.stdout), followed
        assert log.read_text().startswith(followed.stdout), "what it followed is the log, as far as it was written"
    finally:
        if hub.server(USER) is not None:
            hub.stop_server()


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _in_job(proc: Path, job_id: str) -> bool:
    return f"SLURM_JOB_ID={job_id}\0".encode() in _read(proc / "environ")


def test_token_never_on_a_command_line_or_in_scontrol(hub: Hub) -> None:
    hub.api("POST", f"/users/{USER}/server", {"profile": "1 node, 1 GPU (debug)"})
    hub.wait_ready()
    job = _job_of_user()
    token = json.loads(_run_in_server(hub, ENV_PROBE))["JUPYTERHUB_API_TOKEN"]
    assert token and len(token) > 16
    show = subprocess.run(["scontrol", "show", "job", "-d", job["JobId"]], capture_output=True, text=True, timeout=30).stdout
    batch = subprocess.run(["scontrol", "write", "batch_script", job["JobId"], "-"], capture_output=True, text=True,
                           timeout=30).stdout
    cmdlines = b"\n".join(_read(p / "cmdline") for p in Path("/proc").iterdir() if p.name.isdigit())
    assert token not in show and token not in batch and token.encode() not in cmdlines
    assert "#SBATCH --export=" in batch
    hub.stop_server()


@pytest.mark.oldest_slurm
def test_pending_job_shows_the_reason(hub: Hub, tmp_path: Path) -> None:
    with every_gpu_held(tmp_path):
        hub.api("POST", f"/users/{USER}/server", {"profile": "1 node, 1 GPU (debug)"})
        messages = _progress_messages(hub, until="[Resources]")
        pending = next(m for m in messages if "is pending" in m)
        assert re.search(r"Job \d+ is pending: waiting for resources.*\[Resources\]", pending), messages
    hub.wait_ready()
    hub.stop_server()


def _user_jobs() -> list[str]:
    return subprocess.run(["squeue", "--noheader", "--user", USER, "--format=%i"], capture_output=True, text=True,
                          timeout=30, check=True).stdout.split()


def test_a_start_cut_off_by_a_hub_restart_leaves_no_job_behind(hub: Hub, tmp_path: Path) -> None:
    """The hub is killed while a server's job waits in the queue: the restarted hub cancels that job as it starts
    (it does not wait out http_timeout for a server no hub waits for, nor leave the job to run unseen until its
    walltime); asked again, the server gets one job."""
    with every_gpu_held(tmp_path):
        hub.api("POST", f"/users/{USER}/server", {"profile": "1 node, 1 GPU (debug)"})
        first = wait_until(lambda: _user_jobs() or None, timeout=60, what="the server's job")[0]
        hub.kill()
        hub.start()
        wait_until(lambda: first not in _user_jobs() or None, timeout=60, what=f"the restarted hub to cancel {first}")
        assert "was starting; cancelling it" in hub.log.read_text(), hub.log.read_text()[-3000:]
        wait_until(lambda: hub.api("POST", f"/users/{USER}/server", {"profile": "1 node, 1 GPU (debug)"})[0]
                   in (201, 202) or None, timeout=60, what="the hub to take the request again")
        wait_until(lambda: (jobs := _user_jobs()) and first not in jobs and len(jobs) == 1 or None, timeout=60,
                   what=f"one job for the server, not {first}")
    hub.wait_ready()
    hub.stop_server()


def _progress_messages(hub: Hub, until: str, timeout: float = 60) -> list[str]:
    messages: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        for event in progress_events(hub, USER, timeout):
            messages.append(event.get("message", ""))
            if until in messages[-1] or time.monotonic() > deadline:
                break
    except urllib.error.HTTPError as err:  # the spawn ended before the stream opened: the reply says how
        messages.append(err.read().decode(errors="replace"))
    return messages


@pytest.mark.parametrize(("options", "message"), [
    ({"gpus_per_node": -1}, "gpus_per_node"),
    ({"nodes": 99}, "nodes: 99 is more than"),
    ({"account": "x\n#SBATCH --uid=0"}, "account: contains characters"),
    ({"partition": "nosuch"}, "unknown partition 'nosuch'"),
])
def test_bad_rest_options_are_refused_before_submission(hub: Hub, options: dict[str, object], message: str) -> None:
    before = subprocess.run(["squeue", "--noheader", "--user", USER], capture_output=True, text=True, timeout=30).stdout
    status, body = hub.api("POST", f"/users/{USER}/server", {"profile": "1 node, 1 GPU (debug)", **options})
    assert status >= 400 and message in body["message"], body
    wait_until(lambda: hub.server() is None, timeout=30, what="the failed spawn to clear")
    after = subprocess.run(["squeue", "--noheader", "--user", USER], capture_output=True, text=True, timeout=30).stdout
    assert before == after == ""


@pytest.mark.oldest_slurm
def test_a_request_the_scheduler_would_not_run_is_refused_before_submission(hub: Hub) -> None:
    """Valid for the form, refused by Slurm (here: the partition stopped taking jobs): `sbatch --test-only` says
    so in Slurm's own words, and nothing is submitted."""
    subprocess.run(["scontrol", "update", "PartitionName=debug", "State=INACTIVE"], check=True, timeout=30)
    try:
        status, body = hub.api("POST", f"/users/{USER}/server", {"profile": "1 node, 1 GPU (debug)"})
        wait_until(lambda: hub.server() is None, timeout=30, what="the refused spawn to clear")
        queued = subprocess.run(["squeue", "--noheader", "--user", USER], capture_output=True, text=True,
                                timeout=30).stdout
    finally:
        subprocess.run(["scontrol", "update", "PartitionName=debug", "State=UP"], check=True, timeout=30)
    assert status == 400 and "the scheduler would not run this request" in body["message"], body
    assert "artition" in body["message"] and "shorter walltime" in body["message"], body  # Slurm's words, then ours
    assert queued == ""


def test_a_server_that_dies_at_start_says_why(hub: Hub) -> None:
    """A server config in the user's home that breaks their server (here: a notebook folder that no longer
    exists): the job ends just after the server was launched, and the hub answers with the job's end and the
    last lines of its log, not a bare 500."""
    home = Path(pwd.getpwnam(USER).pw_dir)
    config = home / ".jupyter" / "jupyter_server_config.py"
    config.parent.mkdir(exist_ok=True)
    config.write_text('c.ServerApp.root_dir = "/nonexistent/my-old-notebooks"\n')
    try:
        status, body = hub.api("POST", f"/users/{USER}/server", {"profile": "1 node, 1 GPU (debug)"})
        said = [body.get("message", "")]
        if status < 400:  # still starting after the hub's 10 s: the spawn page's progress tells the end
            said += _progress_messages(hub, until="Last lines of", timeout=180)
        wait_until(lambda: hub.server() is None, timeout=120, what="the failed spawn to clear")
    finally:
        config.unlink()
    text = "\n".join(said)
    # the hub may see the job end before it saw it run (the server dies within a poll), or after
    assert re.search(r"Job \d+ (ended before (the Jupyter server (started|answered)|it started running)|is not running)",
                     text), text
    assert "Last lines of" in text and "/nonexistent/my-old-notebooks" in text, text
    assert "Internal Server Error" not in text, text


@pytest.mark.oldest_slurm
def test_hub_restart_keeps_the_server_and_scancel_is_noticed(hub: Hub) -> None:
    hub.api("POST", f"/users/{USER}/server", {"profile": "1 node, 1 GPU (debug)"})
    hub.wait_ready()
    job = _job_of_user()["JobId"]
    for stop in (hub.stop, hub.kill):  # SIGTERM, then SIGKILL (no chance to clean up): the server stays attached
        stop()
        hub.start()
        assert hub.server()["ready"], stop  # type: ignore[index]
        assert "SLURM_JOB_ID" in _run_in_server(hub, ENV_PROBE)
    subprocess.run(["scancel", job], check=True, timeout=30)
    wait_until(lambda: hub.server() is None, timeout=60, what="the hub to notice the cancelled job")
    assert f"Job {job}" not in subprocess.run(["squeue"], capture_output=True, text=True, timeout=30).stdout


def test_browser_spawn_form_to_jupyterlab(hub: Hub) -> None:
    from playwright.sync_api import sync_playwright

    from helpers.hub import logged_in_page

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser, page = logged_in_page(p, hub)
        page.goto(f"{hub.url}/hub/spawn")
        for select in ("profile", "partition", "environment"):  # the hub page's select (an arrow), not a text box
            assert page.get_attribute(f"#hpcai-{select}", "class") == "form-select"
            assert page.eval_on_selector(f"#hpcai-{select}", "e => getComputedStyle(e).backgroundImage") != "none"
        page.select_option("#hpcai-profile", "2 nodes x 2 GPUs")
        assert page.input_value("#hpcai-nodes") == "2"
        assert page.inner_text(".hpcai-form").count("nodes idle") == 1  # the partition's limits, once
        assert page.inner_text("#hpcai-partition-limits").startswith("gpu: ")
        page.fill("#hpcai-nodes", "99")
        page.click("input[type=submit], button[type=submit]")
        assert "more than the 2 allowed" in page.inner_text("#hpcai-error-nodes")
        page.select_option("#hpcai-profile", "2 nodes x 2 GPUs")
        page.fill("#hpcai-nodes", "2")
        assert page.query_selector("#hpcai-error-nodes") is None  # corrected: the message goes before any submit
        page.fill("#hpcai-gpus_per_node", "1")
        link = page.inner_text("#hpcai-share")  # the whole address, to copy: the choices after '#' (no server sees them)
        wanted = f"{hub.url}/hub/spawn#profile=2+nodes+x+2+GPUs&partition=gpu&nodes=2&gpus_per_node=1&"
        assert link.startswith(wanted), link
        page.screenshot(path=str(ARTIFACTS / "spawn-form.png"), full_page=True)
        for opened in (link, link.replace("#", "?")):  # the form's link, and one as JupyterHub's own query links go
            page.goto("about:blank")
            page.goto(opened)
            page.wait_for_selector("#hpcai-nodes")
            filled = {n: page.input_value(f"#hpcai-{n}") for n in ("profile", "partition", "nodes", "gpus_per_node")}
            started = subprocess.run(["squeue", "--noheader", "--user", USER, "--format=%i"], capture_output=True,
                                     text=True, timeout=30, check=True).stdout.split()
            attack("a spawn link alice follows starts a server (and charges an account of hers) without her click",
                   not started and filled == {"profile": "2 nodes x 2 GPUs", "partition": "gpu", "nodes": "2",
                                              "gpus_per_node": "1"},
                   f"{opened.split('/hub/')[1][:40]}...: jobs of hers {started or 'none'}; the form holds {filled}")
        assert page.inner_text("#hpcai-note").startswith("A link filled in this form; nothing has started")
        logged = len(hub.log.read_text(errors="replace").splitlines())
        page.click("input[type=submit], button[type=submit]")
        page.wait_for_url(re.compile(rf".*/user/{USER}/lab.*"), timeout=180_000)
        checks = [line for line in hub.log.read_text(errors="replace").splitlines()[logged:]
                  if f"{USER}: options checked" in line]
        assert len(checks) == 1, checks  # the form's check; the start and its two scripts use it (issue 56: four)
        page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
        page.screenshot(path=str(ARTIFACTS / "jupyterlab-after-spawn.png"))
        browser.close()
    job = _job_of_user()
    assert job["NumNodes"] == "2" and slurm.gres_gpus(job["TresPerNode"]) == 1  # what the form asked for
    hub.stop_server()



def _form_estimates(page, hub: Hub, wanted: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Each profile's start estimate on the spawn form, once one of them says ``wanted`` (the form shows cached
    estimates while Slurm's fresh ones come, for a few seconds in the demo)."""
    def shown() -> dict[str, str] | None:
        page.goto(f"{hub.url}/hub/spawn")
        found = {o.get_attribute("value"): o.get_attribute("data-estimate") or ""
                 for o in page.query_selector_all("#hpcai-profile option")}
        return found if any(wanted in said for said in found.values()) else None

    return wait_until(shown, timeout=60, interval=2, what=f"the form's estimates to say {wanted!r}")


@pytest.mark.oldest_slurm
def test_the_form_says_when_each_profile_would_start(hub: Hub, tmp_path: Path) -> None:
    """While another job holds 3 of each node's 4 GPUs, the 2x2-GPU profile waits for it and the 1-GPU one starts
    now; with a reservation in 90 minutes, the 2-hour job waits for its end and the form says 1 hour starts now."""
    from playwright.sync_api import sync_playwright

    from helpers.hub import logged_in_page

    big, small = "2 nodes x 2 GPUs", "1 node, 1 GPU (debug)"
    blocker = slurm.submit(["-N2", "--gpus-per-node=3", "--partition=gpu", "--time=00:20:00",
                            f"--output={tmp_path}/blocker.out", "--wrap", "sleep 1200"])
    reservation = "hpcai-test-backfill"
    try:
        wait_until(lambda: (slurm.job_info(blocker) or {}).get("JobState") == "RUNNING" or None, timeout=60,
                   what="the blocker job")
        with sync_playwright() as p:
            browser, page = logged_in_page(p, hub)
            said = _form_estimates(page, hub, "expected start")
            assert said[small] == "Slurm: starts now", said
            assert re.fullmatch(r"Slurm: expected start \d\d:\d\d \(in about (19|20|21) min\)", said[big]), said
            assert f"{big} (expected start" in page.inner_text("#hpcai-profile")
            page.select_option("#hpcai-profile", big)
            assert page.inner_text("#hpcai-estimate") == said[big]

            subprocess.run(["scancel", str(blocker)], check=True, timeout=30)
            subprocess.run(["scontrol", "create", "reservation", f"ReservationName={reservation}",
                            "StartTime=now+90minutes", "Duration=02:00:00", "Nodes=ALL", "Users=root",
                            "Flags=IGNORE_JOBS"], check=True, timeout=30, capture_output=True)
            said = _form_estimates(page, hub, "01:00:00 starts now")
            assert re.fullmatch(r"Slurm: expected start \d\d:\d\d \(in about (3|4) h\); 01:00:00 starts now", said[big]), said
            assert said[small] == "Slurm: starts now", said  # one hour ends before the reservation begins
            page.select_option("#hpcai-profile", big)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "spawn-form-estimates.png"), full_page=True)
            browser.close()
    finally:
        subprocess.run(["scancel", str(blocker)], timeout=30, check=False)
        subprocess.run(["scontrol", "delete", f"ReservationName={reservation}"], timeout=30, check=False,
                       capture_output=True)
