"""How engines are launched: the layout (ranks, nodes, ranks per node) and one launcher per way.

- ``srun``: ``srun --mpi=pmix`` inside the job's allocation (the default inside Slurm);
- ``mpirun``: OpenMPI's mpirun, which finds the allocation itself (the fallback);
- ``local``: mpirun on this machine only, outside Slurm.

Every way starts the same program, ``python -m jupyter_hpcai.engines.engine``, which pins the
rank to its GPU before the ipyparallel engine starts. In a container env's kernel (``ContainerLaunch``,
set by the provisioner) each rank is ``udocker run ... CONTAINER python -m jupyter_hpcai.engines.engine``
in the same container, started by srun on the host of every node.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from ipyparallel.cluster.launcher import MPIEngineSetLauncher
from traitlets import List

from .. import mpi, network
from ..allocation import Allocation
from ..container_launch import ContainerLaunch
from ..errors import HPCAIError

LAUNCHERS = ("srun", "mpirun", "local")
ENGINE_CMD = [sys.executable, "-m", "jupyter_hpcai.engines.engine"]


@dataclass(frozen=True)
class Layout:
    """Where the ranks go."""

    n: int
    nodes: int
    per_node: int
    launcher: str


def plan(allocation: Allocation | None, *, n: int | None = None, nodes: int | None = None,
         gpus_per_node: int | None = None, launcher: str | None = None) -> Layout:
    """The layout for a start request, checked against the allocation (one rank per GPU by default)."""
    launcher = launcher or ("srun" if allocation else "local")
    if launcher not in LAUNCHERS:
        raise HPCAIError(f"unknown launcher '{launcher}'", f"use one of: {', '.join(LAUNCHERS)}")
    for label, value in (("-n", n), ("--nodes", nodes), ("--gpus-per-node", gpus_per_node)):
        if value is not None and value < 1:
            raise HPCAIError(f"{label} must be at least 1, not {value}")
    if allocation is None:
        if launcher == "srun":
            raise HPCAIError("srun needs a Slurm allocation, and this kernel runs outside any job",
                             "start the notebook through the hub's Slurm spawner, or use --launcher local")
        if nodes not in (None, 1):
            raise HPCAIError("outside a Slurm job the engines run on this machine only", "leave out --nodes")
        per_node = n or gpus_per_node or 2
        return Layout(n or per_node, 1, per_node, launcher)
    if launcher == "local":
        raise HPCAIError("--launcher local runs outside Slurm; this kernel is inside job " + allocation.job_id,
                         "use --launcher srun (or mpirun)")
    job_nodes = len(allocation.nodes)
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
    return Layout(n, nodes, per_node, launcher)


class _EngineSet(MPIEngineSetLauncher):  # type: ignore[misc]
    """ipyparallel's MPI engine set, without its ``--mpi`` flag: ranks come from the launcher's variables
    (SLURM_PROCID, OMPI_COMM_WORLD_RANK), so an env needs no mpi4py, and the framework (Horovod, or
    torch.distributed) initialises the communication itself."""

    @property
    def program(self) -> list[str]:
        return list(self.engine_cmd)


class SrunEngineSetLauncher(_EngineSet):
    """Engines as one ``srun --mpi=pmix`` step inside the current allocation."""

    mpi_cmd = List(["srun", "--mpi=pmix"], config=True)


class MpirunEngineSetLauncher(_EngineSet):
    """Engines through OpenMPI's mpirun (inside an allocation it finds the nodes itself)."""

    mpi_cmd = List(["mpirun", "--bind-to", "none"], config=True)


def engine_cmd(layout: Layout, environ: Mapping[str, str] | None = None) -> list[str]:
    """What each rank runs: the engine in this python, or in this kernel's container (checked first)."""
    container = ContainerLaunch.from_env(os.environ if environ is None else environ)
    if container is None:
        return ENGINE_CMD
    if layout.launcher != "srun":
        raise HPCAIError(f"container ranks (env '{container.name}') start with srun, not {layout.launcher}",
                         "leave out --launcher, inside a Slurm job")
    if why := mpi.mismatch(container.mpi, container.host_mpi):
        raise HPCAIError(f"the ranks' MPI would not match: {why}",
                         "use an image with the host's MPI version (or load the module of the image's MPI on the host)")
    return container.rank_argv("jupyter_hpcai.engines.engine")


def launcher_config(layout: Layout, addresses: Mapping[str, str]) -> tuple[type, dict[str, object]]:
    """The ipyparallel engine-set launcher class and its trait values for ``layout``; ``addresses`` (node ->
    Slurm address) reach every rank, which picks its own (network.py)."""
    program = engine_cmd(layout)
    environment = {network.NODE_ADDRS: network.encode_addresses(addresses)} if addresses else {}
    if layout.launcher == "srun":
        args = [f"--nodes={layout.nodes}", f"--ntasks-per-node={layout.per_node}", "--distribution=block",
                "--kill-on-bad-exit=1", "--overlap", "--label"]  # --label: which rank wrote each line (report.py)
        return SrunEngineSetLauncher, {"mpi_args": args, "engine_cmd": program, "environment": environment}
    args = ["--map-by", f"ppr:{layout.per_node}:node", "--oversubscribe", "--tag-output"]
    if os.geteuid() == 0:
        args.append("--allow-run-as-root")
    if layout.launcher == "local":
        args += ["--host", f"localhost:{layout.n}"]
    else:  # mpirun starts its ranks with the environment it was given, once told to pass a variable on
        args += ["-x", network.NODE_ADDRS] if addresses else []
    return MpirunEngineSetLauncher, {"mpi_args": args, "engine_cmd": program, "environment": environment}


__all__ = ["LAUNCHERS", "Layout", "MpirunEngineSetLauncher", "SrunEngineSetLauncher", "launcher_config", "plan"]
