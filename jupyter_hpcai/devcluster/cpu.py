"""The dev cluster's CPU: the nodes' processes in a cgroup of their own, as if they ran on other machines.

On a site the hub, its proxy and slurmctld have a host of their own: notebook servers on the compute nodes never
take its CPU. Here the nodes are this machine, and Linux shares a CPU between sessions (autogroup), every job
being one: 40 notebook servers starting at once left the hub a fortieth of it (measured 2026-12-02 on 2 cores:
its event loop waited 55 s of a 72 s spawn storm for a CPU, while running 4 s; its API's p99 2 s). Every slurmd,
and so every job step, starts in one cgroup of the cpu controller, ``hpcai-devcluster-<port>``: all nodes
together weigh as one busy session of the host, whatever they run, and take every CPU the host leaves idle.
Where no cgroup can be made (a read-only cgroupfs, no cpu controller), the nodes share the CPU as before and
:meth:`NodeCPU.up` says why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..proc import kill_all

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class NodeCPU:
    """The cpu cgroup named ``name`` that every node's processes run in."""

    name: str
    root: Path = CGROUP_ROOT

    @property
    def path(self) -> Path:
        """cgroup v1's cpu hierarchy where it is mounted, else the v2 unified hierarchy."""
        v1 = self.root / "cpu"
        return (v1 if (v1 / "cgroup.procs").exists() else self.root) / self.name

    def up(self) -> str:
        """Make the cgroup (kept when it exists); '' when done, else why not."""
        if os.geteuid() != 0:
            return "making a cgroup needs root"
        unified = self.path.parent == self.root
        if unified and "cpu" not in _words(self.root / "cgroup.controllers"):
            return f"no cgroup cpu controller under {self.root}"
        try:
            if unified and "cpu" not in _words(self.root / "cgroup.subtree_control"):
                (self.root / "cgroup.subtree_control").write_text("+cpu")  # let children weigh CPU
            self.path.mkdir(exist_ok=True)
        except OSError as err:
            return f"could not make the cgroup {self.path}: {err.strerror}"
        return ""

    def exec_prefix(self) -> list[str]:
        """The argv prefix that runs a program inside the cgroup: the shell moves itself in, then execs it."""
        return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs")]

    def pids(self) -> list[int]:
        """The processes in the cgroup now."""
        return [int(p) for p in _words(self.path / "cgroup.procs")]

    def down(self) -> None:
        """Remove the cgroup; processes still in it (what the nodes left) are killed first. Harmless when absent."""
        if not self.path.is_dir():
            return
        kill_all(self.pids, timeout=10, what=str(self.path))
        self.path.rmdir()


def _words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []
