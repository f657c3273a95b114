"""The hub under load, its parts: one scheduler query per cycle for every spawner (real Slurm), and the bounded
submission queue."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.error import HTTPError

import pytest

from helpers.hub import as_user, progress_events, server_token
from helpers.record import attack
from helpers.jupyter import Server
from jupyter_hpcai.scheduler import slurm
from jupyter_hpcai.scheduler.durations import parse_duration
from jupyter_hpcai.demo import request
from jupyter_hpcai.errors import HPCAIError
from jupyter_hpcai.proc import wait_until
from jupyter_hpcai.spawner.jobstate import JobStates, SubmitQueue


@pytest.mark.slurm
def test_one_scheduler_query_answers_every_spawner(devcluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    jobs = [str(slurm.submit(["--hold", "--time=00:05:00", f"--output={tmp_path}/j.out", "--wrap", "true"]))
            for _ in range(3)]
    try:
        states = JobStates()

        async def storm() -> list[dict[str, str] | None]:  # 30 polls at once, 10 per job
            return await asyncio.gather(*(states.info(job, interval=30) for job in jobs * 10))

        answers = asyncio.run(storm())
        assert [a["JobState"] if a else None for a in answers] == ["PENDING"] * 30, answers
        assert states.per_minute() == 1  # one squeue for all of them

        later = str(slurm.submit(["--hold", "--time=00:05:00", f"--output={tmp_path}/j.out", "--wrap", "true"]))
        jobs.append(later)
        found = asyncio.run(states.info(later, interval=1))  # submitted since: the next cycle's query has it
        assert found and found["JobState"] == "PENDING" and states.per_minute() == 2
        assert asyncio.run(states.info("999999", interval=1)) is None  # not in the answer: gone, after its own query
        assert states.per_minute() == 4

        subprocess.run(["scancel", jobs[0]], check=True, timeout=30)
        ended = asyncio.run(states.info(jobs[0], interval=0))  # a new cycle: the job is seen ending, not missing
        assert ended and ended["JobState"] in ("CANCELLED", "COMPLETING"), ended

        monkeypatch.setenv("PATH", str(tmp_path))  # the query cannot run: an error (the job kept), never "gone"
        with pytest.raises(HPCAIError, match="squeue: command not found"):
            asyncio.run(states.info(jobs[1], interval=0))
    finally:
        monkeypatch.undo()
        subprocess.run(["scancel", *jobs], timeout=30, check=False)


def test_submissions_wait_in_order_and_know_their_place() -> None:
    async def main() -> tuple[int, list[int], list[str], list[int]]:
        queue, running, most, order, places = SubmitQueue(), [0], [0], [], []
        release = asyncio.Event()
        tickets = [object() for _ in range(5)]

        async def submit(i: int) -> None:
            async with queue.slot(tickets[i], limit=2):
                running[0] += 1
                most[0] = max(most[0], running[0])
                order.append(f"s{i}")
                await release.wait()
                running[0] -= 1

        tasks = [asyncio.create_task(submit(i)) for i in range(5)]
        await asyncio.sleep(0.05)
        places.extend(queue.place(t) for t in tickets)
        tasks[3].cancel()  # a user who gave up leaves the queue; the others move up
        await asyncio.sleep(0.05)
        places.append(queue.place(tickets[4]))
        release.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        return most[0], places, order, [queue.place(t) for t in tickets]

    most, places, order, after = asyncio.run(main())
    assert most == 2  # never more than the limit at once
    assert places == [0, 0, 1, 2, 3, 2]  # two submitting, three waiting in order; then one fewer before the last
    assert order == ["s0", "s1", "s2", "s4"] and after == [0] * 5


# -- 40 real users at once, through the real hub -------------------------------------------------------------
USERS = tuple(f"hpcai-load-{i:02d}" for i in range(1, 41))
CPU_JOB = {"profile": "1 node, 1 GPU (debug)", "partition": "cpu", "nodes": 1, "gpus_per_node": 0,
           "walltime": "00:20:00"}
JOB_INFO_RPCS = re.compile(r"^\s*(REQUEST_JOB_INFO\w*)\s+\(\s*\d+\)\s+count:(\d+)", re.M)


def _job_info_rpcs() -> int:
    """slurmctld's own count of job-state queries (squeue, scontrol show job), from sdiag."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, timeout=30, check=True).stdout
    return sum(int(count) for _, count in JOB_INFO_RPCS.findall(out))


ALL_RPCS = re.compile(r"^\s*\w+\s+\(\s*\d+\)\s+count:(\d+)", re.M)


def _all_calls() -> int:
    """Every request slurmctld (sdiag) and slurmdbd (sacctmgr show stats) have answered, of every type and user:
    the hub's queries, submissions and accounting questions, and what the jobs themselves ask."""
    total = 0
    for argv in (["sdiag"], ["sacctmgr", "show", "stats"]):
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
        by_type = out.split("by message type", 1)[-1].split("by user", 1)[0]
        total += sum(int(count) for count in ALL_RPCS.findall(by_type))
    return total


HUB_CALLS = re.compile(r"Slurm commands this hub ran: (\{.*\})$", re.M)


def _hub_calls(log: str) -> dict[str, int]:
    """The Slurm commands the hub ran, by name, summed over the hub's lives in ``log`` (one line at each exit)."""
    total: dict[str, int] = {}
    for found in HUB_CALLS.findall(log):
        for name, count in json.loads(found).items():
            total[name] = total.get(name, 0) + count
    return total


def _rss_mib(pid: int) -> float:
    found = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(found.group(1)) / 1024 if found else 0.0


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """The main thread's (the event loop's) seconds on a CPU and waiting for one, from /proc/PID/schedstat."""
    on_cpu, waiting, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(on_cpu) / 1e9, int(waiting) / 1e9


QUEUE_PLACE = re.compile(r"Waiting to submit: number (\d+) in the hub's queue")


def _spawn_page(hub, user: str, done: threading.Event) -> list[str]:  # type: ignore[no-untyped-def]
    """What ``user``'s spawn page shows: the messages of the hub's progress stream, read as the page reads it
    (again after a hub restart), until the server is ready or failed, or ``done``."""
    messages: list[str] = []
    while not done.is_set():
        with contextlib.suppress(HTTPError, OSError):  # not starting yet (404, 400), or the hub restarting
            for event in progress_events(hub, user):
                messages.append(event.get("message", ""))
                if event.get("ready") or event.get("failed"):
                    return messages
        done.wait(0.5)
    return messages


def _servers(hub) -> dict[str, dict]:  # type: ignore[no-untyped-def,type-arg]
    status, users = hub.api("GET", "/users?state=active&limit=200")
    assert status == 200, users
    return {u["name"]: u["servers"].get("", {}) for u in users if u["name"] in USERS}


@dataclass
class Storm:
    """What one storm measured."""

    asked: int
    ready: int
    seconds: float  # first request to the last server ready
    rpcs: int  # slurmctld's job-state queries meanwhile
    calls: int  # every request slurmctld and slurmdbd answered meanwhile (_all_calls)
    latencies: list[float]  # an unrelated API request, every 0.2 s during the storm
    hub_mib: float
    hub_cpu: tuple[float, float]  # the hub's event loop meanwhile: seconds on a CPU, seconds waiting for one
    pages: dict[str, list[str]]  # each user's spawn-page messages
    asked_again: int = 0  # servers that were starting when the hub restarted, and went: asked for again

    @property
    def per_minute(self) -> float:
        return self.rpcs / self.seconds * 60

    @property
    def queue_places(self) -> dict[str, int]:
        """The highest place in the submission queue each user's page showed, for those whose page showed one."""
        places = {u: [int(m.group(1)) for line in lines if (m := QUEUE_PLACE.match(line))]
                  for u, lines in self.pages.items()}
        return {u: max(p) for u, p in places.items() if p}

    def percentile(self, share: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


MidStorm = Callable[[Any, set[str]], "set[str] | None"]  # (hub, users ready) -> users lost, once it acted
RESTARTING = threading.Event()  # the probe pauses while the hub restarts: a hub that is down has no latency


def _storm(hub, users: tuple[str, ...], mid_storm: MidStorm | None = None,  # type: ignore[no-untyped-def]
           beside: Callable[[threading.Event], None] | None = None) -> tuple[Storm, set[str]]:
    """Every user asks for a CPU-only server at once (REST, the hub's admin token), until every server is ready
    but those ``mid_storm`` lost; ``beside`` runs meanwhile, until told it is done. What it measured, and those
    lost."""
    latencies: list[float] = []
    done = threading.Event()

    def probe() -> None:  # an unrelated request: the hub's own info
        while not done.is_set():
            started = time.monotonic()
            with contextlib.suppress(OSError):
                hub.api("GET", "/info")
                if not RESTARTING.is_set():
                    latencies.append(time.monotonic() - started)
            done.wait(0.2)

    before, calls, started = _job_info_rpcs(), _all_calls(), time.monotonic()
    hub_before = {hub.proc.pid: _cpu_seconds(hub.proc.pid)}
    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    besides = threading.Thread(target=beside, args=(done,), daemon=True) if beside else None
    if besides:
        besides.start()
    pages_pool = ThreadPoolExecutor(len(users))  # every user watches the spawn page
    pages = {u: pages_pool.submit(_spawn_page, hub, u, done) for u in users}
    pool = ThreadPoolExecutor(len(users))  # the requests go out together; their answers come as the hub gives them
    answers = [pool.submit(lambda u=u: hub.api("POST", f"/users/{u}/server", CPU_JOB)[0]) for u in users]
    lost: set[str] | None = None  # once the mid-storm action ran: the users it meant to lose
    asked_again: set[str] = set()
    try:
        while True:
            servers = _servers(hub)
            ready = {u for u in users if servers.get(u, {}).get("ready")}
            if mid_storm is not None and (lost := mid_storm(hub, ready)) is not None:
                mid_storm = None
                continue
            if ready >= set(users) - (lost or set()):
                break
            if lost is not None:  # after the restart, a server that was starting may have gone: its user asks again
                for user in set(users) - lost - set(servers):
                    asked_again.add(user)
                    pool.submit(hub.api, "POST", f"/users/{user}/server", CPU_JOB)
            assert time.monotonic() - started < 420, _why_not_ready(hub, users, ready, answers)
            time.sleep(2)
    finally:
        hub_after = _cpu_seconds(hub.proc.pid)  # a restarted hub: since it started
        done.set()
        prober.join()
        if besides:
            besides.join()
        pool.shutdown()
        pages_pool.shutdown()
    hub_cpu = tuple(a - b for a, b in zip(hub_after, hub_before.get(hub.proc.pid, (0.0, 0.0))))
    statuses = [a.result() if not a.exception() else str(a.exception()) for a in answers]
    # 201/202; only a request the restart cut off (its user lost, or asked again) may have had another answer
    cut_off = (lost or set()) | asked_again
    assert all(s in (201, 202) or u in cut_off for u, s in zip(users, statuses)), list(zip(users, statuses))
    seconds = time.monotonic() - started
    assert hub.proc is not None
    return (Storm(len(users), len(ready), seconds, _job_info_rpcs() - before, _all_calls() - calls, latencies,
                  _rss_mib(hub.proc.pid),
                  hub_cpu, {u: page.result() for u, page in pages.items()}, len(asked_again)),  # type: ignore[arg-type]
            lost or set())


def _why_not_ready(hub, users: tuple[str, ...], ready: set[str], answers: list[Any]) -> str:  # type: ignore[no-untyped-def]
    """A storm's failure message: how many are ready, the hub's answers so far, the users' jobs in Slurm, and
    the hub's log about the first user not ready."""
    answered = Counter(str(a.result() if not a.exception() else a.exception()) for a in answers if a.done())
    jobs = subprocess.run(["squeue", "--noheader", "--format=%u %T %r", f"--user={','.join(users)}"],
                          capture_output=True, text=True, timeout=30).stdout.splitlines()
    states = Counter(" ".join(line.split()[1:]) for line in jobs)
    first = min(set(users) - ready)
    log = [line for line in hub.log.read_text(errors="replace").splitlines() if first in line][-15:]
    return "\n".join([f"{len(ready)} of {len(users)} servers ready after 7 min",
                      f"the hub's answers so far: {dict(answered)}", f"their jobs (state reason): {dict(states)}",
                      f"the hub's log about {first}:", *log])


def _unreached(hub, user: str, status: int, body: Any) -> str:  # type: ignore[no-untyped-def]
    """What the hub, its proxy, Slurm and the hub's log say of ``user``'s server that did not answer (a failure's
    message)."""
    route = hub.route(user)
    jobs = subprocess.run(["squeue", "--noheader", "--format=%i %T %N %S", f"--user={user}"], capture_output=True,
                          text=True, timeout=30).stdout
    log = [line for line in hub.log.read_text(errors="replace").splitlines()
           if user in line or "JupyterHub proxy:" in line or "ConfigProxy] \x1b[33mwarn" in line][-40:]
    return "\n".join([f"{user}: {status} {body}", f"the hub: {hub.server(user)}", f"the proxy's route: {route}",
                      f"squeue: {jobs}", "the hub's log:", *log])


def _stop_all(hub, users: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda u: hub.api("DELETE", f"/users/{u}/server"), users))
    wait_until(lambda: not any(_servers(hub).values()) or None, timeout=300, what="every load server to stop")


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.alone  # a storm of the whole machine: the other process's timed tests would wait out their limits
@pytest.mark.timeout(1200)  # two storms of 40 servers on 2 cores; a restart that loses the starting ones doubles one
def test_forty_users_at_once(devcluster, tmp_path: Path, bench: list[str]) -> None:  # type: ignore[no-untyped-def]
    """40 real users spawn CPU-only servers at once, then all stop: once with each spawner asking Slurm on its own,
    once with the shared query. The second storm kills one user's job and restarts the hub while servers are
    still starting: the servers that were up stay attached, a start the restart cut off is asked for again by
    its user (and leaves no job behind), every user but the killed one ends with one server, which the proxy
    reaches, and the killed one is noticed."""
    from helpers.hub import Hub, ensure_user

    for user in USERS:
        ensure_user(user)
    storms: dict[str, Storm] = {}
    ran: dict[str, dict[str, int]] = {}  # each hub's Slurm commands, from its log line at exit
    for mode, interval in (("per-spawner", "0"), ("shared", "1")):
        hub = Hub(tmp_path / mode, users=USERS, environ={"HPCAI_JOB_STATE_INTERVAL": interval})
        hub.start()
        try:
            for user in USERS:
                hub.api("POST", f"/users/{user}")

            def kill_and_restart(hub, ready: set[str]) -> set[str] | None:  # type: ignore[no-untyped-def]
                if len(ready) < 3:  # early: most servers are still starting
                    return None
                victim = sorted(ready)[0]
                subprocess.run(["scancel", "--user", victim], check=True, timeout=30)
                RESTARTING.set()
                hub.stop()  # mid-storm: servers starting, others up
                hub.start()
                RESTARTING.clear()
                return {victim}

            storm, lost = _storm(hub, USERS, kill_and_restart if mode == "shared" else None)
            storms[mode] = storm
            if mode == "shared":
                assert len(lost) == 1 and storm.ready == len(USERS) - 1, (lost, storm)
                victim = lost.pop()
                wait_until(lambda: not _servers(hub).get(victim) or None, timeout=120,
                           what="the hub to notice the killed job")
                for user in USERS:  # every other server still attached: the proxy reaches it, as its user
                    if user != victim:
                        server = Server(hub.user_url(user), hub.user_token(user), Path("/dev/null"))
                        status, body = server.request("GET", "/api/status")
                        assert status == 200, _unreached(hub, user, status, body)
                owners = subprocess.run(["squeue", "--noheader", "--format=%u", "--states=PENDING,RUNNING",
                                         f"--user={','.join(USERS)}"], capture_output=True, text=True,
                                        timeout=30).stdout.split()
                # one job each: a start the restart cut off left no job running unseen, the killed one none
                assert sorted(owners) == sorted(u for u in USERS if u != victim), owners
            else:
                assert storm.ready == len(USERS)
                assert all(page and page[-1].startswith("Server ready") for page in storm.pages.values()), storm.pages
                # 40 at once, 8 submitted at a time: the others' pages say where they wait, then move on
                assert storm.queue_places and all(page[-1].startswith("Server ready") for user, page in
                                                  storm.pages.items() if user in storm.queue_places), storm.pages
            _stop_all(hub, USERS)
        finally:
            hub.stop(proxy=True)
            for user in USERS:
                subprocess.run(["scancel", "--user", user], timeout=30, check=False)
        ran[mode] = _hub_calls(hub.log.read_text())
    shared, alone = storms["shared"], storms["per-spawner"]
    bench.append(f"hub under load, {len(USERS)} users at once (CPU-only jobs): scheduler job-state queries per minute, "
                 f"shared query / one per spawner = {shared.per_minute / alone.per_minute:.3f} (target <= 0.1; "
                 f"{shared.per_minute:.0f} vs {alone.per_minute:.0f} a minute, slurmctld's sdiag)")
    calls = {mode: sum(counted.values()) for mode, counted in ran.items()}
    bench.append(f"hub under load ({len(USERS)} users, accounting on): the hub's Slurm commands per start, every kind, "
                 f"accounting queries included = {calls['shared'] / len(USERS):.1f} with the shared query "
                 f"({json.dumps(ran['shared'])}; the hub restarted once), {calls['per-spawner'] / len(USERS):.1f} with "
                 f"one query per spawner (target <= 12.7: the 507 calls for 40 starts the issue counted before "
                 f"accounting); every request slurmctld and slurmdbd answered meanwhile, the jobs' own included: "
                 f"{shared.calls / shared.asked:.1f} and {alone.calls / alone.asked:.1f} per start")
    assert calls["shared"] and "sacctmgr" in ran["shared"], ran  # the count holds the accounting's queries
    for mode, storm in storms.items():
        places = storm.queue_places
        bench.append(f"hub under load ({mode}): {storm.ready}/{storm.asked} ready, first request to last ready "
                     f"{storm.seconds:.0f} s, unrelated API request p50 {storm.percentile(0.5) * 1000:.0f} ms / p99 "
                     f"{storm.percentile(0.99) * 1000:.0f} ms (target < 1 s), hub memory {storm.hub_mib:.0f} MiB, "
                     f"its event loop {storm.hub_cpu[0]:.1f} s on a CPU and {storm.hub_cpu[1]:.1f} s waiting for one; "
                     f"{len(places)} spawn pages showed their place in the submission queue (up to number "
                     f"{max(places.values(), default=0)})"
                 + (f"; {storm.asked_again} starting servers lost at the hub restart and asked again"
                    if mode == "shared" else ""))



ATTACKER = "hpcai-load-mallory"
GPU_JOB = {"profile": "2 nodes x 2 GPUs", "nodes": 1, "gpus_per_node": 1, "walltime": "00:20:00"}  # extendable
# waits on her GPU job
WAITING_JOB = {"profile": "2 nodes x 2 GPUs", "nodes": 2, "gpus_per_node": 4, "walltime": "00:20:00"}


@dataclass
class Attack:
    """What the hostile user did, and what she got, during a storm."""

    starts: list[int] = field(default_factory=list)  # HTTP statuses of her five named starts, beside her server
    held: list[str] = field(default_factory=list)  # the jobs of hers she held
    pages: int = 0  # spawn pages she opened on a held start that answered
    extends: list[int] = field(default_factory=list)  # HTTP statuses of her extend flood


def _hostile(hub, token: str, seen: Attack) -> Callable[[threading.Event], None]:  # type: ignore[no-untyped-def]
    """Mallory, beside a storm: five named servers asked for at once beside her running one (as many as the site
    lets her have: their jobs wait on her own GPU job; she holds them), 300 spawn pages open on one of them, and 3,000
    extends of her running server's job, 100 at a time."""
    def act(done: threading.Event) -> None:
        with ThreadPoolExecutor(5) as pool:
            seen.starts = list(pool.map(lambda i: hub.api("POST", f"/users/{ATTACKER}/servers/s{i}", WAITING_JOB)[0],
                                        range(5)))
        admitted = seen.starts.count(202) + seen.starts.count(201)

        def submitted() -> dict[str, Any] | None:  # a user's starts are submitted one at a time: wait for each job
            servers = hub.api("GET", f"/users/{ATTACKER}")[1]["servers"]
            jobs = [n for n, s in servers.items() if n and (s.get("state") or {}).get("job_id")]
            return servers if len(jobs) >= admitted else None

        servers = wait_until(submitted, timeout=120, what="her admitted starts' jobs to be submitted")
        for name, server in servers.items():
            job = str((server.get("state") or {}).get("job_id") or "")
            if name and job and as_user(ATTACKER, "scontrol", "hold", job).returncode == 0:
                seen.held.append(job)
        waiting = next((name for name in servers if name), "")

        def page() -> int:  # one spawn page, open until the storm ends
            with contextlib.suppress(HTTPError, OSError):
                for _ in progress_events(hub, ATTACKER, timeout=60, server=waiting):
                    break
                return 1
            return 0

        url = f"{hub.url}/hub/api/hpcai/extend"
        with ThreadPoolExecutor(300) as pages, ThreadPoolExecutor(100) as flood:
            opened = [pages.submit(page) for _ in range(300)]
            seen.extends = list(flood.map(lambda _: request(url, token, "POST", {"seconds": 60})[0], range(3000)))
            seen.pages = sum(f.result() for f in opened)

    return act


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.alone  # a storm of the whole machine
@pytest.mark.timeout(1200)
def test_a_hostile_user_among_forty(devcluster, tmp_path: Path,  # type: ignore[no-untyped-def]
                                    bench: list[str]) -> None:
    """40 users start at once, twice: alone, then while mallory floods extend (3,000 requests, 100 at a time), opens
    300 spawn pages on a start of hers and asks for six servers (her running one, five named ones whose jobs she
    holds). Every other start becomes ready; the hub's API answers an unrelated request within 2 s (p99; 1 s is the
    target printed: 0.6 s on this machine alone, 1.3 s with the suite's other worker's leftovers beside it); the hub's
    job-state queries a minute stay within 2x of the storm without her; her flood reaches Slurm a few times, not once
    a request; two of her named starts wait, the others are refused."""
    from helpers.hub import Hub, ensure_user

    for user in (*USERS, ATTACKER):
        ensure_user(user)
    hub = Hub(tmp_path / "hub", users=(*USERS, ATTACKER), environ={"HPCAI_DEMO_START_ENGINES": "0"})
    hub.start()
    storms: dict[str, Storm] = {}
    seen = Attack()
    try:
        for user in (*USERS, ATTACKER):
            hub.api("POST", f"/users/{user}")
        storms["alone"], _ = _storm(hub, USERS)
        _stop_all(hub, USERS)
        status, body = hub.api("POST", f"/users/{ATTACKER}/server", GPU_JOB)
        assert status in (201, 202), body
        hub.wait_ready(ATTACKER)
        job = str(hub.api("GET", f"/users/{ATTACKER}")[1]["servers"][""]["state"]["job_id"])
        before = parse_duration((slurm.job_info(job) or {})["TimeLimit"]) or 0
        storms["hostile"], _ = _storm(hub, USERS, beside=_hostile(hub, server_token(ATTACKER, job), seen))
        grown = (parse_duration((slurm.job_info(job) or {})["TimeLimit"]) or 0) - before
        _stop_all(hub, USERS)
    finally:
        for name in (hub.api("GET", f"/users/{ATTACKER}")[1] or {}).get("servers", {}):
            hub.api("DELETE", f"/users/{ATTACKER}/servers/{name}" if name else f"/users/{ATTACKER}/server")
        hub.stop(proxy=True)
        for user in (*USERS, ATTACKER):
            subprocess.run(["scancel", "--user", user], timeout=30, check=False)
    alone, hostile = storms["alone"], storms["hostile"]
    ratio = hostile.per_minute / alone.per_minute
    granted = seen.extends.count(200)
    bench.append(f"hub under a hostile user ({len(USERS)} users at once beside one flooding 3,000 extends, 300 spawn "
                 f"pages, six servers): {hostile.ready}/{hostile.asked} others ready; unrelated API request p99 "
                 f"{hostile.percentile(0.99) * 1000:.0f} ms (target < 1 s; {alone.percentile(0.99) * 1000:.0f} ms "
                 f"without her); job-state queries a minute, with her / without = {ratio:.2f} (target <= 2; "
                 f"{hostile.per_minute:.0f} vs {alone.per_minute:.0f}); her extends reaching Slurm: {granted} of "
                 f"{len(seen.extends)} (target: a few); her starts {sorted(seen.starts)}")
    attack("mallory starves the hub for 40 others (extend flood, 300 spawn pages, six servers, the waiting held)",
           hostile.ready == len(USERS) and hostile.percentile(0.99) < 2.0 and ratio <= 2.0
           and 0 < granted <= 20 and grown == 60 * granted and seen.starts.count(429) == 3
           and all(s in (201, 202) for s in seen.starts if s != 429) and len(seen.held) == 2 and seen.pages == 300,
           f"{hostile.ready}/{hostile.asked} ready; p99 {hostile.percentile(0.99) * 1000:.0f} ms; queries a minute "
           f"x{ratio:.2f}; extends granted {granted} of {len(seen.extends)} (her job's limit grew {grown // 60} min); "
           f"starts {sorted(seen.starts)}, held {len(seen.held)}; pages answered {seen.pages}")
