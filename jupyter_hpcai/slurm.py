"""Slurm as data: the scheduler's commands run and their output parsed."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from .proc import run

# Long node states that mean the node answers and can run (or is running) jobs.
_USABLE_STATES = {"idle", "mixed", "allocated", "completing"}


@dataclass(frozen=True)
class Node:
    """One node as sinfo reports it."""

    name: str
    state: str  # long form, e.g. "idle", "mixed", "down*"
    partitions: tuple[str, ...]
    cpus: int
    gpus: int

    @property
    def usable(self) -> bool:
        """True when the node responds and accepts work."""
        return self.state in _USABLE_STATES


def gres_gpus(gres: str) -> int:
    """The GPU count in a gres string such as ``gpu:4``, ``gpu:a100:2(S:0-1)`` or ``(null)``."""
    total = 0
    for item in gres.split(","):
        m = re.match(r"gpu(?::[^:(]+)?:(\d+)", item.strip())
        if m:
            total += int(m.group(1))
    return total


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a Slurm hostlist such as ``n[1-3,7],gpu[01-02]`` into node names."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", hostlist):
        m = re.fullmatch(r"([^\[]*)\[([^\]]+)\](.*)", part)
        if not m:
            names.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for rng in ranges.split(","):
            lo, _, hi = rng.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                names.append(f"{prefix}{i:0{width}d}{suffix}")
    return names


def nodes(env: Mapping[str, str] | None = None) -> list[Node]:
    """Every node of the cluster, one entry per node with all its partitions."""
    out = run(["sinfo", "--noheader", "--Node", "--format=%N|%T|%P|%c|%G"], env=env, timeout=30).stdout
    merged: dict[str, Node] = {}
    for line in out.splitlines():
        name, state, partition, cpus, gres = line.strip().split("|")
        partition = partition.rstrip("*")
        if name in merged:
            old = merged[name]
            merged[name] = Node(name, old.state, (*old.partitions, partition), old.cpus, old.gpus)
        else:
            merged[name] = Node(name, state.lower(), (partition,), int(cpus), gres_gpus(gres))
    return list(merged.values())


TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)


def sbatch(args: list[str], env: Mapping[str, str] | None = None, timeout: float = 30) -> int:
    """Submit a job (``args`` are sbatch's options and the script) and return its id."""
    out = run(["sbatch", "--parsable", *args], env=env, timeout=timeout).stdout.strip()
    return int(out.split(";")[0])


def parse_key_values(line: str) -> dict[str, str]:
    """Parse scontrol's one-line ``Key=Value Key=Value`` output."""
    return dict(m.groups() for m in re.finditer(r"(\w+(?::\w+)?)=(\S*)", line))


def job_info(job_id: int | str, env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """scontrol's record of a job, or None once Slurm has forgotten it."""
    done = run(["scontrol", "--oneliner", "show", "job", str(job_id)], env=env, check=False, timeout=30)
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:
            return None
        run(["scontrol", "--oneliner", "show", "job", str(job_id)], env=env, timeout=30)  # raises with the message
    return parse_key_values(done.stdout)


def node_address(name: str, env: Mapping[str, str] | None = None) -> str:
    """The address Slurm reaches a node at (NodeAddr), which its other nodes can reach too."""
    out = run(["scontrol", "--oneliner", "show", "node", name], env=env, timeout=30).stdout
    return parse_key_values(out).get("NodeAddr", name)
