"""The kernel's handle grows and shrinks its world (in the kernel): ``Engines``' part, mixed in, that ``%hpc grow``,
``%hpc shrink`` and the panel's buttons call, and each cell and look at the ranks (a grown job's ranks taken in).
Each change waits for the cell that runs and tells the panel; what it does to the world is membership.py's.
"""

from __future__ import annotations

from dataclasses import replace

from ..proc import wait_until
from . import membership
from .output import Write, to_stdout


class Elastic:
    """A mixin of Engines: its world grown by a second Slurm job, the grown job's ranks taken in once all of them
    registered, and shrunk. It changes Engines' allocation and layout, holds its cell lock (``_running_cell``) and
    tells the panel through its state."""

    def grow(self, nodes: int, *, wait: bool = False, timeout: float = 600, write: Write | None = None) -> str:
        """Ask Slurm for ``nodes`` more nodes (a second job: the notebook job's partition, account, GPUs per node and
        env, ending with it) whose ranks join this world; the next cell runs on the larger world. Says when Slurm
        expects to start it first; ``wait``: return once its ranks are in. The job's id."""
        write = write or to_stdout
        with self._running_cell:
            world = self.running_set()
            job = membership.grow(world, self.allocation, nodes, write)
        if wait:
            wait_until(lambda: self.take_joined() or any(r.job == job for r in world.ranks), timeout=timeout,
                       what=f"the ranks of Slurm job {job} to join",
                       hint=f"it may wait in the queue (squeue -j {job}); %hpc shrink --nodes {nodes} cancels it")
            write(f"{len(world.ranks)} ranks now, {world.grown[job].ranks} of them in job {job}\n")
        self._set_state("running")
        return job

    def take_joined(self) -> bool:
        """A grown job's ranks join the world once all of them registered (the world re-forms); never while a
        cell runs (the next cell, or the next look, takes them)."""
        if self.set is None or self.background.busy or not self._running_cell.acquire(blocking=False):
            return False
        try:
            joined = membership.take_joined(self.set)
        finally:
            self._running_cell.release()
        if joined:
            self._set_state("running")
        return joined

    def shrink(self, *, nodes: int | None = None, ranks: list[int] | None = None, node: str | None = None) -> str:
        """Stop ranks (``ranks``, those on ``node``, or the last ``nodes`` nodes: grown jobs' first, jobs still
        waiting before those) and give their nodes back to Slurm; the world re-forms on the rest. What was done."""
        with self._running_cell:  # after the cell that runs (the walltime guard's, say)
            world = self.running_set()
            membership.take_joined(world)
            done, self.allocation = membership.shrink(world, self.allocation, nodes=nodes, ranks=ranks, node=node)
        if self.allocation is not None and self.layout is not None:  # what %hpc restart starts from now on
            left = min(self.layout.nodes, len(self.allocation.nodes))
            self.layout = replace(self.layout, nodes=left, n=min(self.layout.n, left * self.layout.per_node))
        self._set_state("running")
        return done
