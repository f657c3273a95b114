"""Who is in a running set's world (in the kernel): grow it by a second Slurm job whose ranks join the same
controller, shrink it (its ranks stopped, their nodes given back to Slurm), and drop ranks that died. After any
change the set re-forms its world (``RunningSet.reform``: ranks numbered again densely, each told its place) and
the next cell initialises the framework again on the new world (cells.py).

A grown job asks for the notebook job's partition, account and GPUs per node, on other nodes, and ends when the
notebook job does (its walltime is what is left of the notebook job's). Its batch shell runs one srun step of ranks
(``python -m jupyter_hpcai.ranks.boot``, as every launcher does) that dial the set's controller; it ends when its
ranks are stopped (``%hpc shrink``, ``%hpc stop``) or cancelled.
"""

from __future__ import annotations

import os
import shlex
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import network
from ..contract import RANK_LOG, without_secrets
from ..errors import HPCAIError
from ..proc import run
from ..ranks.frameworks import FRAMEWORKS
from ..ranks.identity import WORLD
from ..ranks.world import OFFSET
from ..scheduler import chosen
from ..scheduler.allocation import Allocation
from ..scheduler.durations import format_duration
from ..scheduler.jobscript import JobScript, Submitted, rank_launch, ranks_per_node
from .launch import LAUNCHERS
from .own_job import log_folder
from .running_set import Grown, Rank, RunningSet

scheduler = chosen()
environment = chosen().environment

JOB_NAME = "hpcai-grow"
MIN_SECONDS = 120  # a grown job shorter than this would end before its ranks did any work
# what the kernel's environment must not pass to a grown job: Slurm's view of the notebook job (the new job has
# its own; the site's config stays), the re-formed world's places, and every secret (container.py's patterns)
NOT_PASSED = (*environment.PREFIXES, *WORLD.values(), OFFSET)
PASSED = (environment.CONFIG,)


@dataclass(frozen=True)
class Growth:
    """More nodes for a running set, as a second Slurm job (``%hpc grow --nodes K``)."""

    nodes: int
    gpus_per_node: int
    seconds: int  # its walltime: what is left of the notebook job's
    partition: str
    account: str | None
    exclude: tuple[str, ...]  # the nodes the world has already

    def job_script(self, world: RunningSet, offset: int, log: str) -> JobScript:
        """The grown job: its ranks (numbered from ``offset``) boot and register with ``world``'s controller."""
        assert world.connection_file is not None
        exports = {OFFSET: str(offset), "HPCAI_WARM": "", "HPCAI_CONNECTION_FILE": str(world.connection_file),
                   "HPCAI_CONTROLLER_TIMEOUT": "120", "HPCAI_RANK_FOLDER": str(world.folder),
                   "HPCAI_TELEMETRY_INTERVAL": str(world.telemetry_interval)}
        engine = ["--profile-dir", str(world.cluster.profile_dir), "--cluster-id", world.cluster.cluster_id]
        ranks = rank_launch(self.nodes, self.gpus_per_node, [*LAUNCHERS["srun"].program(), *engine], survive=True,
                            output=f"{world.folder}/{RANK_LOG.format(rank='%j-%t')}")
        body = "\n".join([*(f"export {k}={shlex.quote(v)}" for k, v in exports.items()),
                          *scheduler.export_node_addresses(network.NODE_ADDRS), ranks, ""])
        return JobScript(name=JOB_NAME, nodes=self.nodes, tasks_per_node=ranks_per_node(self.gpus_per_node),
                         gpus_per_node=self.gpus_per_node, time=format_duration(self.seconds),
                         partition=self.partition or None, account=self.account, output=log,
                         extra=("--no-kill", *([f"--exclude={','.join(self.exclude)}"] if self.exclude else [])),
                         body=body)

    def estimate(self, script: JobScript) -> str:
        """When Slurm would start it: "starts now", "expected HH:MM", or why it would not."""
        done = run(scheduler.test_only(script.options()), timeout=30, check=False)
        said = (done.stdout + done.stderr).strip()
        when = scheduler.expected_start(said)
        if when is None:
            return f"Slurm would not say when: {said.splitlines()[-1] if said else 'no answer'}"
        return "starts now" if when <= time.time() + 60 else f"expected {time.strftime('%H:%M', time.localtime(when))}"


def growth_for(allocation: Allocation | None, world: RunningSet, nodes: int) -> Growth:
    """The growth ``%hpc grow --nodes`` asks for, from the notebook job (or the error that says why not)."""
    if allocation is None or world.layout.launcher != "srun":
        raise HPCAIError("only engines started with srun inside a Slurm job can grow",
                         "start the notebook through the hub's Slurm spawner (or %hpc start --time ... outside one)")
    if nodes < 1:
        raise HPCAIError(f"--nodes must be at least 1, not {nodes}")
    changeable(world)
    left = allocation.seconds_left()
    seconds = int(left) if left is not None else 24 * 3600
    if seconds < MIN_SECONDS:
        raise HPCAIError(f"the notebook job ends in {seconds} s: a grown job would end with it",
                         "extend the notebook job first (%hpc extend), or continue in a follow-up job")
    return Growth(nodes, allocation.gpus_per_node, seconds - 30, allocation.partition,
                  os.environ.get(environment.ACCOUNT) or None, tuple(sorted({r.host for r in world.ranks})))


def changeable(world: RunningSet) -> None:
    """Refuse to change a world whose framework cannot follow (Horovod over MPI)."""
    for name in filter(None, {world.framework, world.warm}):
        if why := FRAMEWORKS[name].fixed():
            raise HPCAIError(why, "keep this world's size, or start it again as the message says")


def submit(script: JobScript) -> Submitted:
    """sbatch the grown job with the kernel's environment (the env's activation), less what must not pass."""
    environ = {k: v for k, v in without_secrets(dict(os.environ)).items() if k in PASSED or not k.startswith(NOT_PASSED)}
    return script.submit(env=environ, on_command_line=True)


def cancel(job: str) -> None:
    """End a grown job (its ranks with it); only one of this user's with our name."""
    import getpass

    run(scheduler.cancel_argv(job, user=getpass.getuser(), name=JOB_NAME), check=False, timeout=30)


def removable(world: RunningSet, *, nodes: int | None, ranks: list[int] | None, node: str | None,
              keep: str | None) -> list[Rank]:
    """The ranks ``%hpc shrink`` stops: ``ranks`` by number, every rank on ``node``, or the last ``nodes`` nodes
    (grown jobs' first); never all of them, never the ranks on ``keep`` (the kernel's node) by ``nodes``."""
    if sum(x is not None for x in (nodes, ranks, node)) != 1:
        raise HPCAIError("say what to shrink: one of --nodes K, --ranks R,R or --node NAME")
    changeable(world)
    if ranks is not None:
        unknown = sorted(set(ranks) - {r.rank for r in world.ranks})
        if unknown:
            raise HPCAIError(f"no rank {', '.join(map(str, unknown))} in this world of {len(world.ranks)}",
                             "%hpc status lists the ranks")
        chosen = [r for r in world.ranks if r.rank in ranks]
    elif node is not None:
        chosen = [r for r in world.ranks if r.host == node]
        if not chosen:
            raise HPCAIError(f"no rank runs on {node}", "%hpc status lists the ranks and their nodes")
    else:
        assert nodes is not None
        hosts = list(dict.fromkeys(r.host for r in world.ranks))
        candidates = [h for h in reversed(hosts) if h != keep]
        if nodes < 1 or nodes > len(candidates):
            raise HPCAIError(f"cannot give back {nodes} node(s): {len(candidates)} of the world's {len(hosts)} can go "
                             "(the notebook's own node stays)", f"use --nodes 1..{len(candidates)}")
        gone = set(candidates[:nodes])
        chosen = [r for r in world.ranks if r.host in gone]
    if len(chosen) == len(world.ranks):
        raise HPCAIError("that would stop every rank", "%hpc stop stops them all")
    return chosen


def grow(world: RunningSet, allocation: Allocation | None, nodes: int, write: Callable[[str], Any]) -> str:
    """Submit a grown job for ``nodes`` more nodes (its estimate said first); recorded in ``world.grown``."""
    growth = growth_for(allocation, world, nodes)
    ranks = nodes * ranks_per_node(growth.gpus_per_node)
    offset = len(world.ranks) + sum(g.ranks for job, g in world.grown.items() if not world.ranks_of(job))
    script = growth.job_script(world, offset, str(log_folder() / "grow-%j.log"))
    write(f"asking Slurm for {nodes} more node(s) x {growth.gpus_per_node} GPU(s) for "
          f"{format_duration(growth.seconds)}: {growth.estimate(script)}\n")
    job = str(submit(script).job_id)
    world.grown[job] = Grown(nodes, ranks)
    world.write_rank_table()
    write(f"Slurm job {job} submitted; its ranks join when it runs (%hpc status shows them; the next cell runs on "
          "every rank in by then)\n")
    return job


def take_joined(world: RunningSet) -> bool:
    """The ranks of a grown job join the world once all of them registered: each engine says which job it runs in,
    so an engine of no waiting job (one just stopped, or another job's) is never taken."""
    waiting = {job: g for job, g in world.grown.items() if not world.ranks_of(job)}
    if world.client is None or not waiting:
        return False
    joined = world.joined()
    if len(joined) < min(g.ranks for g in waiting.values()):
        return False
    infos = world.identify(joined)
    taken = {}
    for job, grown in waiting.items():
        mine = {eid: info for eid, info in infos.items() if info["job"] == job}
        if len(mine) == grown.ranks:
            taken.update(mine)
    if taken:
        world.adopt(taken)
    return bool(taken)


def shrink(world: RunningSet, allocation: Allocation | None, *, nodes: int | None, ranks: list[int] | None,
           node: str | None) -> tuple[str, Allocation | None]:
    """Stop the ranks ``removable`` picks (a grown job still waiting goes first for ``nodes``) and give the nodes
    they leave empty back to Slurm; what was done, and the notebook job's allocation after."""
    keep = os.environ.get(environment.NODE_NAME)
    done: list[str] = []
    for job in [job for job in world.grown if not world.ranks_of(job)][::-1]:  # what never started goes first
        if not nodes:
            break
        cancel(job)
        nodes = max(0, nodes - world.grown.pop(job).nodes)
        done.append(f"cancelled Slurm job {job} (still waiting)")
    if nodes or ranks is not None or node is not None:
        chosen = removable(world, nodes=nodes or None, ranks=ranks, node=node, keep=keep)
        world.remove(chosen)
        done.append(f"stopped {len(chosen)} rank(s) on {', '.join(sorted({r.host for r in chosen}))}")
        emptied = {r.host for r in chosen} - {r.host for r in world.ranks}
        for job in sorted({r.job for r in chosen}):
            said, allocation = _give_back(world, allocation, job, emptied - {keep})
            done += said
    world.write_rank_table()
    return "; ".join(done) + f"; {len(world.ranks)} ranks now", allocation


def _give_back(world: RunningSet, allocation: Allocation | None, job: str,
               emptied: set[str]) -> tuple[list[str], Allocation | None]:
    """``job``'s nodes that no rank uses any more go back to Slurm: a grown job without ranks ends, another job
    (the notebook's, a grown one) is narrowed to the nodes it still uses."""
    if job in world.grown and not world.ranks_of(job):
        cancel(job)
        del world.grown[job]
        return [f"Slurm job {job} cancelled"], allocation
    if not emptied:
        return [], allocation
    notebook_job = allocation is not None and job == allocation.job_id
    held = allocation.nodes if notebook_job else \
        scheduler.expand_hostlist((scheduler.job_info(job) or {}).get("NodeList", ""))
    gone = emptied & set(held)
    if not gone:
        return [], allocation
    left = release_nodes(job, [n for n in held if n not in gone])
    said = [f"{', '.join(sorted(gone))} given back to Slurm (job {job})"]
    return said, (narrowed(allocation, left) if notebook_job and allocation else allocation)


def release_nodes(job: str, left: list[str]) -> list[str]:
    """Narrow a running job to the nodes ``left`` (``scontrol update NodeList``, as the job's owner)."""
    with tempfile.TemporaryDirectory(prefix="hpcai-resize-") as scratch:  # where Slurm writes its resize scripts,
        done = run(scheduler.narrow_argv(job, left), check=False, timeout=30, cwd=scratch)  # not the notebook's folder
    if done.returncode != 0:
        raise HPCAIError(f"Slurm did not narrow job {job} to {','.join(left)}: {done.stderr.strip()}",
                         "the ranks there were stopped; the nodes stay in the job until it ends")
    return left


def narrowed(allocation: Allocation, left: list[str]) -> Allocation:
    """The notebook job's allocation after a release, also in this kernel's SLURM_* variables, so that the next
    start plans on the nodes still held (other kernels of the job keep what they read at their start)."""
    environment.narrow(os.environ, ",".join(left), len(left),
                       len(left) * max(1, allocation.tasks // max(1, len(allocation.nodes))))
    return Allocation.current() or allocation
