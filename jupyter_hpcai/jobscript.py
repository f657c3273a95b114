"""Every Slurm batch script the project writes (runs where a job is submitted: the hub, a kernel, the CLI): the
``#SBATCH`` header from typed fields, every value checked by one rule, then the body. The notebook server's job
(spawner/script.py), an exported notebook (export.py), a remote env build (envs/remote.py), a benchmark
(bench/submit.py) and a kernel's own allocation (engines/own_job.py) all write theirs with ``JobScript``. Decided
here once: one rank per GPU (``ranks_per_node``), a node's Slurm address in the shell (``node_address``, and every
node's, ``export_node_addresses``), the line that starts a batch job's ranks (``rank_launch``), and a submitted
job's following and cancelling (``Submitted``).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import slurm
from .errors import HPCAIError
from .proc import run

SHEBANG = "#!/bin/bash"
SRUN_RANKS = ("srun", "--mpi=pmix")  # how ranks start in a job: one srun step, PMIx for MPI


def node_address(node: str = '"$SLURMD_NODENAME"') -> str:
    """A shell expression for ``node``'s address as Slurm knows it (NodeAddr), which every node reaches."""
    return f"$(scontrol show node {node} | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)"


def ranks_per_node(gpus_per_node: int) -> int:
    """One rank per GPU; one rank on a node without GPUs."""
    return max(1, gpus_per_node)


def export_node_addresses(variable: str) -> list[str]:
    """Shell lines that export ``variable`` as every node's Slurm address, "node=addr,..." (network.py's format),
    leaving them in the array ``addrs`` too (the first node's is ``${addrs[0]#*=}``)."""
    return ["addrs=()",
            'for node in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do',
            f'  addrs+=("$node={node_address(chr(34) + "$node" + chr(34))}")',
            "done",
            f'export {variable}=$(IFS=,; echo "${{addrs[*]}}")']


def rank_launch(nodes: int, gpus_per_node: int, argv: Sequence[str], *, survive: bool = False,
                output: str | None = None) -> str:
    """The line that runs ``argv`` on every rank of a batch job: one rank per GPU, block order (rank 0 on the first
    node), the step ended when a rank fails; ``survive``: the other ranks go on (a grown job's, membership.py).
    ``output``: srun's per-rank output pattern."""
    ending = ["--kill-on-bad-exit=0", "--no-kill"] if survive else ["--kill-on-bad-exit=1"]
    return shlex.join([*SRUN_RANKS, f"--nodes={nodes}", f"--ntasks-per-node={ranks_per_node(gpus_per_node)}",
                       "--distribution=block", *ending, *([f"--output={output}"] if output else []), *argv])


@dataclass(frozen=True)
class Submitted:
    """A submitted batch job: its id and the file its output goes to."""

    job_id: int
    output: Path

    def follow(self, on_line: Callable[[str], None]) -> int:
        """Every line of its output to ``on_line`` until the job ends; its exit status."""
        return slurm.follow_output(self.job_id, self.output, on_line)

    def cancel(self) -> None:
        run(["scancel", str(self.job_id)], timeout=30)


def sbatch_value(value: str | int) -> str:
    """A value of an ``#SBATCH`` line, which no shell parses: one word of printable characters, or refused."""
    text = str(value)
    if not text or any(c.isspace() or not c.isprintable() for c in text):
        raise HPCAIError(f"refusing to write {text!r} into an #SBATCH line (empty, a space or a control character)",
                         "use a value without spaces (a path: move it to one without)")
    return text


@dataclass(frozen=True)
class JobScript:
    """A batch script: its options (in the order given, each at most once), then its body (shell lines)."""

    name: str
    nodes: int = 1
    tasks_per_node: int | None = None
    gpus_per_node: int = 0
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    output: str | None = None
    extra: tuple[str, ...] = ()  # more options, each "--option" or "--option=value" (the site's, a profile's)
    body: str = ""

    def options(self) -> list[str]:
        """sbatch's options, each "--option=value", every value checked."""
        fields: list[tuple[str, str | int | None]] = [
            ("job-name", self.name), ("output", self.output), ("nodes", self.nodes),
            ("ntasks-per-node", self.tasks_per_node), ("gpus-per-node", self.gpus_per_node or None),
            ("time", self.time), ("partition", self.partition), ("account", self.account)]
        given = [(key, value) for key, value in fields if value not in (None, "")]  # "" is not given either
        options = [f"--{key}={sbatch_value(value)}" for key, value in given]
        own = {option.split("=", 1)[0] for option in options}
        if twice := sorted(own & {option.split("=", 1)[0] for option in self.extra}):
            raise HPCAIError(f"job {self.name}: {', '.join(twice)} in the extra options, which the job sets itself",
                             "leave it out of the extra options")
        return options + [sbatch_value(option) for option in self.extra]

    def render(self) -> str:
        """The whole script, printable before anything is submitted."""
        return "\n".join([SHEBANG, *(f"#SBATCH {option}" for option in self.options())]) + "\n" + self.body

    def submit(self, env: Mapping[str, str] | None = None, on_command_line: bool = False) -> Submitted:
        """sbatch it. ``on_command_line``: the options also on sbatch's command line, where a site's SBATCH_*
        variables cannot override them (they override #SBATCH lines)."""
        job_id = slurm.sbatch(self.options() if on_command_line else [], env=env, script=self.render())
        return Submitted(job_id, Path((self.output or "slurm-%j.out").replace("%j", str(job_id))))
