"""Session continuity through the real hub: a 3-minute notebook job signalled before its walltime, the
registered checkpoint written at a step every rank agreed on, the warning in the cell and in JupyterLab, the
job's end with nothing left behind, and the follow-up job (%hpc continue) resuming from the checkpoint; extend
within the site's policy; engines that outlive their kernel and a new kernel attaching to them."""

from __future__ import annotations

import asyncio
import json
import pwd
import re
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from helpers.record import ARTIFACTS
from helpers.hub import USER, Hub, logged_in_page
from helpers.jupyter import Server
from jupyter_hpcai import kernelspec
from jupyter_hpcai.demo import execute
from jupyter_hpcai.envs import open_env
from jupyter_hpcai.proc import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]



def _home() -> Path:
    return Path(pwd.getpwnam(USER).pw_dir)  # the user exists once the hub fixture made it

# The same model, optimizer (with momentum: the optimizer has state to save) and checkpoint in both jobs.
MODEL = """%%horovod_run
import numpy as np
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
opt = tf.keras.optimizers.SGD(0.05, momentum=0.9)
ckpt = hpc.Checkpoint(model, opt, name="walltime-test")
x = tf.random.stateless_normal((64, 4), seed=(1, rank)); y = tf.random.stateless_normal((64, 3), seed=(2, rank))

@tf.function
def train_step(first):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    tape = hvd.DistributedGradientTape(tape)
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    if first:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)
"""
# Train until the walltime hooks saved (at most 170 s of the job's 180), every rank calling hpc.step().
TRAIN = """%%horovod_run -o trained
import time
hpc.on_walltime(ckpt.save)
train_step(True); hpc.step()
deadline = time.time() + 170
while time.time() < deadline and ckpt.last_saved is None:
    train_step(False); hpc.step(); time.sleep(0.02)
[hpc.steps(), [float(np.sum(w)) for w in model.get_weights()], str(ckpt.last_saved)]
"""
WEIGHTS = "%%horovod_run -o now\n[hpc.steps(), [float(np.sum(w)) for w in model.get_weights()]]\n"
SHOW = "print(json.dumps({'trained': trained}) if 'trained' in dir() else json.dumps({'now': now}))"


class Kernel:
    """A kernel of the tf env in one of the user's notebook servers, reached through the hub's proxy."""

    def __init__(self, hub: Hub, name: str, server: str = "") -> None:
        self.server = Server(hub.user_url(USER, server), hub.user_token(),
                             Path("/dev/null"))
        status, kernel = self.server.request("POST", "/api/kernels", {"name": name})
        assert status == 201, kernel
        self.id = kernel["id"]

    def run(self, code: str, timeout: float = 240) -> dict[str, Any]:
        return asyncio.run(execute(self.server.url, self.server.token, self.id, code, timeout=timeout))

    def ok(self, code: str, timeout: float = 240) -> str:
        """Run ``code``, which must succeed; its output."""
        ran = self.run(code, timeout)
        assert ran["status"] == "ok", ran
        return str(ran["stdout"])

    def restart(self) -> None:
        status, body = self.server.request("POST", f"/api/kernels/{self.id}/restart")
        assert status == 200, body

    def shut_down(self) -> None:
        status, body = self.server.request("DELETE", f"/api/kernels/{self.id}")
        assert status == 204, body

    def value(self, cell: str) -> Any:
        """Run a %%horovod_run cell storing its per-rank list, then read it back as JSON."""
        ran = self.run(cell)
        assert ran["status"] == "ok", ran
        shown = self.run("import json\n" + SHOW)
        assert shown["status"] == "ok", shown
        return shown_json(shown["stdout"])


def shown_json(stdout: str) -> Any:
    """The JSON line SHOW printed (the guard may say things in the same cell)."""
    return json.loads(next(line for line in stdout.splitlines() if line.startswith("{")))


@pytest.fixture
def tf_kernelspec(tf_env) -> str:  # type: ignore[no-untyped-def]
    """The tf env's kernelspec where every user's server on the nodes finds it: a site env's, as `hpcai kernel
    install` writes it, under the servers' own prefix (kept: `hpcai demo` and the other process's tests use the
    same one)."""
    kernelspec.install(open_env(tf_env))
    return kernelspec.kernel_name(open_env(tf_env))


def _job_of_user() -> str:
    jobs = subprocess.run(["squeue", "--noheader", "--user", USER, "--format=%i"], capture_output=True, text=True,
                          timeout=30, check=True).stdout.split()
    assert len(jobs) == 1, jobs
    return jobs[0]


def _spawn(hub: Hub, nodes: int, walltime: str) -> str:
    """The user's server as a notebook job on ``nodes`` nodes with one GPU each; its job id, once it is ready."""
    status, body = hub.api("POST", f"/users/{USER}/server",
                           {"profile": "2 nodes x 2 GPUs", "nodes": nodes, "gpus_per_node": 1, "walltime": walltime})
    assert status in (201, 202), body
    hub.wait_ready()
    return _job_of_user()


def _engine_processes() -> list[str]:
    """The user's engine, controller and rank processes on every node (the nodes share this machine's pids)."""
    found = subprocess.run(["pgrep", "-a", "-u", USER, "-f", "jupyter_hpcai.ranks.boot|ipcontroller|ipyparallel"],
                           capture_output=True, text=True, timeout=30)
    return found.stdout.splitlines()


def test_walltime_signal_checkpoints_and_the_next_job_resumes(hub: Hub, tf_kernelspec: str) -> None:
    from playwright.sync_api import sync_playwright

    from jupyter_hpcai.scheduler import slurm

    checkpoints = _home() / ".hpcai" / "checkpoints" / "walltime-test"
    shutil.rmtree(checkpoints, ignore_errors=True)
    job = _spawn(hub, 2, "00:03:00")
    script = subprocess.run(["scontrol", "write", "batch_script", job, "-"], capture_output=True, text=True,
                            timeout=30, check=True).stdout
    assert "#SBATCH --signal=B:USR1@90" in script  # the demo's 600 s, at most half of the 3 minutes

    kernel = Kernel(hub, tf_kernelspec)
    started = kernel.run("%load_ext jupyter_hpcai\n%hpc start", timeout=180)
    assert started["status"] == "ok", started
    model = kernel.run(MODEL)
    assert model["status"] == "ok", model
    training: dict[str, Any] = {}
    trainer = threading.Thread(target=lambda: training.update(kernel.run(TRAIN, timeout=240)))
    trainer.start()
    with sync_playwright() as p:  # meanwhile, in JupyterLab: the side panel's notification at the signal
        browser, page = logged_in_page(p, hub)
        page.goto(f"{hub.user_url(USER)}/lab")
        page.click('li[data-id="hpcai-panel"]', timeout=120_000)
        toast = page.wait_for_selector("text=the walltime signal came", timeout=170_000)
        assert f"Slurm job {job} reaches its walltime" in toast.inner_text()
        page.wait_for_selector("#hpcai-panel .hpcai-walltime-signal", timeout=30_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "walltime-signal.png"))
        browser.close()
    trainer.join(timeout=240)
    assert training.get("status") == "ok", training
    out = training["stdout"]
    assert re.search(r"hpcai: walltime near: ran 1 walltime hook\(s\) at step \d+", out), out  # each rank
    shown = kernel.run("import json\n" + SHOW)
    # the guard's line, once, in the cell that ran when the signal came or the next (Slurm may signal up to a
    # minute early, before the training cell)
    cells = [started["stdout"], model["stdout"], out, shown["stdout"]]
    warning = f"hpcai: Slurm job {job} reaches its walltime at "
    assert sum(cell.count(warning) for cell in cells) == 1, cells
    per_rank = shown_json(shown["stdout"])["trained"]
    steps = {r[0] for r in per_rank}
    assert len(per_rank) == 2 and len(steps) == 1, per_rank  # every rank saved at the same step
    saved = checkpoints / (checkpoints / "latest").read_text().strip()
    assert json.loads((saved / "meta.json").read_text())["step"] == steps.pop()
    import numpy as np

    with np.load(saved / "model.npz") as weights:
        sums = [float(np.sum(weights[f"arr_{i}"])) for i in range(len(weights.files))]
    for rank in per_rank:  # the checkpoint's weights are every rank's
        assert np.allclose(rank[1], sums), (rank, sums)

    # %hpc continue, while the job still runs: the follow-up waits in Slurm's queue for this job's end
    queued = kernel.ok("%hpc continue")
    found = re.search(r"follow-up queued: server '(after-\d+)', Slurm job (\d+), starts when job (\d+) ends", queued)
    assert found and found[3] == job, queued
    name, follow_up = found[1], found[2]
    assert f"/user/{USER}/{name}/lab" in queued and "%hpc restore" in queued, queued
    info = slurm.job_info(follow_up) or {}
    assert info.get("Dependency", "").startswith(f"afterany:{job}") and info.get("Reason") == "Dependency", info
    assert kernel.ok("%hpc continue").count(f"Slurm job {follow_up},") == 1  # asked again: the same follow-up

    # the job ends at its walltime: nothing of the engines is left on any node, and the hub sees it end
    wait_until(lambda: not subprocess.run(["squeue", "--noheader", "--job", job], capture_output=True, text=True,
                                          timeout=30).stdout.strip(), timeout=200, what=f"job {job} to end")
    wait_until(lambda: not _engine_processes() or None, timeout=60, what="the user's engine processes to end")
    assert not (_home() / ".hpcai" / "jobs" / job).exists()  # the job's private folder

    # the follow-up starts once the job ended, and resumes: same model and checkpoint, %hpc restore, the saved
    # step and weights
    wait_until(lambda: hub.api("GET", f"/users/{USER}")[1]["servers"].get(name, {}).get("ready") or None,
               timeout=180, what=f"the follow-up server {name} to be ready")
    kernel = Kernel(hub, tf_kernelspec, server=name)
    assert kernel.run("%load_ext jupyter_hpcai\n%hpc start", timeout=180)["status"] == "ok"
    assert kernel.run(MODEL)["status"] == "ok"
    restored = kernel.run("%hpc restore")
    assert restored["status"] == "ok", restored
    assert re.search(rf"ranks 0-1: resumed at step {per_rank[0][0]} from \S+{saved.name}", restored["stdout"]), restored
    now = kernel.value(WEIGHTS)["now"]
    for rank in now:
        assert rank[0] == per_rank[0][0] and np.allclose(rank[1], sums), (rank, sums)
    status, body = hub.api("DELETE", f"/users/{USER}/servers/{name}", {"remove": True})
    assert status in (202, 204), body
    shutil.rmtree(checkpoints, ignore_errors=True)


@pytest.mark.oldest_slurm
def test_extend_within_the_site_policy_and_refusals(hub: Hub, tf_kernelspec: str) -> None:
    """The demo policy lets gpu jobs grow to 4 hours: %hpc extend and the side panel's endpoint are granted
    (scontrol shows the new limit, the countdown moves), a request past the policy is refused with its reason,
    and a token that is not the server's own extends nothing."""
    from jupyter_hpcai.scheduler import slurm

    job = _spawn(hub, 1, "00:30:00")
    kernel = Kernel(hub, tf_kernelspec)
    granted = kernel.run("%load_ext jupyter_hpcai\n%hpc extend 30m")
    assert granted["status"] == "ok", granted
    assert f"Slurm job {job} extended: time limit 01:00:00" in granted["stdout"], granted
    assert slurm.job_info(job)["TimeLimit"] == "01:00:00"  # type: ignore[index]
    refused = kernel.run("%hpc extend 4h")
    assert refused["status"] == "error", refused
    said = refused["stdout"] + str(refused["error"])
    assert "over 04:00:00, the most this site allows on gpu" in said and "ask for at most 03:00:00 more" in said, said

    lab = kernel.server  # the side panel's endpoint, as the panel calls it
    before = lab.request("GET", "/hpcai/api/allocation")[1]["seconds_left"]
    status, answer = lab.request("POST", "/hpcai/api/extend", {"seconds": 1800})
    assert status == 200 and answer["time_limit"] == "01:30:00", answer
    after = lab.request("GET", "/hpcai/api/allocation")[1]["seconds_left"]
    assert 1700 < after - before < 1900, (before, after)  # the countdown moved
    status, answer = lab.request("POST", "/hpcai/api/extend", {"seconds": 4 * 3600})
    assert status == 409 and "the most this site allows on gpu" in answer["error"], answer

    # the user's own API token is not the server's: the hub extends nothing for it
    from jupyter_hpcai.demo import request

    status, answer = request(f"{hub.url}/hub/api/hpcai/extend", hub.user_token(), "POST", {"seconds": 600})
    assert status == 404, (status, answer)
    assert slurm.job_info(job)["TimeLimit"] == "01:30:00"  # type: ignore[index]

    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:  # the side panel's button, as a user clicks it
        browser, page = logged_in_page(p, hub)
        page.goto(f"{hub.user_url(USER)}/lab")
        page.click('li[data-id="hpcai-panel"]', timeout=120_000)
        page.click("#hpcai-panel .hpcai-extend-button", timeout=60_000)
        page.wait_for_selector("#hpcai-panel .hpcai-extend-result:has-text('Extended: time limit 02:00:00')",
                               timeout=60_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "side-panel-extended.png"))
        browser.close()
    assert slurm.job_info(job)["TimeLimit"] == "02:00:00"  # type: ignore[index]
    hub.stop_server()


READ_STATE = "%%horovod_run -o now\n[state, os.getpid(), hvd.size()]\n"


def test_engines_outlive_their_kernel_and_another_kernel_attaches(hub: Hub, tf_kernelspec: str) -> None:
    """A kernel restart keeps the engines and what the ranks hold: %hpc attach gets them back, and so does a
    second notebook's kernel (its ClusterPanel's Attach); the side panel lists a set no kernel uses and stops it; engines whose kernel went
    away stop with the job (their parent gone, Slurm's process tracking no longer sees them)."""
    from playwright.sync_api import sync_playwright

    job = _spawn(hub, 2, "00:20:00")
    first = Kernel(hub, tf_kernelspec)
    first.ok("%load_ext jupyter_hpcai\n%hpc start", timeout=180)
    first.ok("%%horovod_run\nimport os\nstate = {'rank': rank, 'steps': 1000 + rank}")
    before = first.value(READ_STATE)["now"]
    assert [r[0]["steps"] for r in before] == [1000, 1001] and [r[2] for r in before] == [2, 2], before

    first.restart()  # the notebook's kernel restarts: its variables go, the ranks' stay
    attached = first.ok("%load_ext jupyter_hpcai\n%hpc attach")
    assert re.search(rf"attached to hpcai-{job}-\d+-\d+: 2 engines \(srun\); horovod initialised", attached), attached
    assert first.value(READ_STATE)["now"] == before  # the same rank processes, with their state
    second = Kernel(hub, tf_kernelspec)  # a second notebook in the same job, while the first still uses them:
    panel = second.ok("%load_ext jupyter_hpcai\nfrom jupyter_hpcai.widgets import ClusterPanel\n"  # its panel's Attach
                      "panel = ClusterPanel()\npanel.attach_button.click()\nprint(panel.state.value, panel.message.value)")
    assert 'data-state="running"' in panel and "hpcai-error" not in panel, panel
    assert second.value(READ_STATE)["now"] == before

    first.shut_down()
    second.shut_down()
    assert _engine_processes()  # no kernel, the engines go on
    with sync_playwright() as p:  # the side panel lists them as used by no kernel, and stops them
        browser, page = logged_in_page(p, hub)
        page.goto(f"{hub.user_url(USER)}/lab")
        page.click('li[data-id="hpcai-panel"]', timeout=120_000)
        page.wait_for_selector("#hpcai-panel .hpcai-detached:has-text('%hpc attach hpcai-')", timeout=60_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "side-panel-detached.png"))
        page.click("#hpcai-panel .hpcai-stop-button")
        page.wait_for_selector("#hpcai-panel:has-text('No engines')", timeout=60_000)
        browser.close()
    wait_until(lambda: not _engine_processes() or None, timeout=30, what="the stopped engines' processes to end")

    # a kernel that goes away leaves its engines running; the job's end stops them
    third = Kernel(hub, tf_kernelspec)
    third.ok("%load_ext jupyter_hpcai\n%hpc start", timeout=180)
    third.shut_down()
    assert any("ipcontroller" in line or "ipyparallel" in line for line in _engine_processes())
    hub.stop_server()
    wait_until(lambda: not subprocess.run(["squeue", "--noheader", "--job", job], capture_output=True, text=True,
                                          timeout=30).stdout.strip() or None, timeout=120, what=f"job {job} to end")
    wait_until(lambda: not _engine_processes() or None, timeout=60, what="the user's engine processes to end")
