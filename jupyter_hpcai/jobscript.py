"""Every Slurm batch script the project writes (runs where a job is submitted: the hub, a kernel, the CLI): the
``#SBATCH`` header from typed fields, every value checked by one rule, then the body. The notebook server's job
(spawner/script.py), an exported notebook (export.py), a remote env build (envs/remote.py), a benchmark
(bench/submit.py) and a kernel's own allocation (engines/own_job.py) all write theirs with ``JobScript``; one
rank per GPU is decided here (``ranks_per_node``), and so is the shell expression for a node's Slurm address.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from . import slurm
from .errors import HPCAIError

SHEBANG = "#!/bin/bash"


def node_address(node: str = '"$SLURMD_NODENAME"') -> str:
    """A shell expression for ``node``'s address as Slurm knows it (NodeAddr), which every node reaches."""
    return f"$(scontrol show node {node} | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)"


def ranks_per_node(gpus_per_node: int) -> int:
    """One rank per GPU; one rank on a node without GPUs."""
    return max(1, gpus_per_node)


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

    def submit(self, env: Mapping[str, str] | None = None, on_command_line: bool = False) -> int:
        """sbatch it; its job id. ``on_command_line``: the options also on sbatch's command line, where a site's
        SBATCH_* variables cannot override them (they override #SBATCH lines)."""
        return slurm.sbatch(self.options() if on_command_line else [], env=env, script=self.render())
