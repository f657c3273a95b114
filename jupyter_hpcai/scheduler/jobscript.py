"""Every batch script the project writes (runs where a job is submitted: the hub, a kernel, the CLI): the header from
typed fields, every value checked by one rule, then the body. The notebook server's job (spawner/script.py), an
exported notebook (export.py), a remote env build (envs/remote.py), a benchmark (bench/submit.py) and a kernel's own
allocation (engines/own_job.py) all write theirs with ``JobScript``; the chosen scheduler spells the header.
Decided here once: one rank per GPU (``ranks_per_node``), and a submitted job's following and cancelling
(``Submitted``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import HPCAIError
from ..proc import run
from . import chosen

SHEBANG = "#!/bin/bash"


def ranks_per_node(gpus_per_node: int) -> int:
    """One rank per GPU; one rank on a node without GPUs."""
    return max(1, gpus_per_node)


def rank_launch(nodes: int, gpus_per_node: int, argv: Sequence[str], *, survive: bool = False,
                output: str | None = None) -> str:
    """The line that runs ``argv`` on every rank of a batch job: one rank per GPU, block order (rank 0 on the first
    node), the step ended when a rank fails; ``survive``: the other ranks go on (a grown job's, membership.py).
    ``output``: the per-rank output pattern."""
    return chosen().rank_launch(nodes, ranks_per_node(gpus_per_node), argv, survive=survive, output=output)


@dataclass(frozen=True)
class Submitted:
    """A submitted batch job: its id and the file its output goes to."""

    job_id: int
    output: Path

    def follow(self, on_line: Callable[[str], None]) -> int:
        """Every line of its output to ``on_line`` until the job ends; its exit status."""
        return chosen().follow_output(self.job_id, self.output, on_line)

    def cancel(self) -> None:
        run(chosen().cancel_argv(self.job_id), timeout=30)


def header_value(value: str | int) -> str:
    """A value of a header line, which no shell parses: one word of printable characters, or refused."""
    text = str(value)
    if not text or any(c.isspace() or not c.isprintable() for c in text):
        raise HPCAIError(f"refusing to write {text!r} into a batch script's header (empty, a space or a control "
                         "character)", "use a value without spaces (a path: move it to one without)")
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
    qos: str | None = None
    cpus_per_task: int | None = None  # CPUs of each rank (a task); the ranks' own steps ask for as many
    memory_per_gpu: str | None = None  # e.g. "64G": the memory of each GPU's rank
    output: str | None = None  # a path, "%j" standing for the job's id (the scheduler's default where None)
    extra: tuple[str, ...] = ()  # more options, in the scheduler's words (the site's, a profile's)
    body: str = ""

    def options(self) -> list[str]:
        """The scheduler's options for this job, every value checked."""
        fields = {"name": self.name, "output": self.output, "nodes": self.nodes,
                  "tasks_per_node": self.tasks_per_node, "gpus_per_node": self.gpus_per_node or None,
                  "time": self.time, "partition": self.partition, "account": self.account, "qos": self.qos,
                  "cpus_per_task": self.cpus_per_task, "memory_per_gpu": self.memory_per_gpu}
        given = {key: header_value(value) for key, value in fields.items() if value not in (None, "")}
        return chosen().job_options(given, [header_value(option) for option in self.extra])

    def render(self) -> str:
        """The whole script, printable before anything is submitted."""
        return "\n".join([SHEBANG, *chosen().header(self.options())]) + "\n" + self.body

    def submit(self, env: Mapping[str, str] | None = None, on_command_line: bool = False) -> Submitted:
        """Submit it. ``on_command_line``: the options also on the submission's command line, where a site's
        variables (Slurm's SBATCH_*) cannot override them (they override header lines)."""
        job_id = chosen().submit(self.options() if on_command_line else [], env=env, script=self.render())
        return Submitted(job_id, Path((self.output or chosen().DEFAULT_OUTPUT).replace("%j", str(job_id))))
