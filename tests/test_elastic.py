"""Elastic worlds on the dev cluster (separate hosts): grow a running world by a second Slurm job, shrink it back,
and go on after a node is lost, each time training on from the last checkpoint.

Fake here: the GPUs (character devices) and the node failure (slurmd and the ranks of one node killed; the node's
network host stays up). torch is the CPU build: gloo.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers.kernels import JobKernel, kernel_in_job
from jupyter_hpcai.scheduler import slurm
from jupyter_hpcai.devcluster import DevCluster
from jupyter_hpcai.proc import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# DDP on every rank, from the last checkpoint (if any) for 20 more steps, saving every 5: the world's size, the step
# reached, whether the world changed since the last cell, the parameters, and the step the checkpoint restored
TRAIN = """%%torchrun{options} -o out
import time
import torch.nn as nn
torch.manual_seed(rank)
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = hpc.Checkpoint(model, opt, name="elastic", directory={folder!r})
ckpt.restore()
start = hpc.steps()
x = torch.rand(32, 8); y = x.sum(1, keepdim=True)
end = {end}
while hpc.steps() < end:
    opt.zero_grad(); nn.functional.mse_loss(model(x), y).backward(); opt.step(); hpc.step()
    if hpc.steps() % 5 == 0:
        ckpt.save()
    time.sleep({pause})
[world_size, hpc.steps(), hpc.world_changed(), [p.detach().tolist() for p in model.parameters()], start]
"""


def _train(kernel: JobKernel, folder: Path, end: int, options: str = "", pause: float = 0.0) -> list[list]:  # type: ignore[type-arg]
    cell = kernel.run(TRAIN.format(options=options, folder=str(folder), end=end, pause=pause), timeout=600)
    assert cell.status == "ok", cell.error + cell.stdout
    return ast.literal_eval(kernel.run("out").result or "[]")


def _job_state(job: str) -> str:
    info = slurm.job_info(job)
    return info["JobState"] if info else "gone"


@pytest.fixture()
def checkpoints(tmp_path: Path) -> Path:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    return folder


@pytest.mark.oldest_slurm
def test_grow_by_a_second_job_then_shrink_back(devcluster, torch_env, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                checkpoints: Path) -> None:
    with kernel_in_job(torch_env, tmp_path, ("-N1", "--ntasks-per-node=2", "--gpus-per-node=2")) as kernel:
        assert kernel.run("%load_ext jupyter_hpcai").status == "ok"
        assert kernel.run("%hpc start").status == "ok"
        first = _train(kernel, checkpoints, end=10)
        assert [(o[0], o[1]) for o in first] == [(2, 10), (2, 10)]

        grow = kernel.run("%hpc grow --nodes 1 --wait", timeout=300)
        assert grow.status == "ok", grow.error
        assert "asking Slurm for 1 more node(s) x 2 GPU(s)" in grow.stdout and "starts now" in grow.stdout, grow.stdout
        grown = re.search(r"Slurm job (\d+) submitted", grow.stdout)[1]  # type: ignore[index]
        assert f"4 ranks now, 2 of them in job {grown}" in grow.stdout
        status = kernel.run("%hpc status").stdout
        rows = [line.split() for line in status.splitlines()[1:]]
        assert [(r[0], r[1], r[4]) for r in rows] == [("0", "n1", str(kernel.job_id)), ("1", "n1", str(kernel.job_id)),
                                                       ("2", "n2", grown), ("3", "n2", grown)], status

        bigger = _train(kernel, checkpoints, end=20)  # from the checkpoint the world of 2 saved at step 10
        assert [(o[0], o[1], o[2], o[4]) for o in bigger] == [(4, 20, True, 10)] * 4  # every rank restored step 10
        assert all(o[3] == bigger[0][3] for o in bigger)  # DDP kept every rank's parameters equal
        again = _train(kernel, checkpoints, end=25)
        assert {o[2] for o in again} == {False}  # told once

        shrink = kernel.run("%hpc shrink --nodes 1")
        assert shrink.status == "ok", shrink.error
        assert f"Slurm job {grown} cancelled" in shrink.stdout and "2 ranks now" in shrink.stdout, shrink.stdout
        wait_until(lambda: _job_state(grown) in ("gone", "CANCELLED", "COMPLETED"), timeout=60,
                   what=f"grown job {grown} to end")
        smaller = _train(kernel, checkpoints, end=30)
        assert [(o[0], o[1], o[2], o[4]) for o in smaller] == [(2, 30, True, 25)] * 2
        assert _job_state(str(kernel.job_id)) == "RUNNING"

        # the same from the widget panel: +1 node returns at once with the estimate, -1 node gives it back
        assert kernel.run("from jupyter_hpcai.widgets import ClusterPanel\npanel = ClusterPanel()\n"
                          "panel.grow_button.click()\npanel.message.value").status == "ok"
        said = kernel.run("panel.message.value").result or ""
        assert "asking Slurm for 1 more node(s)" in said and "submitted" in said, said
        wait_until(lambda: kernel.run("%hpc status").stdout.count(" yes") == 4, timeout=120, what="the ranks to join")
        assert kernel.run("panel.ranks.value.count('<td>running</td>')").result == "4"
        assert kernel.run("panel.shrink_button.click()\npanel.message.value").status == "ok"
        assert "2 ranks now" in (kernel.run("panel.message.value").result or "")


def test_a_grown_job_that_waits_returns_at_once_and_shrink_cancels_it(devcluster, torch_env,  # type: ignore[no-untyped-def]
                                                                      tmp_path: Path) -> None:
    """The partition is full (a job holds n2): the estimate says when, grow without --wait returns, and shrink
    cancels the waiting job; grown again, its ranks join once Slurm starts it (n2 freed), the next cell runs on 4."""
    blocker = slurm.submit(["-N1", "-w", "n2", "--gpus-per-node=4", "--time=00:10:00", f"--output={tmp_path}/blocker.out",
                            "--wrap", "sleep 600"])
    try:
        wait_until(lambda: _job_state(str(blocker)) == "RUNNING", timeout=60, what="the job that fills n2")
        with kernel_in_job(torch_env, tmp_path, ("-N1", "-w", "n1", "--ntasks-per-node=2", "--gpus-per-node=2")) as k:
            assert k.run("%load_ext jupyter_hpcai").status == "ok" and k.run("%hpc start").status == "ok"
            grow = k.run("%hpc grow --nodes 1", timeout=120)
            assert grow.status == "ok", grow.error
            assert re.search(r"expected \d\d:\d\d", grow.stdout) and "its ranks join when it runs" in grow.stdout, grow.stdout
            waiting = re.search(r"Slurm job (\d+) submitted", grow.stdout)[1]  # type: ignore[index]
            assert _job_state(waiting) == "PENDING"
            assert k.run("%%torchrun\nworld_size").result == "2"  # the cell does not wait for it
            shrink = k.run("%hpc shrink --nodes 1")
            assert f"cancelled Slurm job {waiting} (still waiting)" in shrink.stdout, shrink.stdout + shrink.error
            wait_until(lambda: _job_state(waiting) in ("gone", "CANCELLED"), timeout=60, what="the waiting job to go")

            again = k.run("%hpc grow --nodes 1", timeout=120)
            later = re.search(r"Slurm job (\d+) submitted", again.stdout)[1]  # type: ignore[index]
            assert _job_state(later) == "PENDING", again.stdout + again.error
            subprocess.run(["scancel", str(blocker)], timeout=30, check=True)  # n2 frees: Slurm starts the grown job
            wait_until(lambda: k.run("%hpc status").stdout.count(" yes") == 4, timeout=180, what="its ranks to join")
            assert k.run("%%torchrun\nworld_size").result == "4"
            status = k.run("%hpc status").stdout
            assert [line.split()[4] for line in status.splitlines()[1:]] == [str(k.job_id)] * 2 + [later] * 2, status
            assert f"Slurm job {later} cancelled" in k.run("%hpc shrink --nodes 1").stdout
    finally:
        subprocess.run(["scancel", str(blocker)], timeout=30, check=False)


def _node_ranks(node: str, job: int | str) -> list[int]:
    """PIDs of the rank processes (ranks/boot.py) of Slurm job ``job`` running on ``node`` (the run's other process
    has a cluster whose nodes have the same names)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if (b"jupyter_hpcai.ranks.boot" in cmd and f"SLURMD_NODENAME={node}\0".encode() in env
                and f"SLURM_JOB_ID={job}\0".encode() in env):
            found.append(int(pid))
    return found


@contextmanager
def _node_fails_at_step_15(cluster: DevCluster, node: str, job: int, checkpoints: Path) -> Iterator[None]:
    """Once the training saved step 15, the node's slurmd and job ``job``'s ranks on it are killed (a node failure),
    from a thread; on the way out a kill that has not come yet never will (a cell that failed early leaves no
    killer behind to take the node from the next test)."""
    stop = threading.Event()

    def fail() -> None:
        latest = checkpoints / "latest"
        wait_until(lambda: stop.is_set() or (latest.exists() and latest.read_text().strip() >= "step-000000015"),
                   timeout=300, what="the training to save step 15")
        if stop.is_set():
            return
        slurmd = next(d for d in cluster.daemons() if d.name == f"slurmd {node}").pid()
        assert slurmd is not None, f"slurmd {node} is not running"
        os.kill(slurmd, signal.SIGKILL)
        for pid in _node_ranks(node, job):
            os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=fail)
    killer.start()
    try:
        yield
    finally:
        stop.set()
        killer.join()


def test_a_lost_node_and_the_cell_goes_on_with_the_survivors(devcluster, torch_env, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                              checkpoints: Path) -> None:
    """A 2 x 2 world trains with --elastic 2 and a no-kill job; n2 fails at step 15+: the cell goes on on n1's two
    ranks from the last checkpoint and ends with equal weights; the job lives on after Slurm marks n2 down."""
    try:
        with kernel_in_job(torch_env, tmp_path, ("-N2", "--no-kill", "--ntasks-per-node=2", "--gpus-per-node=2")) as k:
            assert k.run("%load_ext jupyter_hpcai").status == "ok" and k.run("%hpc start").status == "ok"
            with _node_fails_at_step_15(devcluster, "n2", k.job_id, checkpoints):
                cell = k.run(TRAIN.format(options=" --elastic 2", folder=str(checkpoints), end=60, pause=0.2),
                             timeout=600)
            assert cell.status == "ok", cell.error + cell.stdout
            said = re.search(r"hpcai: (.*) lost at step (\d+); continuing on 2 ranks from step (\d+)", cell.stdout)
            assert said, cell.stdout
            assert said[1] == "rank 2 on n2, rank 3 on n2" and int(said[3]) >= 15 and int(said[3]) <= int(said[2])
            out = ast.literal_eval(k.run("out").result or "[]")
            assert [(o[0], o[1], o[2]) for o in out] == [(2, 60, True)] * 2 and out[0][3] == out[1][3]
            assert [o[4] for o in out] == [int(said[3])] * 2  # the re-run started where the line says
            wait_until(lambda: any(n.name == "n2" and n.state.startswith("down") for n in slurm.nodes()),
                       timeout=240, what="Slurm to mark n2 down (SlurmdTimeout)")
            time.sleep(5)  # past the moment Slurm would end a job without --no-kill
            assert _job_state(str(k.job_id)) == "RUNNING"
            assert k.run("%%torchrun\nworld_size").result == "2"
    finally:
        devcluster.up(timeout=300)  # n2's slurmd again


# Horovod on TensorFlow, over Gloo once re-formed: the same checkpointed loop
HOROVOD_TRAIN = """%%horovod_run{options} -o out
import time
import numpy as np
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
opt = tf.keras.optimizers.SGD(0.05)
ckpt = hpc.Checkpoint(model, opt, name="elastic-horovod", directory={folder!r})
x = tf.random.stateless_normal((64, 4), seed=(1, rank)); y = tf.random.stateless_normal((64, 3), seed=(2, rank))

def train_step():
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    tape = hvd.DistributedGradientTape(tape)
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

train_step()  # builds the optimizer's variables, which the checkpoint restores
ckpt.restore()
hvd.broadcast_variables(model.variables, root_rank=0)
while hpc.steps() < {end}:
    train_step(); hpc.step()
    if hpc.steps() % 5 == 0:
        ckpt.save()
    time.sleep({pause})
[hvd.size(), hpc.steps(), hpc.world_changed(), [float(np.sum(w)) for w in model.get_weights()]]
"""


def test_horovod_grows_over_gloo_and_shrinks_back(devcluster, tf_env, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                  checkpoints: Path) -> None:
    with kernel_in_job(tf_env, tmp_path, ("-N1", "--ntasks-per-node=2", "--gpus-per-node=2")) as kernel:
        assert kernel.run("%load_ext jupyter_hpcai").status == "ok" and kernel.run("%hpc start").status == "ok"
        run = lambda end: kernel.run(HOROVOD_TRAIN.format(options="", folder=str(checkpoints), end=end, pause=0),  # noqa: E731
                                     timeout=600)
        cell = run(10)
        assert cell.status == "ok", cell.error
        assert kernel.run("%%horovod_run\nhvd.mpi_enabled()").result == "False"  # Gloo, through the kernel's rendezvous
        grow = kernel.run("%hpc grow --nodes 1 --wait", timeout=300)
        assert grow.status == "ok" and "4 ranks now" in grow.stdout, grow.error + grow.stdout
        cell = run(20)
        assert cell.status == "ok", cell.error
        out = ast.literal_eval(kernel.run("out").result or "[]")
        assert [(o[0], o[1], o[2]) for o in out] == [(4, 20, True)] * 4 and all(o[3] == out[0][3] for o in out)
        shrink = kernel.run("%hpc shrink --nodes 1")
        assert shrink.status == "ok" and "2 ranks now" in shrink.stdout, shrink.error + shrink.stdout
        cell = run(25)
        assert cell.status == "ok", cell.error
        out = ast.literal_eval(kernel.run("out").result or "[]")
        assert [(o[0], o[1], o[2]) for o in out] == [(2, 25, True)] * 2


def test_horovod_goes_on_after_a_lost_node(devcluster, tf_env, tmp_path: Path,  # type: ignore[no-untyped-def]
                                           checkpoints: Path) -> None:
    """As for torch: an --elastic Horovod cell (Gloo from its start, as MPI would end every rank with the lost
    ones) goes on with n1's ranks from the last checkpoint."""
    try:
        with kernel_in_job(tf_env, tmp_path, ("-N2", "--no-kill", "--ntasks-per-node=2", "--gpus-per-node=2")) as k:
            assert k.run("%load_ext jupyter_hpcai").status == "ok" and k.run("%hpc start").status == "ok"
            with _node_fails_at_step_15(devcluster, "n2", k.job_id, checkpoints):
                cell = k.run(HOROVOD_TRAIN.format(options=" --elastic 2", folder=str(checkpoints), end=60, pause=0.2),
                             timeout=600)
            assert cell.status == "ok", cell.error + cell.stdout
            said = re.search(r"hpcai: (.*) lost at step (\d+); continuing on 2 ranks from step (\d+)", cell.stdout)
            assert said and said[1] == "rank 2 on n2, rank 3 on n2" and 15 <= int(said[3]) <= int(said[2]), cell.stdout
            out = ast.literal_eval(k.run("out").result or "[]")
            assert [(o[0], o[1], o[2]) for o in out] == [(2, 60, True)] * 2 and out[0][3] == out[1][3]
            assert _job_state(str(k.job_id)) == "RUNNING"
    finally:
        devcluster.up(timeout=300)  # n2's slurmd again


# The bench's loop: rank 0 prints when the loop took its first step after a (re)start
RESUMING = """%%torchrun{options}
import time
import torch.nn as nn
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = hpc.Checkpoint(model, opt, name="bench", directory={folder!r})
ckpt.restore()  # every rank at the last save's step (a grown rank's own count starts at 0)
x = torch.rand(32, 8); y = x.sum(1, keepdim=True)
first, stop = True, {end}
while hpc.steps() < stop:
    opt.zero_grad(); nn.functional.mse_loss(model(x), y).backward(); opt.step(); hpc.step()
    if first and rank == 0:
        print("resumed", time.time(), flush=True)
    first = False
    if hpc.steps() % 5 == 0:
        ckpt.save()
    time.sleep(0.2)
world_size
"""


def _resumed(stdout: str) -> float:
    return float(re.findall(r"resumed ([\d.]+)", stdout)[-1])


def _loss_recovery(kernel: JobKernel, folder: Path, elastic: bool, steps: list[tuple[float, ...]]) -> float:
    """Seconds from n2's ranks killed (after step 15) to the loop's first step again: on the survivors (elastic),
    or after %hpc restart and the cell run again (a plain restart, the baseline)."""
    shutil.rmtree(folder)
    folder.mkdir()
    assert kernel.run("%hpc restart").status == "ok"
    killed: list[float] = []

    def kill() -> None:
        latest = folder / "latest"
        wait_until(lambda: latest.exists() and latest.read_text().strip() >= "step-000000015", timeout=300,
                   what="step 15 saved")
        killed.append(time.time())
        for pid in _node_ranks("n2", kernel.job_id):
            os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill)
    killer.start()
    cell = kernel.run(RESUMING.format(options=" --elastic 2" if elastic else "", folder=str(folder), end=40),
                      timeout=600)
    killer.join()
    if not elastic:
        assert cell.status == "error" and "ranks died" in cell.error, cell.error
        assert kernel.run("%hpc restart").status == "ok"
        cell = kernel.run(RESUMING.format(options="", folder=str(folder), end=40), timeout=600)
    assert cell.status == "ok" and cell.result == ("2" if elastic else "4"), cell.error + cell.stdout
    assert ("continuing on 2 ranks" in cell.stdout) == elastic, cell.stdout
    if elastic:  # the steps the event line times
        took = re.search(r"\(survivors free ([\d.]+) s, renumbered ([\d.]+) s, checkpoint loaded ([\d.]+) s;", cell.stdout)
        assert took, cell.stdout
        steps.append(tuple(float(t) for t in took.groups()))
    return _resumed(cell.stdout) - killed[0]


def _grow_to_training(kernel: JobKernel, folder: Path, grow: bool) -> float:
    """Seconds from asking to the loop's first step: %hpc grow --wait then the cell on 4 ranks, or (the baseline)
    %hpc restart then the cell on the same 2; either way from the last save, 5 steps on."""
    start = time.time()
    assert kernel.run("%hpc grow --nodes 1 --wait" if grow else "%hpc restart", timeout=300).status == "ok"
    cell = kernel.run(RESUMING.format(options="", folder=str(folder), end="hpc.steps() + 5"), timeout=600)
    assert cell.status == "ok" and cell.result == ("4" if grow else "2"), cell.error + cell.stdout
    took = _resumed(cell.stdout) - start
    if grow:
        assert kernel.run("%hpc shrink --nodes 1").status == "ok"
    return took


def test_bench_elastic_against_a_plain_restart(devcluster, torch_env, tmp_path: Path, bench: list[str],  # type: ignore[no-untyped-def]
                                               checkpoints: Path) -> None:
    """Printed, never asserted: a lost node's recovery and a grow, each against %hpc restart + restore, alternating."""
    from statistics import median

    with kernel_in_job(torch_env, tmp_path / "a", ("-N2", "--ntasks-per-node=2", "--gpus-per-node=2")) as kernel:
        assert kernel.run("%load_ext jupyter_hpcai").status == "ok" and kernel.run("%hpc start").status == "ok"
        times: dict[bool, list[float]] = {True: [], False: []}
        steps: list[tuple[float, ...]] = []
        for round_ in range(2):
            for elastic in ((True, False) if round_ % 2 == 0 else (False, True)):
                times[elastic].append(_loss_recovery(kernel, checkpoints, elastic, steps))
    bench.append(f"elastic: lost node to training again, 2 x 2 ranks (torch, gloo): --elastic "
                 f"{median(times[True]):.1f} s / %hpc restart + restore {median(times[False]):.1f} s = "
                 f"{median(times[True]) / median(times[False]):.2f} (2 rounds alternating, medians; the ranks of n2 "
                 f"killed at step 15+; elastic {[round(t, 1) for t in times[True]]}, restart "
                 f"{[round(t, 1) for t in times[False]]}); of the elastic time: survivors free {median(t[0] for t in steps):.1f} s, "
                 f"renumbered {median(t[1] for t in steps):.1f} s, checkpoint loaded {median(t[2] for t in steps):.1f} s, "
                 "the rest the death seen, the framework's start on the survivors and the steps to the first new one")
    shutil.rmtree(checkpoints)
    checkpoints.mkdir()
    with kernel_in_job(torch_env, tmp_path / "b", ("-N1", "--ntasks-per-node=2", "--gpus-per-node=2")) as kernel:
        assert kernel.run("%load_ext jupyter_hpcai").status == "ok" and kernel.run("%hpc start").status == "ok"
        grown: dict[bool, list[float]] = {True: [], False: []}
        for round_ in range(3):
            for grow in ((True, False) if round_ % 2 == 0 else (False, True)):
                grown[grow].append(_grow_to_training(kernel, checkpoints, grow))
    bench.append(f"elastic: to the first step on a larger world: %hpc grow --nodes 1 --wait (n2 idle) + cell on 4 "
                 f"ranks {median(grown[True]):.1f} s / %hpc restart + restore + cell on 2 {median(grown[False]):.1f} s"
                 f" = {median(grown[True]) / median(grown[False]):.2f} (3 rounds alternating, medians)")


def test_horovod_over_mpi_is_the_launchs_world_and_refuses_to_change(devcluster, tf_env,  # type: ignore[no-untyped-def]
                                                                     tmp_path: Path) -> None:
    with kernel_in_job(tf_env, tmp_path, ("-N1", "--ntasks-per-node=2", "--gpus-per-node=2"),
                       environ={"HPCAI_HOROVOD_CONTROLLER": "mpi"}) as kernel:
        assert kernel.run("%load_ext jupyter_hpcai").status == "ok" and kernel.run("%hpc start").status == "ok"
        assert kernel.run("%%horovod_run\nhvd.mpi_enabled()").result == "True"
        cell = kernel.run("%%horovod_run --elastic 1\nhvd.size()")
        assert cell.status == "error" and "--elastic: Horovod runs over MPI here" in cell.error, cell.error
        assert "unset HPCAI_HOROVOD_CONTROLLER" in cell.error
        grow = kernel.run("%hpc grow --nodes 1")
        assert grow.status == "error" and "Horovod runs over MPI here" in grow.error, grow.error


def test_the_elastic_pages_torch_example_runs_twice_in_a_row(devcluster, torch_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The how-to's torch example, as a user pastes it, run twice with --elastic: the second run wraps the plain
    module again (never DDP inside DDP) and trains on from the first run's checkpoint."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "howto" / "elastic.md").read_text()
    example = re.search(r"```python\n%%torchrun\n(.*?)```", page, re.S)
    assert example, "the elastic page has no %%torchrun example"
    cell = (f"%%torchrun --elastic 2\nimport os; os.environ['HPCAI_CHECKPOINT_DIR'] = {str(tmp_path)!r}\n"
            + example.group(1))
    with kernel_in_job(torch_env, tmp_path, ("-N1", "-w", "n1", "--ntasks-per-node=2", "--gpus-per-node=2")) as k:
        assert k.run("%load_ext jupyter_hpcai").status == "ok" and k.run("%hpc start").status == "ok"
        for reached in (200, 400):
            done = k.run(cell, timeout=300)
            assert done.status == "ok", done.error + done.stdout
            said = k.run("%%torchrun\n(hpc.steps(), type(model.module).__name__)")
            assert said.result == f"({reached}, 'Linear')", said.error + said.stdout


def test_shrink_gives_the_notebook_jobs_other_node_back(devcluster, torch_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """In a 2-node job (the kernel on n1): n2's ranks stop and Slurm takes n2 out of the job; the world goes on on n1
    and a restart plans on the node the job still has."""
    with kernel_in_job(torch_env, tmp_path, ("-N2", "-w", "n[1-2]", "--ntasks-per-node=2", "--gpus-per-node=2")) as k:
        assert k.run("%load_ext jupyter_hpcai").status == "ok" and k.run("%hpc start").status == "ok"
        shrink = k.run("%hpc shrink --node n2")
        assert shrink.status == "ok", shrink.error
        assert f"n2 given back to Slurm (job {k.job_id})" in shrink.stdout and "2 ranks now" in shrink.stdout
        assert slurm.expand_hostlist((slurm.job_info(k.job_id) or {})["NodeList"]) == ["n1"]
        cwd = Path(k.run("import os; os.getcwd()").result.strip("'"))  # type: ignore[union-attr]
        assert not list(cwd.glob("slurm_job_*_resize.*"))  # Slurm's resize scripts: not in the notebook's folder
        assert k.run("%%torchrun\n(world_size, dist.get_world_size())").result == "(2, 2)"
        restarted = k.run("%hpc restart")
        assert restarted.status == "ok", restarted.error
        hosts = [line.split()[1] for line in k.run("%hpc status").stdout.splitlines()[1:]]
        assert hosts == ["n1", "n1"], hosts


RENDEZVOUS = """
import sys, time
from types import SimpleNamespace
from jupyter_hpcai.ranks.frameworks import horovod_rendezvous
world = SimpleNamespace(listens=sys.argv[1], services={})
print(*horovod_rendezvous(world, ["n1", "n1"], [sys.argv[2]])[1:], flush=True)  # its port and key
time.sleep(120)
"""
PUT = """
import http.client, sys
said = []
for path in sys.argv[4:]:  # as Horovod's client puts each: /<world's key>:<port>/<scope>/<key in the scope>
    conn = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=10)
    try:
        conn.putrequest("PUT", path)
        conn.putheader("Content-Length", sys.argv[3])
        conn.endheaders()
        conn.send(b"x" * min(int(sys.argv[3]), 64))
        said.append(str(conn.getresponse().status))
    except (OSError, http.client.HTTPException) as err:
        said.append(f"refused-{type(err).__name__}")
    finally:
        conn.close()
print(" ".join(said))
"""

HEAD = """
import http.client, sys
conn = http.client.HTTPConnection(sys.argv[1], int(sys.argv[2]), timeout=10)
conn.request("HEAD", "/")
print(conn.getresponse().status)
"""


def test_the_horovod_rendezvous_answers_only_the_worlds_nodes_with_its_key(devcluster, tf_env,  # type: ignore[no-untyped-def]
                                                                          tmp_path: Path) -> None:
    """Horovod's key-value store carries no key of its own: the kernel's rendezvous answers the world's nodes only,
    and only requests that carry the world's key (Horovod's client puts it in every path): another user on the
    nodes' network, or with a job on the world's own node, could otherwise rewrite where a rank listens or fill the
    kernel's memory. It holds the scopes, keys and bytes a world needs, no more, and refuses a PUT too big to be an
    address. n1 is the world's node here; n2 plays another user's."""
    from helpers.record import attack

    login, n1 = devcluster.login_address, devcluster.node_address("n1")
    server = subprocess.Popen([str(tf_env.current().python), "-c", RENDEZVOUS, login, n1], stdout=subprocess.PIPE,
                              text=True)
    try:
        port, key = server.stdout.readline().split()  # type: ignore[union-attr]

        def put(node: str, length: int, *paths: str) -> list[str]:
            done = subprocess.run(["ip", "netns", "exec", f"{devcluster.netns_prefix}{node}", sys.executable, "-c",
                                   PUT, login, port, str(length), *paths], capture_output=True, text=True, timeout=120)
            return done.stdout.split() or [done.stderr]

        keyed = f"/{key}:{port}"
        assert put("n1", 20, f"{keyed}/global_/0") == ["200"]  # the control: a rank of the world puts its address
        seen = put("n1", 20, "/global_/0", f"/{'0' * 32}:{port}/global_/0")
        attack("PUT into another user's Horovod rendezvous from their world's own node, without the world's key",
               seen == ["403", "403"], " ".join(seen))
        seen = put("n2", 20, f"{keyed}/global_/0")
        attack("PUT into another user's Horovod rendezvous from a node outside their world",
               seen[0].startswith("refused"), seen[0])
        seen = put("n1", 1 << 30, f"{keyed}/global_/0")
        attack("a 1 GiB PUT into the kernel's Horovod rendezvous", seen == ["413"], seen[0])
        head = subprocess.run(["ip", "netns", "exec", f"{devcluster.netns_prefix}n1", sys.executable, "-c", HEAD, login,
                               port], capture_output=True, text=True, timeout=60).stdout.strip()
        attack("HEAD (Python's file server's own) on the kernel's Horovod rendezvous: which files its folder holds",
               head == "405", head)
        scopes = put("n1", 20, *(f"{keyed}/scope{i}/0" for i in range(80)))  # a 2-rank world: 4 * 2 + 64 scopes
        keys = put("n1", 20, *(f"{keyed}/global_/{i}" for i in range(1100)))  # and 16 * 2 + 1024 keys in all
        first_full = keys.index("507") if "507" in keys else len(keys)
        attack("a world's own rank fills the kernel's rendezvous with scopes, then keys",
               scopes[:71] == ["200"] * 71 and set(scopes[71:]) == {"507"} and set(keys[first_full:]) == {"507"}
               and 0 < first_full < len(keys), f"scopes: {scopes.count('200')} taken, then {scopes.count('507')} "
               f"refused (507); keys: {keys.count('200')} taken, then {keys.count('507')} refused")
    finally:
        server.kill()


HOLDER = """
import datetime, sys
import torch.distributed as dist
from jupyter_hpcai.ranks.calls import held_port, take_held
addr = sys.argv[1]
port = held_port(addr)  # rank 0, as the kernel asks it for the world's port
print(port, flush=True)
sys.stdin.readline()  # the kernel computes the world's params meanwhile; then rank 0's store takes the socket
for world in range(2):  # and the next world's (a grown or rested one) after this one's store has gone
    held = take_held(port)
    store = dist.TCPStore(addr, port, 1, True, datetime.timedelta(seconds=30), master_listen_fd=held.detach(),
                          use_libuv=False)
    store.set("rank0", f"here {world}")
    said = store.get("rank0").decode()
    del store
    port = held_port(addr)
print(said, flush=True)
"""
TAKE = """
import socket, sys
try:
    socket.create_server((sys.argv[1], int(sys.argv[2]))).close()
    print("bound")
except OSError as err:
    print(f"refused-{err.errno}")
"""


def test_torchs_rendezvous_port_is_held_from_when_it_is_chosen(devcluster,  # type: ignore[no-untyped-def]
                                                               torch_env) -> None:
    """torch's store takes no key: its port must be the world's from the moment rank 0 names it. Rank 0 binds it
    and holds it until its store serves there (calls.held_port), so bob, another user on the node, cannot take it
    first. The control: a port chosen and let go (the old way) is bob's for the taking."""
    from helpers.hub import BOB, as_user, ensure_user
    from helpers.record import attack

    ensure_user(BOB)
    addr = "127.0.0.1"
    rank0 = subprocess.Popen([str(torch_env.current().python), "-c", HOLDER, addr], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        port = rank0.stdout.readline().strip()  # type: ignore[union-attr]
        taken = as_user(BOB, sys.executable, "-c", TAKE, addr, port).stdout.strip()
        rank0.stdin.write("\n")  # type: ignore[union-attr]
        rank0.stdin.flush()  # type: ignore[union-attr]
        served = rank0.stdout.readline().strip()  # type: ignore[union-attr]
    finally:
        rank0.kill()
    assert served == "here 1"  # rank 0's store serves on the socket it held, and the next world's on its own
    with socket.socket() as chosen:  # the control: chosen, then let go
        chosen.bind((addr, 0))
        free = str(chosen.getsockname()[1])
    control = as_user(BOB, sys.executable, "-c", TAKE, addr, free).stdout.strip()
    attack("bob binds the port alice's rank 0 named for her torch rendezvous, before her store serves there",
           taken.startswith("refused") and control == "bound",
           f"bob's bind: {taken}; control, a port chosen and let go: {control}")
