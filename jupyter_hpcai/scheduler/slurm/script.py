"""Slurm's part of a batch script: the ``#SBATCH`` header, and the shell lines that know the job (its id, its
nodes' addresses, the step that starts its ranks)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from ...errors import HPCAIError
from . import versions

JOB_ID_IN_SHELL = "$SLURM_JOB_ID"
JOB_ID_IN_ENVIRON = "SLURM_JOB_ID=$SLURM_JOB_ID"
# --export limits what reaches the job; steps started inside it (srun, the engines) must get the whole environment
# of the process that starts them again
WHOLE_ENVIRONMENT = "unset SLURM_EXPORT_ENV"
# how a step says one of its tasks ended ("srun: error: n2: task 3: Exited with exit code 1"), a regular expression
TASK_ENDED = r"srun: error: \S+: tasks? [\d,-]+"
MEMORY_OPTIONS = ("--mem", "--mem-per-cpu", "--mem-per-gpu")  # sbatch takes one of them
DEFAULT_OUTPUT = "slurm-%j.out"  # where a job's output goes when its script does not say
# JobScript's fields as sbatch's options
OPTIONS = {"name": "job-name", "output": "output", "nodes": "nodes", "tasks_per_node": "ntasks-per-node",
           "gpus_per_node": "gpus-per-node", "time": "time", "partition": "partition", "account": "account",
           "qos": "qos", "cpus_per_task": "cpus-per-task", "memory_per_gpu": "mem-per-gpu"}


def job_options(fields: Mapping[str, str | int], extra: Sequence[str]) -> list[str]:
    """sbatch's options for a job's ``fields`` (OPTIONS' keys), then the ``extra`` ones ("--option[=value]"), none of
    them twice."""
    options = [f"--{OPTIONS[key]}={value}" for key, value in fields.items()]
    own = {option.split("=", 1)[0] for option in options}
    if twice := sorted(own & {option.split("=", 1)[0] for option in extra}):
        raise HPCAIError(f"job {fields.get('name', '')}: {', '.join(twice)} in the extra options, which the job sets "
                         "itself", "leave it out of the extra options")
    versions.gpu_options([*options, *extra])
    memory = [option for option in [*options, *extra] if option.split("=", 1)[0] in MEMORY_OPTIONS]
    if len({option.split("=", 1)[0] for option in memory}) > 1:
        raise HPCAIError(f"job {fields.get('name', '')} asks for memory two ways ({', '.join(memory)}), which sbatch "
                         "refuses", "keep one: a profile's mem_per_gpu, or --mem (req_memory, extra_sbatch)")
    return options + list(extra)


def header(options: Sequence[str]) -> list[str]:
    """The script's header lines for ``options``."""
    return [f"#SBATCH {option}" for option in options]


def node_address_in_shell(node: str = '"$SLURMD_NODENAME"') -> str:
    """A shell expression for ``node``'s address as Slurm knows it (NodeAddr), which every node reaches."""
    return f"$(scontrol show node {node} | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)"


def export_node_addresses(variable: str) -> list[str]:
    """Shell lines that export ``variable`` as every node's Slurm address, "node=addr,..." (network.py's format),
    leaving them in the array ``addrs`` too (the first node's is ``${addrs[0]#*=}``)."""
    return ["addrs=()",
            'for node in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do',
            f'  addrs+=("$node={node_address_in_shell(chr(34) + "$node" + chr(34))}")',
            "done",
            f'export {variable}=$(IFS=,; echo "${{addrs[*]}}")']


def rank_launch(nodes: int, ranks_per_node: int, argv: Sequence[str], *, survive: bool = False,
                output: str | None = None) -> str:
    """The line that runs ``argv`` on every rank of a batch job (MPI ranks, PMIx), block order (rank 0 on the first
    node), the step ended when a rank fails; ``survive``: the other ranks go on. ``output``: srun's per-rank output
    pattern."""
    ending = ["--kill-on-bad-exit=0", "--no-kill"] if survive else ["--kill-on-bad-exit=1"]
    return " ".join(["srun", versions.cpus_per_task_in_shell(),
                     shlex.join(["--mpi=pmix", f"--nodes={nodes}", f"--ntasks-per-node={ranks_per_node}",
                                 "--distribution=block", *ending, *([f"--output={output}"] if output else []), *argv])])
