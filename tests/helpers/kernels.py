"""Real kernels and JupyterLabs on the dev cluster for tests: a kernel inside a job, beside one (on the login
host under salloc), or in none; JupyterLab inside a job. Each is driven over its own channels or HTTP."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_hpcai.envs import EnvDir, open_env
from jupyter_hpcai.spawner.script import NODE_ADDRESS

ANSI = re.compile(r"\x1b\[[0-9;]*m")
LOGS = ("job.out", "salloc.out", "kernel.out")  # what kernel_in_job, kernel_beside_job and kernel_outside_job write


@dataclass
class Cell:
    status: str
    stdout: str = ""
    error: str = ""  # the error's rendering (ename, message, hint or traceback), ANSI colours removed
    result: str | None = None
    displays: list[str] = field(default_factory=list)  # display_data and update_display_data, as text/plain


class JobKernel:
    """A real Jupyter kernel (started through the hpcai-env provisioner) inside a dev-cluster job."""

    def __init__(self, connection_file: Path, job_id: int) -> None:
        from jupyter_client import BlockingKernelClient

        self.job_id, self.connection = job_id, connection_file
        self.client = BlockingKernelClient()
        self.client.load_connection_file(str(connection_file))
        # no KernelManager here: "alive" is the heartbeat, and a kernel starting slowly (a loaded machine, or
        # python in proot) must not count as dead after the default 1 s without a beat
        self.client.hb_channel.time_to_dead = 30.0
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)
        self.pid = int(self.run("import os; os.getpid()").result or 0)

    def _logs(self) -> str:
        """The ends of the job's and the kernel's logs beside the connection file (a failure's message)."""
        logs = [self.connection.parent / name for name in LOGS]
        return "\n".join(f"--- {log.name}:\n{log.read_text(errors='replace')[-3000:]}" for log in logs if log.exists())

    def run(self, code: str, timeout: float = 300) -> Cell:
        cell = Cell(status="")

        def hook(msg: dict) -> None:  # type: ignore[type-arg]
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                cell.stdout += content["text"]
            elif kind == "error":
                cell.error = ANSI.sub("", "\n".join(content["traceback"]) or f"{content['ename']}: {content['evalue']}")
            elif kind == "execute_result":
                cell.result = content["data"]["text/plain"]
            elif kind in ("display_data", "update_display_data"):
                cell.displays.append(content["data"].get("text/plain", ""))

        # stop_on_error=False: ipykernel 7 aborts an execute request that reaches it in the instant after an error
        # reply (its abort flag is cleared by a message it queues itself). A person never sends that fast; a test
        # does, and would see 'aborted' for a cell that followed an error. Nothing is ever queued here anyway.
        # Read here, not with execute_interactive: its loop once spun for 20 minutes past its timeout in a full run
        # (its poller kept reporting a socket it then found nothing on), and a fixture has no pytest timeout.
        deadline = time.monotonic() + timeout
        msg_id = self.client.execute(code, stop_on_error=False, allow_stdin=False)

        def left() -> float:
            if (seconds := deadline - time.monotonic()) <= 0:
                raise TimeoutError(f"no reply within {timeout:g} s; the cell printed:\n{cell.stdout[-3000:]}\n"
                                   f"{self._logs()}")
            return min(seconds, 5.0)

        idle = False
        while not idle:
            with suppress(queue.Empty):
                msg = self.client.get_iopub_msg(timeout=left())
                if msg["parent_header"].get("msg_id") == msg_id:
                    hook(msg)
                    idle = msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
        while True:
            with suppress(queue.Empty):
                reply = self.client.get_shell_msg(timeout=left())
                if reply["parent_header"].get("msg_id") == msg_id:
                    cell.status = reply["content"]["status"]
                    return cell


# NODE_ADDRESS, in a job's shell line: the node's address as Slurm knows it (the job script's own expression),
# where the test (on the login node) reaches a server or kernel that the job starts (the node's loopback is its own).


def job_node_address(job: int) -> str:
    """The Slurm address of the first node of ``job``, once it runs."""
    from jupyter_hpcai.scheduler import slurm
    from jupyter_hpcai.proc import wait_until

    def batch_host() -> str | None:
        host = (slurm.job_info(job) or {}).get("BatchHost", "")
        return host if host not in ("", "(null)") else None

    host = wait_until(batch_host, timeout=300, what=f"job {job} to start")
    return slurm.node_address(host)


@contextmanager
def kernel_in_job(env: EnvDir, work: Path, sbatch_args: tuple[str, ...] = ("-N2", "--ntasks-per-node=2", "--gpus-per-node=2"),
                  environ: dict[str, str] | None = None, beside: str = "", user: str = "") -> Iterator[JobKernel]:
    """A notebook kernel in ``env`` (through the hpcai-env provisioner), inside a dev-cluster job (the job's
    environment: this process's, updated with ``environ``); ``beside``: a command the job starts first, in the
    background (as a notebook job's script starts its engines beside the server); ``user``: the job submitted by that
    user's own sbatch (Slurm 24.11 refuses root's ``sbatch --uid``)."""
    from jupyter_hpcai.scheduler import slurm

    connection = work / "kernel.json"
    args = [*sbatch_args, "--time=00:45:00", f"--output={work}/job.out",
            "--wrap", f"{beside + ' & ' if beside else ''}"
                      f"{_kernel_command(env, work, connection)} --KernelManager.ip={NODE_ADDRESS}"]
    job_env = {**os.environ, **(environ or {}), "JUPYTER_PATH": str(work / "share" / "jupyter")}
    if user:
        done = subprocess.run(["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "env", "sbatch",
                               "--parsable", *args], env=job_env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        job = int(done.stdout.split(";")[0])
    else:
        job = slurm.submit(args, env=job_env)
    try:
        with _connected(connection, lambda: job) as kernel:
            yield kernel
    finally:
        subprocess.run(["scancel", str(job)], timeout=30, check=False)


@contextmanager
def kernel_beside_job(env: EnvDir, work: Path, salloc_args: tuple[str, ...] = ("-N2", "--ntasks-per-node=2",
                                                                                  "--gpus-per-node=2")) -> Iterator[JobKernel]:
    """A notebook kernel in ``env`` on this host, the login node, under ``salloc``: the allocation's variables are
    set, the kernel is on no node, and only job steps run on the nodes (a login-node JupyterLab, Open OnDemand)."""
    import shlex

    connection, log = work / "kernel.json", work / "salloc.out"
    with open(log, "w") as out:
        salloc = subprocess.Popen(["salloc", *salloc_args, "--time=00:30:00",
                                   *shlex.split(_kernel_command(env, work, connection))],
                                  env={**os.environ, "JUPYTER_PATH": str(work / "share" / "jupyter")},
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    def granted() -> int:
        found = re.search(r"Granted job allocation (\d+)", log.read_text())
        return int(found[1]) if found else 0

    kernel_pid = 0
    try:
        with _connected(connection, granted) as kernel:
            kernel_pid = kernel.pid
            yield kernel
    finally:
        if granted():
            subprocess.run(["scancel", str(granted())], timeout=30, check=False)
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):  # jupyter-kernel may linger on SIGTERM
            os.killpg(salloc.pid, sig)
            try:
                salloc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        _kill_kernel(kernel_pid)  # salloc runs jupyter-kernel in a process group of its own: killpg missed it


@contextmanager
def kernel_outside_job(env: EnvDir, work: Path, environ: dict[str, str] | None = None) -> Iterator[JobKernel]:
    """A notebook kernel in ``env`` on this host, the login node, in no Slurm job at all (a login-node JupyterLab
    without salloc); its environment: this process's without any SLURM_* variable, updated with ``environ``."""
    import shlex

    connection = work / "kernel.json"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_JOB") and k != "SLURM_NODELIST"}
    with open(work / "kernel.out", "w") as out:
        kernel = subprocess.Popen(shlex.split(_kernel_command(env, work, connection)), stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True,
                                  env={**clean, **(environ or {}), "JUPYTER_PATH": str(work / "share" / "jupyter")})
    kernel_pid = 0
    try:
        with _connected(connection, lambda: 0) as connected:
            kernel_pid = connected.pid
            yield connected
    finally:
        _kill_kernel(kernel_pid)  # in a session of its own (jupyter-kernel starts it so)
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
            try:
                os.killpg(kernel.pid, sig)
                kernel.wait(timeout=grace)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue


def _kill_kernel(pid: int) -> None:
    """SIGKILL a test's kernel and the jupyter-kernel that started it (each leads a process group of its own)."""
    import psutil

    try:
        kernel = psutil.Process(pid) if pid else None
        parent = kernel.parent() if kernel else None
    except psutil.NoSuchProcess:
        return
    for proc in (kernel, parent):
        with suppress(psutil.NoSuchProcess):
            if proc is not None and (proc is kernel or "jupyter-kernel" in " ".join(proc.cmdline())):
                proc.kill()


def _kernel_command(env: EnvDir, work: Path, connection: Path) -> str:
    """The command line of a kernel in ``env`` (its kernelspec installed under ``work``) writing ``connection``."""
    import sys

    from jupyter_hpcai import kernelspec

    kernelspec.install(open_env(env), prefix=str(work))
    return (f"{Path(sys.executable).parent}/jupyter-kernel --kernel={kernelspec.kernel_name(env)} "
            f"--KernelManager.connection_file={connection}")


@contextmanager
def _connected(connection: Path, job: Callable[[], int]) -> Iterator[JobKernel]:
    """A client of the kernel of ``job()``, once it has written ``connection``; its channels stopped after."""
    from jupyter_hpcai.proc import wait_until

    wait_until(lambda: _whole_json(connection), timeout=300, what="the kernel to write its connection file")
    kernel = JobKernel(connection, job())
    yield kernel
    kernel.client.stop_channels()


def _whole_json(path: Path) -> dict | None:  # type: ignore[type-arg]
    """The file's JSON once it is there and completely written (it exists, empty, while it is written)."""
    try:
        return json.loads(path.read_text()) or None
    except (FileNotFoundError, ValueError):
        return None


@dataclass
class JobLab:
    url: str
    token: str
    root: Path
    job_id: int


LAB_JOB = ("-N1", "--nodelist=n1", "--ntasks-per-node=2", "--gpus-per-node=2")


@contextmanager
def lab_in_job(tf_env: EnvDir, work: Path, walltime: str = "00:30:00", shape: tuple[str, ...] = LAB_JOB
               ) -> Iterator[JobLab]:
    """JupyterLab inside a job of ``shape`` (sbatch's options; by default 1 node, n1, with 2 fake GPUs) and
    ``walltime``; the job is cancelled afterwards."""
    import secrets
    import sys

    from helpers.jupyter import Server, answers, free_port
    from jupyter_hpcai import kernelspec
    from jupyter_hpcai.scheduler import slurm
    from jupyter_hpcai.proc import wait_until

    kernelspec.install(open_env(tf_env), prefix=str(work))
    settings = work / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    port, token = free_port(), secrets.token_hex(16)
    cmd = (f"{Path(sys.executable).parent}/jupyter-lab --no-browser --allow-root --ip={NODE_ADDRESS} --port={port} "
           f"--IdentityProvider.token={token} --ServerApp.root_dir={work}")
    # on n1, as the tests read it: the previous test's job may still be completing there (Slurm would pick n2)
    job = slurm.submit([*shape, f"--time={walltime}", f"--output={work}/lab.log", "--wrap", cmd],
                       env={**os.environ, "JUPYTER_PATH": str(work / "share" / "jupyter"),
                            "JUPYTERLAB_SETTINGS_DIR": str(work / "settings"), "IPYTHONDIR": str(work / "ipython")})
    try:
        address = job_node_address(job)

        def serving() -> str | None:  # the port it took: ours, or the next one when ours was taken on the node
            log = work / "lab.log"
            found = re.search(rf"http://{re.escape(address)}:(\d+)/lab", log.read_text(errors="replace") if log.exists() else "")
            return f"http://{address}:{found.group(1)}" if found else None

        url = wait_until(serving, timeout=120, what=f"JupyterLab in job {job} to start (its log: {work}/lab.log)")
        lab = JobLab(url, token, work, job)
        wait_until(lambda: answers(Server(lab.url, token, work / "lab.log")), timeout=60,
                   what=f"JupyterLab in job {job} to answer (its log: {work}/lab.log)")
        yield lab
    finally:
        subprocess.run(["scancel", str(job)], timeout=30, check=False)
