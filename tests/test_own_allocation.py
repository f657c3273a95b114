"""A kernel in no Slurm job asks for an allocation of its own (``%hpc start --nodes 2 ...``; a login-node JupyterLab
without salloc, Open OnDemand): it waits with Slurm's reason and expected start, starts the engines on the nodes
once the job runs, releases the job at ``%hpc stop``, and a killed kernel's job ends itself (its keepalive stops).
The kernel runs on the login host; the ranks on n1 and n2, separate network hosts."""

from __future__ import annotations

import html
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from helpers.kernels import JobKernel, kernel_outside_job
from jupyter_hpcai.scheduler import slurm
from jupyter_hpcai.scheduler.interface import TERMINAL_STATES
from jupyter_hpcai.demo import check_cells
from jupyter_hpcai.devcluster import SEPARATE
from jupyter_hpcai.engines import own_job
from jupyter_hpcai.proc import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

GRACE = 8  # HPCAI_OWN_JOB_GRACE in the test kernel: seconds a killed kernel's job outlives it
KERAS = dict((step, cell) for step, cell, _ in check_cells())["train a small Keras model on 4 ranks"]  # the demo's


def _state(job: str) -> str:
    return (slurm.job_info(job) or {}).get("JobState", "gone")


def _ended(job: str, timeout: float) -> str:
    """The job's state once it has ended (within ``timeout`` s)."""
    return wait_until(lambda: _state(job) if _state(job) in {*TERMINAL_STATES, "gone"} else None,
                      timeout=timeout, what=f"Slurm job {job} to end")


def _kernel_job(states: str, fields: str = "%i") -> str | None:
    """``fields`` of the test kernel's job while it is in one of ``states`` (squeue's names, comma-separated)."""
    out = subprocess.run(["squeue", "--noheader", "--name=hpcai-kernel", f"--states={states}", f"--format={fields}"],
                         capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    return out or None


def _free_nodes_once_waited_for(blocker: int) -> None:
    """Cancel ``blocker`` once a kernel's job waits behind it and Slurm has said when it expects to start it (so the
    kernel sees the wait, its reason, the expected start, and the start)."""
    wait_until(lambda: re.fullmatch(r"Resources \d{4}-\S+", _kernel_job("PENDING", "%r %S") or ""), timeout=120,
               what="the kernel's job to wait for resources, with an expected start")
    time.sleep(2 * own_job.POLL)  # the kernel asks Slurm every POLL s: it sees the expected start before the start
    subprocess.run(["scancel", str(blocker)], timeout=30, check=True)


@pytest.mark.oldest_slurm
def test_a_kernel_with_no_allocation_asks_for_one_and_releases_it(devcluster, tf_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert devcluster.mode == SEPARATE, "the kernel must be on a host apart from the nodes"
    assert _kernel_job("PENDING,RUNNING") is None, "a kernel job of an earlier test is still there"
    # 3 of each node's 4 GPUs busy: a 2 x 2 request waits for them
    blocker = slurm.submit(["--nodes=2", "--gpus-per-node=3", "--time=10:00", "--output=/dev/null", "--wrap=sleep 600"])
    wait_until(lambda: _state(str(blocker)) == "RUNNING", timeout=60, what="the blocking job to run")
    freeing = threading.Thread(target=_free_nodes_once_waited_for, args=(blocker,), daemon=True)
    try:
        with kernel_outside_job(tf_env, tmp_path, {"HPCAI_OWN_JOB_GRACE": str(GRACE)}) as kernel:
            assert kernel.run("import os\n'SLURM_JOB_ID' in os.environ").result == "False"
            assert kernel.run("%load_ext jupyter_hpcai").status == "ok"
            untimed = kernel.run("%hpc start --nodes 2 --gpus-per-node 2")  # GPU nodes held: always for how long
            assert untimed.status == "error" and "add --time" in untimed.error, untimed
            freeing.start()
            started = kernel.run("%hpc start --nodes 2 --gpus-per-node 2 --time 10:00", timeout=300)
            assert started.status == "ok", started.error
            job = _asked_and_waited(started.stdout)
            _trains_on_the_nodes(kernel, job, devcluster.login_address)
            other = kernel.run("%hpc start --nodes 1 --time 5m")  # one job at a time: never dropped for another
            assert other.status == "error" and f"this kernel holds Slurm job {job}" in other.error, other
            assert _state(job) == "RUNNING" and kernel.run("len(E.current().status())").result == "4"

            stopped = kernel.run("%hpc stop")
            assert stopped.stdout.strip() == f"engines stopped; Slurm job {job} released", stopped
            assert _ended(job, timeout=30) == "CANCELLED"
            assert kernel.run("'SLURM_JOB_ID' in os.environ").result == "False"  # out of the job again

            _a_job_that_ended_is_left(kernel)
            _the_panel_asks_too(kernel)
            _a_killed_kernels_job_ends_itself(kernel)
    finally:
        subprocess.run(["scancel", str(blocker)], timeout=30, check=False)
        if leftover := _kernel_job("PENDING,RUNNING"):
            subprocess.run(["scancel", leftover], timeout=30, check=False)


def _asked_and_waited(said: str) -> str:
    """The start's words: what it asked for, Slurm's reason while pending, the engines in that job."""
    assert "asking Slurm for 2 node(s) x 2 GPU(s) for 00:10:00" in said, said
    waited = re.search(r"^Slurm job (\d+): pending \(Resources\), expected start \d{4}-\d\d-\d\dT[\d:]+$", said, re.M)
    assert waited, said
    job = waited[1]
    assert f"4 engines ready (srun) in this kernel's Slurm job {job}" in said, said
    return job


def _trains_on_the_nodes(kernel: JobKernel, job: str, login_address: str) -> None:
    where = kernel.run("import jupyter_hpcai.engines as E\n"
                       "(os.environ['SLURM_JOB_ID'], E.current().set.listens, [r.host for r in E.current().status()])")
    assert where.result == repr((job, login_address, ["n1", "n1", "n2", "n2"])), where
    cell = kernel.run(KERAS, timeout=900)  # the cell's own --timeout
    assert cell.status == "ok", cell.error
    assert re.search(r"\] \d+ samples/sec on 4 ranks$", cell.stdout, re.M), cell.stdout
    assert _state(job) == "RUNNING"


def _a_job_that_ended_is_left(kernel: JobKernel) -> None:
    """A job that ends under the kernel (its time limit; here scancel): the next start says so and leaves it, and
    the kernel may ask for a new one."""
    started = kernel.run("%hpc start --nodes 1 --gpus-per-node 1 --time 5m", timeout=300)
    assert started.status == "ok", started.error
    job = re.search(r"in this kernel's Slurm job (\d+)", started.stdout)[1]  # type: ignore[index]
    subprocess.run(["scancel", job], timeout=30, check=True)
    _ended(job, timeout=30)
    again = kernel.run("%hpc start", timeout=120)
    assert again.status == "error" and f"this kernel's Slurm job {job} is no longer running" in again.error, again
    assert "ask for a new one" in again.error
    assert kernel.run("'SLURM_JOB_ID' in os.environ").result == "False"


def _the_panel_asks_too(kernel: JobKernel) -> None:
    """The ClusterPanel's way: "a Slurm job of its own", Start (waiting in a thread: the kernel answers cells
    meanwhile), the wait shown in its state line, the ranks on the nodes, Stop releasing the job."""
    clicked = kernel.run("from jupyter_hpcai.widgets import ClusterPanel\npanel = ClusterPanel()\nshown = []\n"
                         "_ = panel.engines.subscribe(lambda e: shown.append(panel.state.value))\n"
                         "panel.where.value = 'a Slurm job of its own'\n"
                         "panel.nodes.value, panel.gpus_per_node.value, panel.time.value = 2, 1, '5m'\n"
                         "panel.start_button.click()\npanel.ask_row.layout.display")
    assert clicked.result == "''", clicked  # the request's fields are shown
    # the start's thread redraws the panel once start() returns, after the state turned 'running'
    wait_until(lambda: kernel.run("panel.engines.state").result == "'stopped'"
               or "this kernel" in kernel.run("panel.header.value").result, timeout=180, what="the panel's start")
    done = kernel.run("job = panel.engines.own_job.job_id\n"
                      "(panel.message.value, sorted(r.host for r in panel.engines.ranks),"
                      " [s for s in shown if 'waiting for Slurm' in s][:1], job, panel.header.value)")
    message, hosts, waiting, job, header = eval(done.result)  # noqa: S307 - our own kernel's repr of a tuple of str
    assert (message, hosts) == ("", ["n1", "n2"]), done
    assert html.unescape(header).endswith(f"job {job} on n1, n2 (this kernel's own)"), header
    assert waiting and re.search(rf"Slurm job {job} \(.+\), expected start", waiting[0]), waiting
    assert kernel.run("panel.stop_button.click()\npanel.engines.state").result == "'stopped'"
    assert _ended(job, timeout=30) == "CANCELLED"


def _controllers_of(kernel_pid: int) -> list[psutil.Process]:
    """The controller a kernel started (a child of the kernel, beside it on the login host)."""
    return [child for child in psutil.Process(kernel_pid).children()
            if "controller" in " ".join(child.cmdline()) and "ipyparallel" in " ".join(child.cmdline())
            or "jupyter_hpcai.engines.controller" in " ".join(child.cmdline())]


def _a_killed_kernels_job_ends_itself(kernel: JobKernel) -> None:
    """kill -9: no atexit, no %hpc stop; the job's shell sees the keepalive file stand still and ends the job."""
    started = kernel.run("%hpc start --nodes 2 --gpus-per-node 1 --time 10:00", timeout=300)
    assert started.status == "ok", started.error
    job = re.search(r"in this kernel's Slurm job (\d+)", started.stdout)[1]  # type: ignore[index]
    controllers = _controllers_of(kernel.pid)
    assert len(controllers) == 1, controllers
    os.kill(kernel.pid, signal.SIGKILL)
    assert _ended(job, timeout=GRACE + 40) == "COMPLETED"  # its shell exited: not cancelled by anyone
    # and the controller beside the kernel on the login host stops too (it is tied to its kernel)
    wait_until(lambda: not controllers[0].is_running() or controllers[0].status() == psutil.STATUS_ZOMBIE, timeout=30,
               what="the killed kernel's controller to stop")
    log = Path.home() / ".hpcai" / "logs" / f"kernel-{job}.log"
    assert "hpcai: the kernel no longer keeps this job: released" in log.read_text(), log.read_text()
