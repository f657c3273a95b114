"""What a user's own server can make the root hub do: only report its port, and nothing a user writes into
Slurm's records steers the hub. Real hub, Slurm and sudo, as alice (the attacker) and bob (her neighbour).

Each attack is recorded (conftest.attack) and fails the test when it is not blocked; every one has a control:
the same channel used as intended works (the server's port report started it; the real partition's policy is
applied; bob's job runs on)."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import pwd
import signal
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers.record import attack
from helpers.sockets import listeners
from helpers.hub import BOB, USER, Hub, as_user, ensure_user, every_gpu_held, server_token
from jupyter_hpcai.scheduler import allocation
from jupyter_hpcai.scheduler import slurm
from jupyter_hpcai.scheduler.slurm.commands import JOB_FIELDS, parse_job_line
from jupyter_hpcai.scheduler.interface import TERMINAL_STATES
from jupyter_hpcai.scheduler.durations import parse_duration
from jupyter_hpcai.devcluster import SEPARATE, DevCluster
from jupyter_hpcai.errors import HPCAIError
from jupyter_hpcai.proc import wait_until
from jupyter_hpcai.spawner.hub_api import follow_up_name

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
PROFILE = "1 node, 1 GPU (debug)"  # the demo config extends no debug job; gpu jobs up to 4 h
GPU_PROFILE = "2 nodes x 2 GPUs"  # partition gpu: extended up to 4 h
CONFIG = Path(__file__).resolve().parents[1] / "spawner_config" / "demo_config.py"
FORGED = "x Partition=gpu TimeLimit=4-00:00:00 EndTime=2027-01-01T00:00:00 | JobState=RUNNING|gpu|4-00:00:00|"


def _listening_uids(cluster: DevCluster, addr: str, port: int) -> set[int]:
    """The owners (uids) of the TCP sockets listening on ``addr:port``, in the node network namespaces of the dev
    cluster (the host's own, when its nodes share it)."""
    namespaces = ([f"--net=/run/netns/{cluster.net.namespace(n)}" for n in cluster.node_names]
                  if cluster.mode == SEPARATE else ["--net=/proc/1/ns/net"])
    uids = set()
    for ns in namespaces:
        table = subprocess.run(["nsenter", ns, "cat", "/proc/net/tcp"], capture_output=True, text=True, timeout=10)
        uids |= {found.uid for found in listeners(table.stdout, port, addr)}
    return uids


@pytest.fixture
def server(hub: Hub) -> Iterator[dict[str, str]]:
    """alice's running server: its Slurm job and its own token; bob's plain job beside it (gone after the test: a
    2-node notebook job asks for nodes of its user's alone)."""
    ensure_user(BOB)
    status, body = hub.api("POST", f"/users/{USER}/server", {"profile": PROFILE})
    assert status in (201, 202), body
    hub.wait_ready()
    job = str(hub.api("GET", f"/users/{USER}")[1]["servers"][""]["state"]["job_id"])
    bobs = as_user(BOB, "sbatch", "--parsable", "-p", "debug", "-t", "10", "-o", "/dev/null", "--wrap", "sleep 600")
    assert bobs.returncode == 0, bobs.stderr
    yield {"job": job, "token": server_token(USER, job), "bob_job": bobs.stdout.strip().split(";")[0]}
    if hub.server(USER) is not None:
        hub.stop_server()
    subprocess.run(["scancel", bobs.stdout.strip()], timeout=30, check=False)


def test_a_server_reports_its_port_and_sets_nothing_else(devcluster: DevCluster, hub: Hub, server: dict[str, str],
                                                          tmp_path: Path) -> None:
    owned = tmp_path / "owned"
    tmp_path.chmod(0o777)
    bodies = {
        "exec_prefix emptied": {"exec_prefix": ""},
        "a cancel command of alice's": {"batch_cancel_cmd": f"sh -c 'id > {owned}'"},
        "a submit command of alice's": {"batch_submit_cmd": f"sh -c 'id > {owned}'"},
        "bob's job as hers": {"job_id": server["bob_job"]},
        "a port after the server is ready": {"port": 4242},
        "a port with a command beside it": {"port": 4242, "batch_cancel_cmd": f"sh -c 'id > {owned}'"},
        "a port that is no port": {"port": 70000},
        "a port as text": {"port": "4242"},
    }
    before = hub.api("GET", f"/users/{USER}")[1]["servers"][""]
    for what, body in bodies.items():
        status, said = hub.api("POST", "/batchspawner", body, token=server["token"])
        attack(f"alice's server posts {what} to /hub/api/batchspawner", status == 400,
               f"HTTP {status}: {str((said or {}).get('message', said))[:100]}")
    after = hub.api("GET", f"/users/{USER}")[1]["servers"][""]
    attack("alice's posts change her server's record in the hub", after["state"] == before["state"]
           and after["url"] == before["url"], f"state {after['state']}")
    log = Path(hub.log).read_text(errors="replace")
    attack("the refused bodies reach the hub's log", "id >" not in log and "Refused a port report for" in log,
           "the log names the user and the reason, never the body" if "id >" not in log else "the body is logged")
    # control: the port her server reported at start is the one the hub reaches it at, and her server holds it
    status, _ = hub.api("GET", f"/users/{USER}")
    assert status == 200 and after["ready"]
    target = urllib.parse.urlsplit(hub.route(USER)["target"])
    holders = _listening_uids(devcluster, str(target.hostname), int(target.port or 0))
    attack("alice's route leads to a port her server does not hold", holders == {pwd.getpwnam(USER).pw_uid},
           f"{target.netloc} is listened on by uids {sorted(holders)}")
    hub.stop_server()
    gone = wait_until(lambda: slurm.job_info(server["job"]) is None
                      or slurm.job_info(server["job"])["JobState"] not in ("RUNNING", "PENDING") or None,
                      timeout=60, what="alice's job to end")
    attack("stopping alice's server runs a command of hers as root", not owned.exists() and bool(gone),
           f"{owned} {'written: ' + owned.read_text() if owned.exists() else 'absent'}; her job ended")
    bobs = slurm.job_info(server["bob_job"]) or {}
    attack("alice's server takes bob's job as hers (stopping hers cancels his)", bobs.get("JobState") == "RUNNING",
           f"bob's job {bobs.get('JobState', 'gone')}")


def test_what_a_user_writes_into_slurm_does_not_steer_the_hub(hub: Hub) -> None:
    status, body = hub.api("POST", f"/users/{USER}/server", {"profile": PROFILE})
    assert status in (201, 202), body
    hub.wait_ready()
    job = str(hub.api("GET", f"/users/{USER}")[1]["servers"][""]["state"]["job_id"])
    token = server_token(USER, job)
    for field in (f"Comment={FORGED}", f"Name={FORGED}"):
        done = as_user(USER, "scontrol", "update", f"JobId={job}", field)
        assert done.returncode == 0, done.stderr  # a job's owner may write both
    shown = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
    assert "Partition=gpu" in shown and "Partition=debug" in shown  # the forged text is in scontrol's record
    info = slurm.job_info(job) or {}
    attack("a forged Comment and JobName in the hub's record of the job",
           (info.get("Partition"), info.get("JobState")) == ("debug", "RUNNING")
           and parse_duration(info["TimeLimit"]) == 3600, f"partition {info.get('Partition')}, "
           f"time limit {info.get('TimeLimit')}, state {info.get('JobState')}")
    end = allocation.end_time(job)
    attack("a forged EndTime in the follow-up's start timeout", end is not None and end < dt.datetime(2027, 1, 1),
           f"end {end}")
    status, said = hub.api("POST", "/hpcai/extend", {"seconds": 1800}, token=token)
    attack("extend of a debug job that says Partition=gpu", status == 409 and "partition debug" in said["error"],
           f"HTTP {status}: {said}")
    after = slurm.job_info(job) or {}
    assert parse_duration(after["TimeLimit"]) == 3600, after
    hub.stop_server()


def test_a_line_break_in_a_jobs_output_path_forges_no_other_record(devcluster: DevCluster, tmp_path: Path) -> None:
    """A job's owner may set its StdOut (scontrol update StdOut= while it waits) to a path with a line break and a
    whole record after it, of another user's job: the hub's one squeue for every spawner reads records by a word of
    its own query, so bob's job stays as Slurm holds it."""
    ensure_user(USER)
    ensure_user(BOB)
    jobs = {}
    for user in (USER, BOB):
        done = as_user(user, "sbatch", "--parsable", "--hold", "--partition=debug", "--output=/dev/null",
                       "--wrap=true", timeout=60)
        assert done.returncode == 0, done.stderr
        jobs[user] = done.stdout.strip()
    try:
        forged = "|".join([jobs[BOB], "COMPLETED", BOB, "gpu", "4-00:00:00", "N/A", "N/A", "n9", "n9", "0", "N/A",
                           "1", "N/A", "", "None", "normal", "climate", "/dev/null"])
        done = as_user(USER, "scontrol", "update", f"JobId={jobs[USER]}", f"StdOut=/tmp/x|\n{forged}")
        assert done.returncode == 0, done.stderr  # Slurm takes it: only the length of a path is checked
        line_by_line = subprocess.run(["squeue", "--noheader", "--states=all", f"--jobs={jobs[BOB]},{jobs[USER]}",
                                       "--Format=" + ",".join(f"{field}:|" for _, field in JOB_FIELDS)],
                                      capture_output=True, text=True, timeout=30).stdout.splitlines()
        read = [parse_job_line(line) for line in line_by_line if line.strip()]
        # the control: read line by line, her path holds a record of bob's job, ended
        assert any(r["JobId"] == jobs[BOB] and r["JobState"] == "COMPLETED" for r in read), read
        found = slurm.jobs_info([jobs[BOB], jobs[USER]])
        attack("a line break in a job's StdOut forges another user's job record in the hub's shared query",
               found[jobs[BOB]]["JobState"] == "PENDING" and found[jobs[BOB]]["NodeList"] == ""
               and found[jobs[USER]]["StdOut"].endswith(forged), f"bob's job read as {found.get(jobs[BOB])}")
    finally:
        subprocess.run(["scancel", *jobs.values()], timeout=30, check=False)


def _named(hub: Hub, user: str, name: str) -> dict:  # type: ignore[type-arg]
    return hub.api("GET", f"/users/{user}")[1]["servers"].get(name) or {}


def test_a_user_has_one_follow_up_waiting_at_most(hub: Hub) -> None:
    """Each follow-up is a pending spawn for hours, and pending spawns count against concurrent_spawn_limit."""
    for name in ("", "second"):
        status, body = hub.api("POST", f"/users/{USER}/servers/{name}", {"profile": PROFILE})
        assert status in (201, 202), body
    wait_until(lambda: all(_named(hub, USER, n).get("ready") for n in ("", "second")) or None, timeout=180,
               what="alice's two servers")
    tokens = {n: server_token(USER, str(_named(hub, USER, n)["state"]["job_id"])) for n in ("", "second")}
    with ThreadPoolExecutor(10) as pool:  # ten at once, from both servers: the check and the spawn are one step
        answers = list(pool.map(lambda n: hub.api("POST", "/hpcai/continue", {}, token=tokens[n]), ["", "second"] * 5))
    queued = {(a["server"], a["job_id"]) for s, a in answers if s == 200}
    refused = [a for s, a in answers if s == 409 and "already waits" in a["error"]]
    mine = subprocess.run(["squeue", "-h", "-u", USER, "-o", "%i"], capture_output=True, text=True,
                          timeout=30).stdout.split()
    attack("alice asks ten follow-ups at once from two servers", len(queued) == 1 and len(refused) == 5
           and len(mine) == 3, f"{len(queued)} queued, {len(refused)} refused, HTTP {sorted(s for s, _ in answers)}; "
           f"her jobs: {len(mine)}")
    (server, job), = queued  # control: her first follow-up is queued, and asked again answers with the same one
    waits = next(n for n in ("", "second") if follow_up_name(_named(hub, USER, n)["state"]["job_id"]) == server)
    status, again = hub.api("POST", "/hpcai/continue", {}, token=tokens[waits])
    assert status == 200 and (again["server"], again["job_id"]) == (server, job), again
    other = tokens["second" if waits == "" else ""]
    answers = [hub.api("POST", "/hpcai/continue", {}, token=other) for _ in range(10)]
    mine = subprocess.run(["squeue", "-h", "-u", USER, "-o", "%i"], capture_output=True, text=True,
                          timeout=30).stdout.split()
    attack("alice queues ten more follow-ups from her other server",
           all(s == 409 and "already waits" in a["error"] for s, a in answers) and len(mine) == 3,
           f"HTTP {sorted({s for s, _ in answers})}: {answers[0][1].get('error', answers[0][1])}; her jobs: {len(mine)}")
    status, body = hub.api("POST", f"/users/{BOB}/server", {"profile": PROFILE})
    assert status in (201, 202), body
    hub.wait_ready(BOB)  # other users still start
    for user, name in ((BOB, ""), (USER, "second"), (USER, server), (USER, "")):
        hub.api("DELETE", f"/users/{user}/servers/{name}", {"remove": True} if name else None)
    wait_until(lambda: not subprocess.run(["squeue", "-h", "-u", USER, "-o", "%i"], capture_output=True, text=True,
                                          timeout=30).stdout.split() and hub.server(BOB) is None or None,
               timeout=120, what="alice's jobs and bob's server to end")


def test_sbatchs_answer_is_one_job_id_or_none(devcluster) -> None:  # type: ignore[no-untyped-def]
    """sbatch runs as the user, who can write into its output (/proc/PID/fd/1): only one job-id line is read."""
    from jupyter_hpcai.spawner.spawner import offline_spawner

    spawner = offline_spawner(CONFIG, USER)
    assert spawner.parse_job_id("123\n") == "123" and spawner.parse_job_id("124;cluster\n") == "124"  # control
    for what, answer in (("a second line", "678\n555\n"), ("text", "555 x"), ("nothing", "")):
        parsed = spawner.parse_job_id(answer)
        attack(f"sbatch's answer with {what} taken as a job id", parsed == "", f"parsed {parsed!r}")


def test_the_hub_tracks_only_a_job_slurm_shows_as_the_users(devcluster) -> None:  # type: ignore[no-untyped-def]
    """A job id alice writes into sbatch's answer must be a job of hers that Slurm knows: not bob's, not the next
    id (bob's next submission would be tracked, cancelled and shown to her as hers)."""
    from jupyter_hpcai.spawner.spawner import offline_spawner

    ensure_user(BOB)
    spawner = offline_spawner(CONFIG, USER)
    jobs = {}
    for user in (USER, BOB):
        done = as_user(user, "sbatch", "--parsable", "-p", "debug", "-t", "5", "-o", "/dev/null", "--wrap", "sleep 300")
        assert done.returncode == 0, done.stderr
        jobs[user] = done.stdout.strip().split(";")[0]
    try:
        for what, job in (("bob's job", jobs[BOB]), ("a job Slurm does not know", str(int(jobs[BOB]) + 1000))):
            spawner.job_id = job
            try:
                asyncio.run(spawner._check_owner())
                said = "taken as hers"
            except HPCAIError as err:
                said = f"refused: {err.message}"
            attack(f"sbatch's answer names {what}", said.startswith("refused") and spawner.job_id == "", said)
        spawner.job_id = jobs[USER]  # control: her own job is hers
        asyncio.run(spawner._check_owner())
        assert spawner.job_id == jobs[USER]
    finally:
        subprocess.run(["scancel", *jobs.values()], timeout=30, check=False)


def test_a_server_reports_an_unprivileged_port_only() -> None:
    """The hub and the proxy connect to the port a server reports: never to a node's sshd or another root service."""
    from tornado.web import HTTPError

    from jupyter_hpcai.spawner.hub_api import checked_port

    assert checked_port({"port": 1024}) == 1024 and checked_port({"port": 65535}) == 65535  # control
    for port in (22, 1023):
        try:
            said = f"accepted {checked_port({'port': port})}"
        except HTTPError as err:
            said = f"HTTP {err.status_code}: {err.log_message}"
        attack(f"a server reports port {port}", said.startswith("HTTP 400"), said)


def test_extend_refuses_a_job_its_owner_changed_while_it_waited(hub: Hub, tmp_path: Path) -> None:
    """The extend policy is decided for the job the hub submitted: alice raises her pending gpu job from 2 to 4 GPUs
    per node (Slurm lets a job's owner do that while it waits) and the hub will not extend the job she made of it."""
    with every_gpu_held(tmp_path):
        status, body = hub.api("POST", f"/users/{USER}/server", {"profile": GPU_PROFILE})
        assert status in (201, 202), body
        job = wait_until(lambda: str((hub.server(USER) or {}).get("state", {}).get("job_id") or "") or None,
                         timeout=60, what="alice's job id")
        done = as_user(USER, "scontrol", "update", f"JobId={job}", "TresPerNode=gres:gpu:4")
        assert done.returncode == 0, done.stderr
    hub.wait_ready()
    info = slurm.job_info(job) or {}
    assert info.get("NumNodes") == "2" and slurm.gres_gpus(info.get("TresPerNode", "")) == 4, info  # as she made it
    status, said = hub.api("POST", "/hpcai/extend", {"seconds": 1800}, token=server_token(USER, job))
    after = parse_duration((slurm.job_info(job) or {}).get("TimeLimit", ""))
    attack("extend of a gpu job its owner grew to 4 GPUs a node while it waited", status == 409
           and "GPUs per node 4, submitted 2" in said.get("error", "") and after == 7200,
           f"HTTP {status}: {said}; time limit {after} s")
    hub.stop_server()


def test_a_restarted_hub_still_knows_a_server_by_its_token(hub: Hub) -> None:
    """JupyterHub keeps no server's token across its restarts; the spawner keeps its digest, so that after a restart
    the server's calls still find its job (here an extend, which the debug partition's policy then refuses) and the
    hub's poll still checks what answers on its port."""
    status, body = hub.api("POST", f"/users/{USER}/server", {"profile": PROFILE})
    assert status in (201, 202), body
    hub.wait_ready()
    job = str(hub.api("GET", f"/users/{USER}")[1]["servers"][""]["state"]["job_id"])
    token = server_token(USER, job)
    hub.stop()
    hub.start()
    status, said = hub.api("POST", "/hpcai/extend", {"seconds": 1800}, token=token)
    assert status == 409 and "does not extend notebook jobs on partition debug" in said.get("error", ""), said
    assert (hub.server(USER) or {}).get("ready"), "the server stays attached: it proved itself to the restarted hub"
    hub.stop_server()


def test_a_job_its_owner_stopped_is_kept(hub: Hub) -> None:
    """alice stops her own job (scancel --signal=STOP: Slurm says STOPPED, the job keeps its nodes). The hub must
    keep tracking it: forgotten, the job would run on unseen, past the culler and the one-server limit."""
    status, body = hub.api("POST", f"/users/{USER}/server", {"profile": PROFILE})
    assert status in (201, 202), body
    hub.wait_ready()
    job = str(hub.server(USER)["state"]["job_id"])  # type: ignore[index]
    done = as_user(USER, "scancel", "--signal=STOP", job)
    assert done.returncode == 0, done.stderr
    wait_until(lambda: (slurm.job_info(job) or {}).get("JobState") == "STOPPED" or None, timeout=30,
               what="Slurm to show the job STOPPED")
    polled = wait_until(lambda: "is 'STOPPED'; keeping it" in Path(hub.log).read_text(errors="replace") or None,
                        timeout=60, what="the hub's poll of the stopped job")
    server = hub.server(USER)
    attack("alice's stopped job makes the hub forget it", bool(polled) and server is not None
           and str(server["state"].get("job_id")) == job, f"the hub's server record: {server and server['state']}")
    as_user(USER, "scancel", "--signal=CONT", job)
    hub.stop_server()  # control: the hub still holds the job, and cancels it
    wait_until(lambda: (slurm.job_info(job) or {}).get("JobState") in (None, *TERMINAL_STATES) or None,
               timeout=60, what="alice's job to end")


# alice's loop: SIGSTOP to every sbatch process she may signal (her own), for two minutes. A /proc scan without a
# fork per pass: a pkill loop, forking and scanning at each pass, lost the race to a 30 ms sbatch under load.
STOPPER = """import os, signal, time
end = time.monotonic() + 120
while time.monotonic() < end:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as comm:
                if comm.read() == "sbatch\\n":
                    os.kill(int(pid), signal.SIGSTOP)
        except OSError:
            pass
"""


def test_a_users_stalled_sbatch_holds_one_submission_slot(devcluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """sbatch runs as the user, so alice may stop her own (kill -STOP): it then holds one of the hub's submission
    slots until the hub's 60 s timeout. Her starts submit one at a time, so her stalled starts (two of the three she
    asks for: the third is over her share of starts waiting) hold one slot of the two this hub has, and bob's job is
    submitted beside them."""
    ensure_user(BOB)
    hub = Hub(tmp_path / "hub", environ={"HPCAI_MAX_CONCURRENT_SUBMITS": "2"})
    hub.start()
    stopper = subprocess.Popen(["setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups", "--reset-env",
                                "/usr/bin/python3", "-c", STOPPER], start_new_session=True)
    try:
        hub.api("POST", f"/users/{USER}")
        hub.api("POST", f"/users/{BOB}")
        with ThreadPoolExecutor(3) as pool:  # her three starts at once (each request waits for its start a while)
            asked = [pool.submit(hub.api, "POST", f"/users/{USER}/servers/{name}", {"profile": PROFILE})
                     for name in ("", "s2", "s3")]
            wait_until(lambda: _alices_sbatch() or None, timeout=30, what="alice's (stopped) sbatch")
            time.sleep(2)  # her other starts reach the hub's queue too
            status, body = hub.api("POST", f"/users/{BOB}/server", {"profile": PROFILE})
            assert status in (201, 202), body
            started = time.monotonic()
            try:  # well before the hub's 60 s timeout frees any of her slots
                bobs = wait_until(lambda: str((hub.server(BOB) or {}).get("state", {}).get("job_id") or "") or None,
                                  timeout=30, what="bob's job id")
                waited = f"bob's job {bobs} submitted after {time.monotonic() - started:.0f} s"
            except HPCAIError:
                bobs, waited = "", "bob's job not submitted within 30 s"
            stopped = _alices_sbatch()
            assert stopped, "the attack took place: alice's sbatch was stopped"
            waited += f"; alice's stopped sbatch processes: {len(stopped)}"
            os.killpg(stopper.pid, signal.SIGKILL)
            subprocess.run(["pkill", "-CONT", "-u", USER, "-x", "sbatch"], timeout=10, check=False)
            statuses = [f.result()[0] for f in asked]  # one of the three over her share of starts waiting (two)
            assert statuses.count(429) == 1 and all(s in (201, 202, 400, 429, 500) for s in statuses), statuses
        attack("alice's stopped sbatch holds every submission slot", bool(bobs), waited)
    finally:
        if stopper.poll() is None:
            os.killpg(stopper.pid, signal.SIGKILL)  # the loop too, not only timeout: no later start of hers is stopped
        stopper.wait(timeout=10)
        subprocess.run(["pkill", "-CONT", "-u", USER, "-x", "sbatch"], timeout=10, check=False)
        hub.stop(proxy=True)
        # her resumed sbatch processes may still submit after the hub has gone: wait for them, then cancel
        wait_until(lambda: not _alices_sbatch() or None, timeout=90, what="alice's sbatch to end")
        subprocess.run(["scancel", "--user", USER], timeout=30, check=False)
        subprocess.run(["scancel", "--user", BOB], timeout=30, check=False)


def _alices_sbatch() -> list[str]:
    """The pids of alice's sbatch processes that have not ended (a zombie waits for its parent only)."""
    return subprocess.run(["pgrep", "-r", "D,R,S,T", "-u", USER, "-x", "sbatch"], capture_output=True, text=True,
                          timeout=10).stdout.split()
