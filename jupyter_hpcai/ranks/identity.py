"""What a rank is: its rank variables (whichever launcher started it) and ``pin``, which gives it one GPU and
its thread counts before anything else runs (boot.py calls it first)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping

from ..scheduler import chosen
from .gpus import entries

environment = chosen().environment

# A re-formed world's place (world.py) comes first: the kernel set it after the launcher's numbers went stale.
# Open MPI's before the scheduler's: under mpirun in a Slurm job, every rank inherits its node's orted's task
# variables (the node's index, and 0), which are no rank's.
WORLD = {"rank": "HPCAI_WORLD_RANK", "size": "HPCAI_WORLD_SIZE", "local_rank": "HPCAI_WORLD_LOCAL_RANK",
         "local_size": "HPCAI_WORLD_LOCAL_SIZE"}
RANK_VARS = (WORLD["rank"], "OMPI_COMM_WORLD_RANK", environment.RANK, "PMI_RANK", "HPCAI_RANK")
LOCAL_RANK_VARS = (WORLD["local_rank"], "OMPI_COMM_WORLD_LOCAL_RANK", environment.LOCAL_RANK, "MPI_LOCALRANKID",
                   "HPCAI_LOCAL_RANK")
SIZE_VARS = (WORLD["size"], "OMPI_COMM_WORLD_SIZE", environment.TASKS, "PMI_SIZE", "HPCAI_SIZE")
LOCAL_SIZE_VARS = (WORLD["local_size"], "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "HPCAI_LOCAL_SIZE")


def rank_ranges(ranks: Iterable[int]) -> str:
    """Ranks as ranges, as Slurm writes a node list: 0-3,5,7-9."""
    spans: list[list[int]] = []
    for rank in sorted(set(ranks)):
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def host_name(env: Mapping[str, str]) -> str:
    """The node's name as every rank and helper reports it: the scheduler's name for it, else the host name."""
    return environment.node_name(env)


def first_int(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for name in names:
        if env.get(name, "").isdigit():
            return int(env[name])
    return default


def local_size(env: Mapping[str, str]) -> int:
    """Ranks on this node: from MPI, or the scheduler's tasks on each node of the step."""
    size = first_int(env, LOCAL_SIZE_VARS, 0)
    if size:
        return size
    counts, node = environment.tasks_per_node(env), first_int(env, (environment.NODE_INDEX,), 0)
    return counts[node] if node < len(counts) else 1


def pin(env: MutableMapping[str, str], cpu_count: int) -> None:
    """One GPU per rank (by local rank, among the GPUs Slurm gave this node: indices, GPU UUIDs or MIG
    identifiers alike, as gpus.py reads them) and sane thread counts."""
    local_rank = first_int(env, LOCAL_RANK_VARS, 0)
    ranks_here = max(1, local_size(env))
    gpus = entries(env.get("CUDA_VISIBLE_DEVICES", ""))
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = gpus[local_rank % len(gpus)]
        env["HPCAI_NODE_GPUS"] = ",".join(gpus)
    cpus = first_int(env, (environment.CPUS_PER_TASK,), 0) or max(1, cpu_count // ranks_here)
    for var in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        env.setdefault(var, str(cpus))
    env.setdefault("TF_NUM_INTEROP_THREADS", "1")
