"""How a set comes to run in this kernel (in the kernel): started here, or attached. What it does once it runs is
running_set.py.

``prepare`` then ``launch`` start the controller and the ranks side by side: each rank imports and initialises its
framework (ranks/boot.py) while the controller starts and the engines register; a start that fails says why in
the launcher's words. ``attach`` takes over a set another kernel of the job started.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import ipyparallel as ipp
from traitlets.config import Config

from .. import network
from ..errors import HPCAIError
from ..proc import wait_until
from ..ranks import telemetry
from ..ranks.frameworks import FRAMEWORKS, LAUNCH_VARS
from ..scheduler import chosen
from ..scheduler.allocation import Allocation
from . import listing
from .controller import command as tied_controller
from .launch import LAUNCHERS, Layout, RankSetLauncher
from .report import exited, launcher_said, printed
from .running_set import Grown, RunningSet, Timeline, controller_ip, point_px_at

scheduler = chosen()
environment = chosen().environment

Progress = Callable[[int, int], None]  # (engines registered, engines wanted)
# Heartbeats every 250 ms (a new engine registers at the first beat it answers); 20 misses (5 s) before an
# engine counts as dead, as before. Between its registration and its first beat an engine builds its kernel: 128
# ranks on 2 cores took 30-45 s there, past ipyparallel's default registration timeout (30 s), after which the
# controller ignored their hearts for good ("heartbeat::ignoring new heart") and none of them joined; so a
# registration waits as long as the start does (registration_args).
CONTROLLER_ARGS = ["--HeartMonitor.period=250", "--HeartMonitor.max_heartmonitor_misses=20"]


def registration_args(timeout: float) -> list[str]:
    """The controller's arguments for a start that waits ``timeout`` seconds for its engines."""
    return [*CONTROLLER_ARGS, f"--IPController.registration_timeout={max(30, int(timeout))}"]
_start_ids = itertools.count()
# a rank's task ended, as the scheduler's step says it and the local launcher
TASK_ENDED = re.compile(rf"^(?:{scheduler.TASK_ENDED}|hpcai-local: error: rank \d+): ", re.M)


def node_addresses(allocation: Allocation | None) -> dict[str, str]:
    """Every node's Slurm address, for the ranks to find their interface (network.py); none outside a job."""
    return scheduler.node_addresses(allocation.nodes) if allocation and allocation.nodes else {}


def command(layout: Layout, allocation: Allocation | None, folder: Path | None = None) -> list[str]:
    """The command that starts the ranks for ``layout`` (printable before anything starts)."""
    return LAUNCHERS[layout.launcher].command(layout, node_addresses(allocation), rank_logs=folder)


def prepare(allocation: Allocation | None, job: str, layout: Layout, warm: str | None, timeout: float,
            telemetry_interval: float, goes_with_kernel: bool) -> RunningSet:
    """A set configured and its folder made, nothing started yet (``launch`` starts it). ``job``: the Slurm job
    (or "local"), the first part of the set's id; ``goes_with_kernel``: the set stops with this kernel."""
    cluster_id = f"hpcai-{job}-{os.getpid()}-{next(_start_ids)}"  # never a previous start's files
    config = Config()
    config.RankSetLauncher.launcher = layout.launcher
    if goes_with_kernel:  # a killed kernel's controller stops too (controller.py)
        config.LocalControllerLauncher.controller_cmd = tied_controller(os.getpid())
    listens = controller_ip(allocation)
    cluster = ipp.Cluster(n=layout.n, engine_launcher_class=RankSetLauncher, controller_ip=listens,
                          cluster_id=cluster_id, config=config, engine_timeout=int(timeout), log_level=40,
                          controller_args=registration_args(timeout), send_engines_connection_env=False,
                          shutdown_atexit=goes_with_kernel)
    # the set's folder sits in the profile, which every node reads already (the connection file); the
    # command names it, so it is set once the cluster knows its profile
    folder = listing.create_set_folder(Path(cluster.profile_dir), cluster_id)
    cluster.config.RankSetLauncher.command = command(layout, allocation, folder)
    connection_file = Path(cluster.profile_dir) / "security" / f"ipcontroller-{cluster_id}-engine.json"
    world = RunningSet(cluster, None, folder, layout, warm, telemetry_interval, listens,  # type: ignore[arg-type]
                       connection_file, timeline=Timeline())
    world.write_rank_table()  # owned from the start: another kernel's start leaves a starting set alone
    return world


def launch(world: RunningSet, allocation: Allocation | None, timeout: float, progress: Progress | None) -> None:
    """Start the controller and the ranks side by side; return once every rank registered."""
    cluster, timeline = world.cluster, world.timeline
    assert timeline is not None
    cluster.start_controller_sync()
    timeline.mark("controller process started")
    # The ranks start now, beside the controller; each waits for the controller's file (ranks/boot.py).
    addresses = node_addresses(allocation)
    cluster.start_engines_sync(environment={
        network.NODE_ADDRS: network.encode_addresses(addresses), "HPCAI_WARM": world.warm or "",
        "HPCAI_CONNECTION_FILE": str(world.connection_file), "HPCAI_CONTROLLER_TIMEOUT": str(timeout),
        telemetry.FOLDER_VAR: str(world.folder), telemetry.INTERVAL_VAR: str(world.telemetry_interval),
        **_frameworks_env(world, addresses.values())})
    timeline.mark("launcher started")
    listing.record_processes(cluster)
    try:
        world.client = cluster.connect_client_sync()
    except (RuntimeError, TimeoutError) as err:
        said = launcher_said(printed(cluster.controller)) if cluster.controller else ""
        raise _cannot_listen(world, err, said) from None
    timeline.mark("controller up")
    registered = _wait_for_engines(world, world.layout.n, timeout, progress)
    timeline.mark("all registered", max(registered.values()))
    rank_timelines, _ = world.read_ranks()
    world.write_rank_table()
    point_px_at(world)
    timeline.ranks_reached(rank_timelines)
    timeline.mark("rank table + preflight data")


def attach(allocation: Allocation | None, job: str, cluster_id: str | None, timeout: float) -> RunningSet:
    """A set running in this job already (an earlier kernel's, or another notebook's), with everything
    defined on the ranks: ``cluster_id``, else the only set no kernel uses, else the only set. This kernel
    serves the rendezvous of the worlds it re-forms (a rest, a wake, a grow) at its own address."""
    found = listing.attachable(job, cluster_id)
    listens = controller_ip(allocation)
    cluster = found.cluster()
    try:
        client = cluster.connect_client_sync(timeout=timeout)
    except (RuntimeError, TimeoutError, OSError) as err:
        raise HPCAIError(f"could not reach the controller of {found.cluster_id}: {err}",
                         "stop the set (side panel) and start new engines with %hpc start") from None
    wanted = {r["engine_id"] for r in found.table["ranks"]}

    def registered() -> bool:
        client.spin()
        return wanted <= set(client.ids)

    try:
        wait_until(registered, timeout=timeout, what=f"the {len(wanted)} engines of {found.cluster_id} to answer",
                   hint="ranks died: stop the set (side panel) and %hpc start new engines")
    except HPCAIError:
        client.close()
        raise
    world = RunningSet(cluster, client, found.folder, Layout(**found.table["layout"]), found.table.get("warm"),
                       found.table.get("telemetry_interval", telemetry.DEFAULT_INTERVAL), listens)
    _, frameworks = world.read_ranks()
    # initialised on every rank (and kept at rest, or not, alike)
    world.framework, world.resting = frameworks.pop() if len(frameworks) == 1 else (None, None)
    world.grown = {job: Grown(*counts) for job, counts in found.table.get("grown", {}).items()}
    world.changes = 1  # the launch's rendezvous (Horovod's) lived in the kernel that started the set
    world.write_rank_table(owners=listing.live_owners(found.table))
    point_px_at(world)
    return world


def _frameworks_env(world: RunningSet, addresses: Iterable[str]) -> dict[str, str]:
    """What the ranks need to initialise the env's frameworks in this world (a rendezvous the kernel holds,
    on the controller's address)."""
    counts = world.layout.counts
    env = dict.fromkeys(LAUNCH_VARS, "")
    for framework in FRAMEWORKS.values():
        if framework.launch_env and framework.installed():
            try:
                env.update(framework.launch_env(world, counts, addresses))
            except OSError as err:
                raise _cannot_listen(world, err) from None
    return env


def _cannot_listen(world: RunningSet, err: BaseException, said: str = "") -> HPCAIError:
    """The error for a controller (or a rendezvous beside it) that could not listen where it was told."""
    where = os.environ.get(environment.NODE_NAME) or "this host"
    return HPCAIError(f"the ipyparallel controller could not start on {where} (listening on {world.listens}): "
                      f"{err}" + (f"\nit said:\n{said}" if said else ""),
                      "check HPCAI_CONTROLLER_IP (an address of this node, or unset), then %hpc start again")


def _wait_for_engines(world: RunningSet, n: int, timeout: float, progress: Progress | None) -> dict[int, float]:
    """Until ``n`` engines registered; when each did (wall clock, as the kernel saw it)."""
    deadline = time.monotonic() + timeout
    seen: dict[int, float] = {}
    while True:
        world.connected.spin()
        for eid in world.connected.ids:
            seen.setdefault(eid, time.time())
        if len(seen) >= n:
            break
        if progress:
            progress(len(seen), n)
        if _a_rank_exited(world):
            said = world.launcher_report(wait=0)
            raise HPCAIError(f"the engine launcher exited before {n} engines registered ({_dialled(world)}):"
                             f"\n{said}", "check the allocation (squeue), that the env runs on every node, and "
                             "that the nodes reach that address (else set HPCAI_CONTROLLER_IP to one they reach)")
        if time.monotonic() > deadline:
            said = world.launcher_report(wait=0)
            raise HPCAIError(f"only {len(seen)} of {n} engines registered within {timeout:g} s ({_dialled(world)})"
                             + (f"; the launcher and the ranks said:\n{said}" if said else ""),
                             "the nodes may be slow to start python (try again with a longer timeout), or may not "
                             "reach that address (set HPCAI_CONTROLLER_IP to one they reach)")
        time.sleep(0.02)
    if progress:
        progress(n, n)
    return seen


def _a_rank_exited(world: RunningSet) -> bool:
    """The launcher ended, or (srun and the local launcher leave the other ranks running) said that a rank's
    task ended."""
    launchers = list(world.cluster.engines.values())
    return any(exited(ln) for ln in launchers) or any(TASK_ENDED.search(printed(ln)) for ln in launchers)


def _dialled(world: RunningSet) -> str:
    """Where the controller listens and the address the ranks dial (from the connection file they read)."""
    try:
        info = json.loads(world.connection_file.read_text()) if world.connection_file else {}
        dial = f"{info['interface']}:{info['registration']}"
    except (OSError, ValueError, KeyError):
        dial = "(no connection file yet)"
    return f"the controller listens on {world.listens}; the ranks dial {dial}"
