"""No user's requests starve the hub, or Slurm, for the others: each user has at most two starts waiting, a start its
owner holds is cancelled with the reason, a start's failure is reported once however many pages watch it, an extend
flood reaches Slurm a bounded number of times, and a wrong REST body is a 400 that names the field.

Real hub, Slurm and sudo, as alice (who pushes) beside the rest; each attack has its control. The parts on their own
first: the per-user shares (fairness.py) and the spawn page's one feed per start (progress.Feed)."""

from __future__ import annotations

import asyncio
import pwd
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from helpers.hub import (BOB, USER, Hub, as_user, demo_config_with, ensure_user, every_gpu_held, progress_events,
                         server_token)
from helpers.record import attack
from jupyter_hpcai.scheduler import slurm
from jupyter_hpcai.scheduler.durations import parse_duration
from jupyter_hpcai.demo import request
from jupyter_hpcai.errors import HPCAIError
from jupyter_hpcai.proc import wait_until
from jupyter_hpcai.spawner import fairness
from jupyter_hpcai.spawner.options import SpawnOptions
from jupyter_hpcai.spawner.progress import Feed
from jupyter_hpcai.spawner.queries import SharedQueries
from jupyter_hpcai.spawner.spawner import offline_spawner

DEBUG = {"profile": "1 node, 1 GPU (debug)"}  # the demo extends no debug job
GPU = {"profile": "2 nodes x 2 GPUs", "nodes": 1, "gpus_per_node": 1}  # partition gpu: extended up to 4 hours
PER_MINUTE = 30  # this module's hub_api_per_minute: its tests start a dozen servers of alice's within minutes
HELD_FOR = 6  # this module's held_start_timeout
DEMO = Path(__file__).resolve().parents[1] / "spawner_config" / "demo_config.py"


def test_a_users_share_refills_at_its_rate_and_one_runs_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(fairness.time, "monotonic", lambda: now[0])
    shares = fairness.Shares()
    for _ in range(6):  # a burst of six
        shares.take("alice", "extend", 6)
    with pytest.raises(fairness.TooMany) as refused:
        shares.take("alice", "extend", 6)
    assert refused.value.retry_after == 10 and "6 a minute" in refused.value.message
    shares.take("bob", "extend", 6)  # bob's share is his own
    shares.take("alice", "continue", 6)  # and each kind of request has its own
    now[0] += 10  # one more a tenth of a minute later
    shares.take("alice", "extend", 6)
    with pytest.raises(fairness.TooMany):
        shares.take("alice", "extend", 6)
    shares.take("alice", "extend", 0)  # 0: no limit
    with shares.one_at_a_time("alice", "extend"):
        with pytest.raises(fairness.TooMany, match="still running"):
            with shares.one_at_a_time("alice", "extend"):
                pass
        with shares.one_at_a_time("bob", "extend"):
            pass
    with shares.one_at_a_time("alice", "extend"):  # done: free again
        pass


def test_one_feed_serves_every_page_that_watches_a_start() -> None:
    """A hundred readers of one start's feed: each gets every event, in order, from the first; the producer runs
    once."""
    made: list[int] = []

    async def events() -> Any:
        for i in range(3):
            made.append(i)
            yield {"message": f"event {i}"}
            await asyncio.sleep(0.01)

    async def main() -> list[list[str]]:
        feed = Feed(events(), owner="start")

        async def read(delay: float) -> list[str]:
            await asyncio.sleep(delay)  # some come late: they still see the events before them
            return [event["message"] async for event in feed.read()]

        return await asyncio.gather(*(read(i * 0.0005) for i in range(100)))

    seen = asyncio.run(main())
    assert made == [0, 1, 2] and all(said == ["event 0", "event 1", "event 2"] for said in seen)

    async def long() -> list[str]:  # a start that waits for hours: a page that opens late gets the latest KEEP
        async def many() -> Any:
            for i in range(3 * Feed.KEEP):
                yield {"message": f"event {i}"}

        feed = Feed(many(), owner="start")
        await asyncio.sleep(0.05)
        return [event["message"] async for event in feed.read()]

    late = asyncio.run(long())
    assert late == [f"event {i}" for i in range(2 * Feed.KEEP, 3 * Feed.KEEP)], late[:3]


def test_extend_refuses_by_policy_before_asking_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flood of extends where the site extends nothing costs Slurm nothing: the policy answers first. The control:
    where the policy allows, Slurm is asked."""
    asked: list[str] = []

    async def ask(self: Any, job_id: str) -> None:
        asked.append(job_id)

    monkeypatch.setattr(SharedQueries, "fresh_job_info", ask)
    spawner = offline_spawner(DEMO, "alice")
    spawner.job_id = "4242"
    for partition in ("debug", "gpu"):
        spawner._options = SpawnOptions(profile="p", partition=partition, nodes=1, gpus_per_node=1, walltime="01:00")
        with pytest.raises(HPCAIError, match="does not extend notebook jobs on partition debug|is not running"):
            asyncio.run(spawner.extend(600))
    assert asked == ["4242"]  # the gpu job's, once; none for the debug job


def test_a_follow_ups_timeout_is_the_configured_one_and_its_wait(tmp_path: Path) -> None:
    spawner = offline_spawner(DEMO, "alice")
    configured = spawner.start_timeout
    spawner.follow("41", 3600)
    spawner.follow("42", 600)  # asked again: never on top of the first one's
    assert (spawner.follows, spawner.start_timeout) == ("42", configured + 600)


# -- against the real hub -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hub(devcluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:  # type: ignore[no-untyped-def]
    """A hub of this module's own: the demo config with a short held_start_timeout, engines left to the notebook."""
    ensure_user(USER)
    ensure_user(BOB)
    folder = tmp_path_factory.mktemp("fair-hub")
    settings = f"c.HPCSlurmSpawner.held_start_timeout = {HELD_FOR}\nc.HPCSlurmSpawner.hub_api_per_minute = {PER_MINUTE}"
    hub = Hub(folder, config=demo_config_with(folder, settings), environ={"HPCAI_DEMO_START_ENGINES": "0"})
    hub.start()
    for user in (USER, BOB):
        hub.api("POST", f"/users/{user}")
    yield hub
    for user in (USER, BOB):
        for name in (hub.api("GET", f"/users/{user}")[1] or {}).get("servers", {}):
            hub.api("DELETE", f"/users/{user}/servers/{name}" if name else f"/users/{user}/server")
    hub.stop(proxy=True)
    subprocess.run(["scancel", "--user", USER], timeout=30, check=False)


def _servers(hub: Hub, user: str = USER) -> dict[str, Any]:
    return (hub.api("GET", f"/users/{user}")[1] or {}).get("servers", {})


def _stop_all(hub: Hub, user: str = USER) -> None:
    for name in _servers(hub, user):
        hub.api("DELETE", f"/users/{user}/servers/{name}" if name else f"/users/{user}/server")
    wait_until(lambda: not _servers(hub, user) or None, timeout=120, what=f"{user}'s servers to stop")


def _job(hub: Hub, name: str = "") -> str:
    return wait_until(lambda: str(_servers(hub).get(name, {}).get("state", {}).get("job_id") or "") or None,
                      timeout=60, what=f"the job of alice's server {name!r}")


def test_a_user_has_two_starts_waiting_at_most(hub: Hub, tmp_path: Path) -> None:
    """alice asks for four servers while her jobs wait (every GPU held): two wait, the others are refused with the
    reason, whichever way she asks (the default server, named ones). The control: once one of hers has gone,
    she may start another."""
    with every_gpu_held(tmp_path):
        paths = ["/server", "/servers/one", "/servers/two", "/servers/three"]
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda p: hub.api("POST", f"/users/{USER}{p}", DEBUG), paths))
        statuses = [status for status, _ in answers]
        refused = [str((body or {}).get("message", "")) for status, body in answers if status == 429]
        waiting = wait_until(lambda: {n for n, s in _servers(hub).items() if s.get("pending") == "spawn"} or None,
                             timeout=30, what="alice's starts to wait")
        attack("alice holds four starts waiting at once (each counts against the hub's limit for everyone)",
               sorted(statuses) == [202, 202, 429, 429] and len(waiting) == 2
               and all("the most this hub starts at once for one user" in said for said in refused),
               f"HTTP {statuses}; waiting: {sorted(waiting)}; refused: {refused[:1]}")
        gone = sorted(waiting)[0]
        hub.api("DELETE", f"/users/{USER}/servers/{gone}" if gone else f"/users/{USER}/server")
        wait_until(lambda: gone not in {n for n, s in _servers(hub).items() if s.get("pending") == "spawn"} or None,
                   timeout=60, what="one of alice's starts to stop")
        status, body = hub.api("POST", f"/users/{USER}/servers/three", DEBUG)  # the control: one more may wait
        three = slurm.job_info(_job(hub, "three")) or {}
        assert status in (201, 202) and three.get("JobState") == "PENDING", body
    _stop_all(hub)


def test_a_start_its_owner_holds_is_cancelled_with_the_reason(hub: Hub, tmp_path: Path) -> None:
    """alice's start waits for resources, then she holds its job (scontrol hold): it would count against the hub's
    limit of starts at once until its start_timeout. The hub cancels it after held_start_timeout, and her spawn page
    says why. The control: waiting longer than that for resources alone cancels nothing."""
    with every_gpu_held(tmp_path):
        status, body = hub.api("POST", f"/users/{USER}/server", DEBUG)
        assert status in (201, 202), body  # 201: JupyterHub says so for a start that replaced a failed one
        job = _job(hub)
        time.sleep(HELD_FOR + 2)
        assert (slurm.job_info(job) or {}).get("JobState") == "PENDING"  # the control: not held, not cancelled
        held = as_user(USER, "scontrol", "hold", job)
        assert held.returncode == 0, held.stderr
        messages = [event.get("message", "") for event in progress_events(hub, USER, timeout=60)]
        state = wait_until(lambda: (slurm.job_info(job) or {"JobState": "gone"})["JobState"]
                           if _servers(hub) == {} else None, timeout=60, what="the held start to end")
    said = " | ".join(messages)
    attack("alice holds her waiting start's job: it counts against everyone's limit until its start_timeout",
           state in ("CANCELLED", "gone") and re.search(rf"was held by {USER} \(scontrol hold\) for {HELD_FOR}|"
                                                        rf"{HELD_FOR + 1} s, so the hub cancelled it", said) is not None
           and "held by you" in said and "unless it is released" in said,
           f"job {job}: {state}; her spawn page: {said[-300:]}")


def _tails(uid: int, done: threading.Event, seen: set[int]) -> None:
    """The pids of ``uid``'s `tail` processes (the hub reading a log as its user), until ``done``."""
    while not done.is_set():
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and proc.stat().st_uid == uid \
                        and (proc / "cmdline").read_bytes().split(b"\0")[0] == b"tail":
                    seen.add(int(proc.name))
            except OSError:
                continue
        time.sleep(0.05)


def test_a_failed_start_is_reported_once_however_many_pages_watch(hub: Hub, tmp_path: Path) -> None:
    """alice opens 30 spawn pages on a waiting start, makes its log a FIFO (reading it as her takes the hub 5 s),
    and cancels the job: every page says why it failed, from one report (one `tail` as her, not one per page). The
    control: the report does read her log as her (a tail is seen)."""
    entry = pwd.getpwnam(USER)
    logs = Path(entry.pw_dir) / ".hpcai" / "logs"
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    next_id = int(re.search(r"NEXT_JOB_ID\s*=\s*(\d+)", config).group(1))  # type: ignore[union-attr]
    made = as_user(USER, "bash", "-c", f"mkdir -p -m 700 {logs} && cd {logs} && for n in $(seq {next_id} "
                   f"{next_id + 4}); do rm -f jupyterhub-$n.log; mkfifo jupyterhub-$n.log; done")
    assert made.returncode == 0, made.stderr
    seen: set[int] = set()
    done = threading.Event()
    watcher = threading.Thread(target=_tails, args=(entry.pw_uid, done, seen), daemon=True)
    pages: list[list[str]] = []
    try:
        with every_gpu_held(tmp_path):
            status, body = hub.api("POST", f"/users/{USER}/server", DEBUG)
            assert status in (201, 202), body  # 201: JupyterHub says so for a start that replaced a failed one
            job = _job(hub)

            def page() -> list[str]:
                return [event.get("message", "") for event in progress_events(hub, USER, timeout=120)]

            with ThreadPoolExecutor(30) as pool:
                opened = [pool.submit(page) for _ in range(30)]
                time.sleep(2)  # the pages open
                watcher.start()
                cancelled = as_user(USER, "scancel", job)
                assert cancelled.returncode == 0, cancelled.stderr
                pages = [f.result() for f in opened]
        wait_until(lambda: _servers(hub) == {} or None, timeout=60, what="the failed start to clear")
    finally:
        done.set()
        as_user(USER, "bash", "-c", f"rm -f {logs}/jupyterhub-*.log")
    failed = [p[-1] for p in pages if p and f"Job {job}" in p[-1] and "CANCELLED" in p[-1]]
    attack("30 spawn pages on alice's cancelled start make the hub read her log (a FIFO: 5 s each) 30 times",
           len(failed) == 30 and len(seen) == 1,
           f"{len(failed)} of 30 pages said why it failed; tails run as alice: {len(seen)}")


def test_an_extend_flood_reaches_slurm_a_bounded_number_of_times(hub: Hub) -> None:
    """alice's server token sends 300 extends of a minute at once, then 60 more one after another: one runs at a time
    (the others at once are 429), and the hub grants its share (hub_api_per_minute, in a burst), answering the rest
    429 with when to ask again. Slurm's time limit grew by the granted minutes only. The control: her first requests
    are granted."""
    status, body = hub.api("POST", f"/users/{USER}/server", GPU)
    assert status in (201, 202), body
    hub.wait_ready()
    job = _job(hub)
    token = server_token(USER, job)
    before = parse_duration((slurm.job_info(job) or {})["TimeLimit"]) or 0
    url = f"{hub.url}/hub/api/hpcai/extend"

    def extend(_: int) -> tuple[int, Any]:
        return request(url, token, "POST", {"seconds": 60})

    started = time.monotonic()
    with ThreadPoolExecutor(20) as pool:
        at_once = list(pool.map(extend, range(300)))
    in_turn = [extend(i) for i in range(60)]
    took = time.monotonic() - started
    after = parse_duration((slurm.job_info(job) or {})["TimeLimit"]) or 0
    _stop_all(hub)
    statuses = [status for status, _ in at_once + in_turn]
    granted, bound = statuses.count(200), PER_MINUTE + took * PER_MINUTE / 60 + 1
    hints = {str(body.get("hint", "")).split(" in ")[0] for status, body in at_once + in_turn if status == 429}
    attack("alice's server floods extend: each request a scontrol as root",
           in_turn[0][0] == 200 and 0 < granted <= bound and after - before == 60 * granted
           and set(statuses) == {200, 429} and hints == {"wait for its answer, then ask again", "ask again"},
           f"{granted} of 360 granted in {took:.1f} s (at most {bound:.0f}); the job's limit grew "
           f"{(after - before) // 60} min; HTTP {sorted(set(statuses))}; the refusals said: {sorted(hints)}")


@pytest.mark.parametrize("body", [{"profile": {}}, {"profile": ["a", "b"]}, {"nodes": True}, {"nodes": 1.5}])
def test_a_rest_body_of_the_wrong_shape_is_a_400_that_names_the_field(hub: Hub, body: dict[str, Any]) -> None:
    status, said = hub.api("POST", f"/users/{USER}/server", body)
    field = next(iter(body))
    assert status == 400 and f"{field}: must be text or a whole number" in str(said), (status, said)
    assert not _servers(hub) or _stop_all(hub) is None
