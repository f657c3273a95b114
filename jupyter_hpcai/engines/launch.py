"""How engines are launched: the layout (ranks, nodes, ranks per node) and one launcher class per way.

- ``srun``: ``srun --mpi=pmix`` inside the job's allocation (the default inside Slurm);
- ``mpirun``: OpenMPI's mpirun, which finds the allocation itself (the fallback);
- ``local``: processes of this machine, outside Slurm, without MPI (ranks/local.py starts them; the default there);
- ``local-mpi``: OpenMPI's mpirun on this machine only, outside Slurm (for Horovod over MPI).

A launcher is a class in ``LAUNCHERS``: whether it can run here (``available``) and the command that starts
every rank (``command``), printable before anything starts. Every way starts the same program,
``python -m jupyter_hpcai.ranks.boot``, which pins the rank to its GPU before the ipyparallel engine starts.
In a container env's kernel (``ContainerLaunch``, set by the provisioner) each rank is
``udocker run ... CONTAINER python -m jupyter_hpcai.ranks.boot`` in the same container, started by srun on
the host of every node.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ipyparallel.cluster.launcher import MPIEngineSetLauncher
from traitlets import List, Unicode

from .. import mpi, network
from ..container_launch import ContainerLaunch
from ..contract import RANK_LOG
from ..errors import HPCAIError
from ..ranks.frameworks import CONTROLLER_VAR, LAUNCH_VARS, horovod_controller
from ..scheduler import chosen
from ..scheduler.allocation import Allocation

scheduler = chosen()

BOOT_MODULE = "jupyter_hpcai.ranks.boot"
LOCAL_MODULE = "jupyter_hpcai.ranks.local"


@dataclass(frozen=True)
class Layout:
    """Where the ranks go: ``per_node`` on each of ``nodes``, the last taking the rest (srun's block placement)."""

    n: int
    nodes: int
    per_node: int
    launcher: str

    @property
    def counts(self) -> list[int]:
        """The ranks on each node that has any, in node order."""
        return [min(self.per_node, self.n - node * self.per_node) for node in range(self.nodes)
                if self.n > node * self.per_node]


class Launcher:
    """One way to start a set of ranks. Subclasses differ by their class variables and ``args``."""

    name: ClassVar[str]
    in_job: ClassVar[bool]  # runs inside a Slurm job (True) or outside any (False)
    mpi_cmd: ClassVar[tuple[str, ...]]
    containers: ClassVar[bool] = False  # can start container ranks (udocker on every node's host)
    unavailable_hint: ClassVar[str]

    @classmethod
    def available(cls, allocation: Allocation | None) -> bool:
        return (allocation is not None) == cls.in_job

    @classmethod
    def args(cls, layout: Layout, addresses: Mapping[str, str]) -> list[str]:
        raise NotImplementedError

    @classmethod
    def command(cls, layout: Layout, addresses: Mapping[str, str] | None = None,
                environ: Mapping[str, str] | None = None, rank_logs: Path | None = None) -> list[str]:
        """The whole command that starts every rank (ipyparallel appends the engine's own arguments); with
        ``rank_logs``, a launcher that can writes each rank's output there too (the scheduler's step)."""
        program = cls.program(environ)  # first: a container env's refusal says the most
        return [*cls.mpi_cmd, "-n", str(layout.n), *cls.args(layout, addresses or {}), *program]

    @classmethod
    def on_nodes(cls, hosts: list[str]) -> list[str]:
        """What runs one process on each of ``hosts`` (the ranks' nodes), before its command: inside a job, a
        srun step beside the ranks'."""
        return scheduler.step(nodes=len(hosts), tasks=len(hosts), per_node=1, nodelist=hosts)

    @classmethod
    def program(cls, environ: Mapping[str, str] | None = None) -> list[str]:
        """What each rank runs: the boot module in this python, or in this kernel's container (checked first)."""
        container = ContainerLaunch.from_env(os.environ if environ is None else environ)
        if container is None:
            return [sys.executable, "-m", BOOT_MODULE]
        if not cls.containers:
            raise HPCAIError(f"container ranks (env '{container.name}') start with srun, not {cls.name}",
                             "leave out --launcher, inside a Slurm job")
        if why := mpi.mismatch(container.mpi, container.host_mpi):
            raise HPCAIError(f"the ranks' MPI would not match: {why}",
                             "use an image with the host's MPI version (or load the module of the image's MPI on the host)")
        return container.rank_argv(BOOT_MODULE)


class Srun(Launcher):
    """One step of the scheduler's inside the current allocation, its tasks MPI ranks (Slurm: ``srun --mpi=pmix``)."""

    name, in_job, containers = "srun", True, True
    unavailable_hint = "start the notebook through the hub's Slurm spawner, or use --launcher local"

    @classmethod
    def command(cls, layout: Layout, addresses: Mapping[str, str] | None = None,
                environ: Mapping[str, str] | None = None, rank_logs: Path | None = None) -> list[str]:
        # label: which rank wrote each line (report.py); beside the kernel's own step, which keeps its CPUs.
        # A rank's death (or its node's) leaves the others running (survive): the kernel stops the world, or goes
        # on with the survivors (an --elastic cell); startup.launch fails a start on the first task the step
        # says ended. Each rank's output also goes to a file on its node (rank_logs): when a step ends on a rank's
        # failure, srun can drop the last lines it was forwarding from that rank (here, 1 start in 20 lost them
        # all); slurmstepd writing the file keeps them.
        program = cls.program(environ)  # first: a container env's refusal says the most
        output = f"{rank_logs}/{RANK_LOG}" if rank_logs else None
        return [*scheduler.step(nodes=layout.nodes, tasks=layout.n, per_node=layout.per_node, mpi=True, survive=True,
                                label=True, output=output), *program]


class _OpenMPI(Launcher):
    mpi_cmd = ("mpirun", "--bind-to", "none")

    @classmethod
    def args(cls, layout: Layout, addresses: Mapping[str, str]) -> list[str]:
        # block placement, as srun's: ranks 0..k-1 on the first node (mpirun ranks round-robin by node otherwise)
        args = ["--map-by", f"ppr:{layout.per_node}:node", "--rank-by", "slot", "--oversubscribe", "--tag-output"]
        if os.geteuid() == 0:
            args.append("--allow-run-as-root")
        # mpirun starts its ranks with the environment it was given, once told to pass a variable on
        return args + [flag for var in (network.NODE_ADDRS, *RANK_SET_VARS) for flag in ("-x", var)]


class Mpirun(_OpenMPI):
    """OpenMPI's mpirun inside the job (it finds the allocation's nodes itself)."""

    name, in_job = "mpirun", True
    unavailable_hint = "mpirun here starts ranks on a job's nodes; outside Slurm use --launcher local"


class _ThisMachine(Launcher):
    """A launcher of this machine's ranks only, outside Slurm."""

    in_job = False
    unavailable_hint = "inside a Slurm job use --launcher srun (or mpirun)"

    @classmethod
    def on_nodes(cls, hosts: list[str]) -> list[str]:
        return []  # this machine


class Local(_ThisMachine):
    """Processes of this machine, without MPI: a workstation, or a GPU machine without Slurm or MPI (Horovod over
    Gloo, torch.distributed)."""

    name = "local"
    mpi_cmd = (sys.executable, "-m", LOCAL_MODULE)

    @classmethod
    def args(cls, layout: Layout, addresses: Mapping[str, str]) -> list[str]:
        if horovod_controller() == "mpi":
            raise HPCAIError(f"{CONTROLLER_VAR}=mpi: Horovod over MPI needs its ranks started by MPI",
                             "use --launcher local-mpi (OpenMPI's mpirun), or unset the variable for Gloo")
        return []


class LocalMpi(_OpenMPI, _ThisMachine):
    """OpenMPI's mpirun on this machine only."""

    name = "local-mpi"

    @classmethod
    def args(cls, layout: Layout, addresses: Mapping[str, str]) -> list[str]:
        return [*super().args(layout, addresses), "--host", f"localhost:{layout.n}"]


LAUNCHERS: dict[str, type[Launcher]] = {cls.name: cls for cls in (Srun, Mpirun, Local, LocalMpi)}
# set per engine set by startup.launch (ranks/boot.py and ranks/telemetry.py read them)
RANK_SET_VARS = ("HPCAI_WARM", "HPCAI_CONNECTION_FILE", "HPCAI_CONTROLLER_TIMEOUT", "HPCAI_RANK_FOLDER",
                 "HPCAI_TELEMETRY_INTERVAL", *LAUNCH_VARS)


def usable(allocation: Allocation | None) -> list[str]:
    """The launchers that can run here, the default first."""
    return [name for name, cls in LAUNCHERS.items() if cls.available(allocation)]


def plan(allocation: Allocation | None, *, n: int | None = None, nodes: int | None = None,
         gpus_per_node: int | None = None, launcher: str | None = None) -> Layout:
    """The layout for a start request, checked against the allocation (one rank per GPU by default)."""
    launcher = launcher or usable(allocation)[0]
    if launcher not in LAUNCHERS:
        raise HPCAIError(f"unknown launcher '{launcher}'", f"use one of: {', '.join(LAUNCHERS)}")
    if not LAUNCHERS[launcher].available(allocation):
        where = f"inside job {allocation.job_id}" if allocation else "outside any Slurm job"
        raise HPCAIError(f"--launcher {launcher} cannot start ranks here ({where})", LAUNCHERS[launcher].unavailable_hint)
    for label, value in (("-n", n), ("--nodes", nodes), ("--gpus-per-node", gpus_per_node)):
        if value is not None and value < 1:
            raise HPCAIError(f"{label} must be at least 1, not {value}")
    if allocation is None:
        if nodes not in (None, 1):
            raise HPCAIError("outside a Slurm job the engines run on this machine only", "leave out --nodes")
        per_node = n or gpus_per_node or 2
        return Layout(n or per_node, 1, per_node, launcher)
    job_nodes, asked_nodes = len(allocation.nodes), nodes
    nodes = nodes or (job_nodes if n is None else min(job_nodes, n))
    if nodes > job_nodes:
        raise HPCAIError(f"--nodes {nodes} is more than the {job_nodes} node(s) of job {allocation.job_id}",
                         f"ask for at most {job_nodes}, or start a bigger job from the hub")
    slots = allocation.gpus_per_node or max(1, allocation.tasks // job_nodes)
    per_node = gpus_per_node or (slots if n is None else -(-n // nodes))
    if per_node > slots:
        what = "GPUs" if allocation.gpus_per_node else "tasks"
        raise HPCAIError(f"{per_node} ranks per node, but job {allocation.job_id} has {slots} {what} per node",
                         f"use at most {slots} per node (one rank per GPU)")
    n = n or nodes * per_node
    if n > nodes * per_node:
        raise HPCAIError(f"-n {n} does not fit on {nodes} node(s) x {per_node} per node",
                         f"use -n {nodes * per_node} or fewer, or more nodes")
    filled = -(-n // per_node)  # srun's block placement: full nodes first, the rest on the last
    if filled < nodes and asked_nodes:
        raise HPCAIError(f"-n {n} at {per_node} per node fills {filled} node(s), not {nodes}",
                         f"use --nodes {filled}, or -n {nodes * per_node} for {nodes} full nodes")
    return Layout(n, filled, per_node, launcher)


class RankSetLauncher(MPIEngineSetLauncher):  # type: ignore[misc]
    """ipyparallel's engine set, started by one of our launchers' commands. Without ipyparallel's ``--mpi``
    flag: ranks come from the launcher's variables (SLURM_PROCID, OMPI_COMM_WORLD_RANK), so an env needs no
    mpi4py, and the framework (Horovod, or torch.distributed) initialises the communication itself."""

    launcher = Unicode("", config=True, help="our launcher's name (LAUNCHERS)").tag(to_dict=True)
    command = List([], config=True, help="Launcher.command(): everything before the engine's own arguments")

    def find_args(self) -> list[str]:
        return [*self.command, *self.program_args]


__all__ = ["LAUNCHERS", "Launcher", "Layout", "RankSetLauncher", "plan", "usable"]
