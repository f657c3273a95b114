"""A Slurm job as a process inside it sees it (runs everywhere: the server, a kernel, every rank, inside containers
too): Slurm's variables, read here and nowhere else, and written here where this project stands in for Slurm (a
kernel entering a job of its own as ``salloc`` would, the local launcher's ranks). Standard library only.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, MutableMapping

from . import versions

JOB_ID = "SLURM_JOB_ID"
NODE_NAME = "SLURMD_NODENAME"  # the node a process of the job runs on (unset under salloc on the login host)
PARTITION = "SLURM_JOB_PARTITION"
ACCOUNT = "SLURM_JOB_ACCOUNT"
NODES = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")  # the job's nodes, as a hostlist (n[1-2])
NUM_NODES = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")
TASKS = "SLURM_NTASKS"  # the tasks of the job (in a step: of the step)
RANK = "SLURM_PROCID"  # a step's task: its rank, its rank on its node, its node's index in the step
LOCAL_RANK = "SLURM_LOCALID"
NODE_INDEX = "SLURM_NODEID"
TASKS_PER_NODE = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")  # "2(x2),1": the step's, else the job's
STEP_NODES = "SLURM_STEP_NODELIST"
CPUS_PER_TASK = "SLURM_CPUS_PER_TASK"
CPUS_ON_NODE = "SLURM_CPUS_ON_NODE"
GPUS_ON_NODE = ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE")
CONFIG = "SLURM_CONF"  # where the client commands find the cluster: passed on, the site's
# A job's own variables: none of them belongs in another job's (a grown job's), the site's config (CONFIG) aside.
PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")
# What a step's task reads of its place that the local launcher is not (ranks/local.py clears them).
STEP_PLACES = (RANK, LOCAL_RANK, NODE_INDEX, TASKS, "SLURM_NTASKS_PER_NODE", "SLURM_STEP_NUM_TASKS", *TASKS_PER_NODE)


def job_id(env: Mapping[str, str]) -> str | None:
    """The job this process runs in, or None outside one."""
    return env.get(JOB_ID) or None


def node_name(env: Mapping[str, str]) -> str:
    """The node this process runs on, as the scheduler names it; the host name where it names none."""
    return env.get(NODE_NAME) or socket.gethostname()


def end_time(env: Mapping[str, str]) -> float | None:
    """When the job reaches its time limit, as the scheduler set it at the job's start (epoch seconds), without a
    query; None where this version does not say (versions.py)."""
    return versions.job_end_time(env)


def first(env: Mapping[str, str], names: tuple[str, ...], default: str = "") -> str:
    """The first of ``names`` that is set."""
    return next((env[name] for name in names if env.get(name)), default)


def tasks_per_node(env: Mapping[str, str]) -> list[int]:
    """The tasks on each node of the step (or job), in node order, from Slurm's compressed list (``2(x2),1``)."""
    counts: list[int] = []
    for part in first(env, TASKS_PER_NODE, "1").split(","):
        count, _, times = part.partition("(x")
        counts += [int(count)] * int(times.rstrip(")") or 1)
    return counts


def gpus_on_node(env: Mapping[str, str]) -> int | None:
    """The GPUs the job has on this node, as the scheduler says (``gpu:2`` or ``2``), or None where it does not."""
    for name in GPUS_ON_NODE:
        value = env.get(name, "").split(":")[-1]
        if value.isdigit():
            return int(value)
    return None


def enter(env: MutableMapping[str, str], job: str, nodelist: str, partition: str, tasks_per_node: int,
          nodes: int, account: str = "") -> dict[str, str]:
    """Make ``env`` that of a shell inside job ``job``, as ``salloc``'s is (a kernel entering a job of its own): the
    variables set, which ``leave`` takes back."""
    entered = {JOB_ID: job, "SLURM_JOBID": job, **dict.fromkeys(NODES, nodelist),
               **dict.fromkeys(NUM_NODES, str(nodes)), PARTITION: partition, TASKS: str(nodes * tasks_per_node),
               "SLURM_NTASKS_PER_NODE": str(tasks_per_node), "SLURM_GPUS_PER_NODE": str(tasks_per_node),
               **({ACCOUNT: account} if account else {})}
    env.update(entered)
    return entered


def leave(env: MutableMapping[str, str], entered: Mapping[str, str]) -> None:
    """Take back what ``enter`` set (those still set as it set them)."""
    for name, value in entered.items():
        if env.get(name) == value:
            del env[name]


def narrow(env: MutableMapping[str, str], nodelist: str, nodes: int, tasks: int) -> None:
    """The job's allocation in ``env`` after nodes were given back: its nodes and tasks now."""
    env.update({**dict.fromkeys(NODES, nodelist), **dict.fromkeys(NUM_NODES, str(nodes)), TASKS: str(tasks)})
