"""A kernel's own allocation (runs in the kernel): what ``%hpc start --nodes N --gpus-per-node G --time T`` submits
from a kernel outside any Slurm job (a login-node JupyterLab, Open OnDemand).

The job holds the nodes and does nothing else: its batch shell waits while the kernel keeps a keepalive file in the
(shared) home changing. Once it runs, the kernel enters it the way ``salloc``'s shell does: the job's ``SLURM_*``
variables are set in the kernel's environment, so the engines start as steps of it exactly as they do under salloc.
It is released by ``%hpc stop``, by the kernel's exit, and, should the kernel be killed before either, by the job
itself: its shell exits once the keepalive file has not changed for ``HPCAI_OWN_JOB_GRACE`` seconds (default 120),
and Slurm ends every step with it. Content is compared, not times: no clock or NFS attribute cache is trusted.
"""

from __future__ import annotations

import atexit
import getpass
import os
import re
import secrets
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..errors import HPCAIError
from ..joblog import DEFAULT_DIR as LOG_DIR
from ..proc import run
from ..scheduler import chosen
from ..scheduler.allocation import Allocation
from ..scheduler.durations import format_duration
from ..scheduler.interface import TERMINAL_STATES
from ..scheduler.jobscript import JobScript, ranks_per_node

scheduler = chosen()
environment = chosen().environment

GRACE_VAR = "HPCAI_OWN_JOB_GRACE"  # seconds without a keepalive before the job ends itself (read by the kernel)
DEFAULT_GRACE = 120
JOB_NAME = "hpcai-kernel"
STALE = 7 * 24 * 3600  # keepalive files of kernels killed this long ago are removed at the next submission
POLL = 5  # seconds between a waiting kernel's looks at its job, at most (one squeue call each)
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# the job's shell: it waits while the kernel keeps changing the keepalive file (and the file is there)
HOLD = """\
# held for a notebook kernel: ends once {name} has not changed for {grace} s
alive={path} last= quiet=0
[ -e "$alive" ] || echo "hpcai: $alive is not there on $(hostname): the kernel's home must be the same on the nodes"
while [ "$quiet" -lt {grace} ] && [ -e "$alive" ]; do
  now=$(cat "$alive" 2>/dev/null)
  if [ "$now" != "$last" ]; then last=$now quiet=0; else quiet=$((quiet + {step})); fi
  sleep {step}
done
echo "hpcai: the kernel no longer keeps this job: released $(date -Is)"
"""
Pending = Callable[[dict[str, str]], None]  # called with the job's record (JobState, Reason, StartTime) on each change


@dataclass(frozen=True)
class Request:
    """The allocation a kernel asks for: whole ranks, one per GPU."""

    nodes: int
    gpus_per_node: int
    time_limit: int  # seconds: a job that holds GPU nodes always says for how long
    partition: str | None = None
    account: str | None = None

    def __post_init__(self) -> None:
        for label, value in (("--nodes", self.nodes), ("--gpus-per-node", self.gpus_per_node),
                             ("--time", self.time_limit)):
            if value < 1:
                raise HPCAIError(f"{label} must be at least 1, not {value}")
        for label, value in (("--partition", self.partition), ("--account", self.account)):
            if value is not None and not _NAME.fullmatch(value):
                raise HPCAIError(f"{label} {value!r} is not a Slurm name", "letters, digits, '_', '.' and '-' only "
                                                                         "(sinfo lists the partitions)")

    def describe(self) -> str:
        where = f" in {self.partition}" if self.partition else ""
        return f"{self.nodes} node(s) x {self.gpus_per_node} GPU(s){where} for {format_duration(self.time_limit)}"

    def job(self, keepalive: Path, grace: int, log: Path) -> JobScript:
        """The batch job: the request, then a shell that waits while ``keepalive`` keeps changing. Only PATH
        reaches its shell from the kernel's environment (never the kernel's secrets)."""
        step = max(1, min(5, grace // 4))
        return JobScript(name=JOB_NAME, nodes=self.nodes, tasks_per_node=ranks_per_node(self.gpus_per_node),
                         gpus_per_node=self.gpus_per_node, time=format_duration(self.time_limit),
                         partition=self.partition, account=self.account, output=str(log), extra=("--export=PATH",),
                         body=HOLD.format(name=keepalive.name, path=shlex.quote(str(keepalive)), grace=grace,
                                          step=step))

    def as_allocation(self) -> Allocation:
        """The allocation this request would get, to check a start's layout against before anything is submitted."""
        return Allocation(job_id="(asked)", partition=self.partition or "",
                          nodes=[f"node{i}" for i in range(self.nodes)],
                          gpus_per_node=self.gpus_per_node, cpus_per_node=0, tasks=self.nodes * self.gpus_per_node,
                          gpus_here=[], end_time=None)

def log_folder() -> Path:
    """Where the kernel's own jobs (this one's, grown ones) write their output: private, in the user's home."""
    try:
        return paths.private_dir(LOG_DIR.expanduser())
    except OSError as err:
        raise HPCAIError(f"cannot make the job log folder {LOG_DIR} in your home: {err}",
                         "check the home's space and permissions (~/.hpcai)") from None


def waiting(info: dict[str, str]) -> str:
    """Why a job waits and when Slurm expects to start it, from its record: "(Resources), expected start T"."""
    reason = info["Reason"] if info["Reason"] not in ("", "None") else "not scheduled yet"
    return f"({reason}), expected start {info['StartTime'] or 'not known yet'}"


def grace() -> int:
    """Seconds the job outlives a kernel that stopped keeping it alive (``HPCAI_OWN_JOB_GRACE``)."""
    value = os.environ.get(GRACE_VAR, "")
    if not value:
        return DEFAULT_GRACE
    if not value.isdigit() or not 4 <= int(value) <= 3600:
        raise HPCAIError(f"{GRACE_VAR}={value!r} is not a number of seconds between 4 and 3600",
                         f"unset it (default {DEFAULT_GRACE}) or fix it")
    return int(value)


class OwnJob:
    """One submitted allocation of this kernel: submit, wait until it runs, enter it, release it."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.job_id = ""
        self.grace = grace()
        try:
            folder = paths.private_dir(Path.home() / ".hpcai" / "kernel-jobs")
            self.log = paths.private_dir(LOG_DIR.expanduser()) / "kernel-%j.log"
        except OSError as err:
            raise HPCAIError(f"cannot make this kernel's job folders in your home: {err}",
                             "check the home's space and permissions (~/.hpcai)") from None
        self.keepalive = folder / f"{secrets.token_hex(8)}.alive"
        self.pid = os.getpid()  # a forked child's exit must not release its parent's job
        self.entered: dict[str, str] = {}  # the scheduler's variables set in this kernel while it is in the job
        self._stopped = threading.Event()
        self._file_lock = threading.Lock()  # the keepalive thread never writes the file back after release removed it

    def job_script(self) -> JobScript:
        return self.request.job(self.keepalive, self.grace, self.log)

    def submit(self) -> str:
        """Submit the job (the keepalive running first, so a slow start never reads as a dead kernel)."""
        _remove_stale(self.keepalive.parent)
        self._keep_alive()
        atexit.register(self.release)  # the kernel's exit; a killed kernel's job ends itself (the keepalive)
        try:
            # its options on sbatch's command line too: a site's SBATCH_* variables cannot change them there
            self.job_id = str(self.job_script().submit(on_command_line=True).job_id)
        except HPCAIError as err:
            self.release()
            raise HPCAIError(f"Slurm refused the allocation ({self.request.describe()}): {err.message}",
                             "check --partition, --account and the limits "
                             "(sinfo, sacctmgr show assoc user=$USER)") from None
        return self.job_id

    def wait(self, pending: Pending | None = None) -> dict[str, str]:
        """Until the job runs (its record then); ``pending`` hears each change of state, reason or expected start.
        A job that ends first raises with Slurm's reason."""
        seen: tuple[str, ...] = ()
        interval = 0.25
        while True:
            info = scheduler.job_info(self.job_id)
            if self._stopped.is_set():
                raise HPCAIError(f"Slurm job {self.job_id} was released before it ran", "start again when you want it")
            if info is None or info["JobState"] in TERMINAL_STATES:
                state = info["JobState"] if info else "gone"
                reason = f", {info['Reason']}" if info and info["Reason"] else ""
                self.release()
                raise HPCAIError(f"Slurm job {self.job_id} ended before it ran ({state}{reason})",
                                 f"its log: {self.log_path()}; check the request ({self.request.describe()})")
            if info["JobState"] == "RUNNING" and info["NodeList"]:
                return info
            now = (info["JobState"], info["Reason"], info["StartTime"])
            if pending and now != seen:
                pending(info)
            seen = now
            self._stopped.wait(interval)
            interval = min(POLL, interval * 2)

    def enter(self, info: dict[str, str]) -> None:
        """Set in this kernel's environment what salloc sets in its shell for this job, as Slurm granted it (a
        job_submit plugin may have changed the request); refused once the job was released (a Stop meanwhile)."""
        nodes = scheduler.expand_hostlist(info["NodeList"])
        per_node = scheduler.gres_gpus(info["TresPerNode"]) or self.request.gpus_per_node
        with self._file_lock:
            if self._stopped.is_set():
                raise HPCAIError(f"Slurm job {self.job_id} was released as it started", "start again when you want it")
            self.entered = environment.enter(os.environ, self.job_id, info["NodeList"], info["Partition"], per_node,
                                             len(nodes), info["Account"])

    def log_path(self) -> Path:
        return Path(str(self.log).replace("%j", self.job_id))

    def gone(self) -> HPCAIError | None:
        """The error that says the job no longer runs (a time limit may have ended it); None while it runs."""
        info = scheduler.job_info(self.job_id)
        if info and info["JobState"] == "RUNNING":
            return None
        state = info["JobState"] if info else "gone"
        return HPCAIError(f"this kernel's Slurm job {self.job_id} is no longer running ({state})",
                          f"ask for a new one: %hpc start --nodes {self.request.nodes} --gpus-per-node "
                          f"{self.request.gpus_per_node} --time ...")

    def release(self) -> None:
        """Leave the job and end it (harmless twice): the keepalive stops, its file goes, scancel (only a job of
        this user's with this name: an id Slurm gave out again, long after, is left alone)."""
        if os.getpid() != self.pid:
            return
        atexit.unregister(self.release)
        with self._file_lock:
            self._stopped.set()
            self.keepalive.unlink(missing_ok=True)
            environment.leave(os.environ, self.entered)
            self.entered = {}
        if self.job_id:
            try:
                run(scheduler.cancel_argv(self.job_id, user=getpass.getuser(), name=JOB_NAME), check=False,
                    timeout=30)
            except HPCAIError:
                pass  # Slurm did not answer: the job still ends itself once its keepalive stands still

    def _keep_alive(self) -> None:
        """Write a new number into the keepalive file every grace/6 s from a daemon thread, while kept."""
        every = self.grace / 6

        def beat() -> None:
            count = 0
            while not self._stopped.wait(every):
                count += 1
                with self._file_lock:
                    if self._stopped.is_set():
                        return
                    try:
                        self.keepalive.write_text(f"{count}\n")
                    except OSError:
                        pass  # a full or vanished home: the job ends itself after its grace, as for a dead kernel

        self.keepalive.write_text("0\n")
        threading.Thread(target=beat, name="hpcai-own-job-keepalive", daemon=True).start()


def check_request(ask: Request, launcher: str | None, allocation: Allocation | None, held: OwnJob | None) -> None:
    """An allocation may be asked for outside any job (``allocation``, unless it is ``held``, the kernel's own job),
    once, for ranks that srun starts."""
    if allocation is not None and held is None:
        raise HPCAIError(f"this kernel runs in Slurm job {allocation.job_id} already",
                         "leave out --time, --partition and --account: the engines start in that job")
    if held is not None and held.request != ask:
        raise HPCAIError(f"this kernel holds Slurm job {held.job_id} ({held.request.describe()})",
                         "use it (%hpc start without --time), or %hpc stop to release it, then ask again")
    if launcher not in (None, "srun"):
        raise HPCAIError(f"the ranks in a job this kernel asks for start with srun, not {launcher}",
                         "leave out --launcher")


def _remove_stale(folder: Path) -> None:
    """Keepalive files that stood still for a week: their kernels were killed (their jobs ended long ago)."""
    cutoff = time.time() - STALE
    for old in folder.glob("*.alive"):
        try:
            if old.lstat().st_mtime < cutoff:
                old.unlink()
        except OSError:
            pass
