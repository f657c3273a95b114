"""The engines of a kernel: an ipyparallel cluster whose engines are this allocation's ranks.

One controller runs beside the kernel, bound to the address Slurm uses for this node (never all
interfaces); the engines are launched as one set (see launch.py), side by side with the controller: each
rank imports and initialises its framework (boot.py) while the controller starts and the engines register.
Cluster files live where ipyparallel keeps them (the IPython profile's security/ folder, private to the
user), so the server extension can list them without a registry of its own.

Inside a job the engines outlive their kernel (a restart, a crash): another kernel of the job attaches to them
with their state (``attach``), the side panel lists and stops them, ``start`` stops the ones no kernel uses any
more, and the job's end stops them all (listing.record_processes). Outside a job they stop with the kernel.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

import ipyparallel as ipp
from traitlets.config import Config

from .. import network, slurm
from ..container_launch import ContainerLaunch
from ..allocation import Allocation
from ..errors import HPCAIError
from ..proc import wait_until
from . import listing, own_job, rankside, telemetry
from .controller import command as tied_controller
from . import stacks as rank_stacks
from .frameworks import DISTRIBUTIONS, FRAMEWORKS, default_framework
from .launch import LAUNCHERS, Layout, RankSetLauncher, plan
from .report import launcher_said
from .output import OUTPUT_MODES, RankFailure, Streamer, Streams, Write

CONTINUITY = "__import__('jupyter_hpcai.engines.continuity', fromlist=['hpc'])"  # the ranks' walltime API

Progress = Callable[[int, int], None]  # (engines registered, engines wanted)
State = Literal["stopped", "pending", "starting", "running", "restarting", "stopping"]
# Heartbeats every 250 ms (a new engine registers at the first beat it answers); 20 misses (5 s) before an
# engine counts as dead, as before.
CONTROLLER_ARGS = ["--HeartMonitor.period=250", "--HeartMonitor.max_heartmonitor_misses=20"]
_start_ids = itertools.count()


@dataclass(frozen=True)
class Rank:
    """One engine as the user sees it."""

    rank: int
    host: str
    gpu: str
    pid: int
    engine_id: int
    addr: str = ""  # the node's address, which the other nodes reach
    alive: bool = True


@dataclass
class Timeline:
    """When each phase of a start ended, in seconds after the start was asked for (the last rank's, for
    phases every rank goes through): what ``hpcai bench overhead --breakdown`` prints."""

    started: float = field(default_factory=time.time)
    phases: dict[str, float] = field(default_factory=dict)

    def mark(self, phase: str, at: float | None = None) -> None:
        self.phases[phase] = (time.time() if at is None else at) - self.started

    def ranks_reached(self, timelines: list[dict[str, float]]) -> None:
        """The ranks' own boot phases (boot.py), each at the last rank to end it."""
        for phase, label in RANK_PHASES.items():
            ends = [t[phase] for t in timelines if phase in t]
            if len(ends) == len(timelines) and ends:
                self.mark(label, max(ends))


RANK_PHASES = {"process": "srun step start (rank processes exist)", "python": "python start",
               "imported": "imports (pin, network, ipyparallel)", "controller": "connection file seen",
               "framework": "framework import + init (on the ranks, at boot)"}


def controller_ip(allocation: Allocation | None) -> str:
    """Where the controller listens: ``HPCAI_CONTROLLER_IP``; in an allocation, this host's address on its route
    to the allocation's first node, wherever the kernel runs (on a node, on the login node under ``salloc``, in a
    hub-started server); outside one, loopback (the ranks run on this host)."""
    if os.environ.get("HPCAI_CONTROLLER_IP"):
        return os.environ["HPCAI_CONTROLLER_IP"]
    if allocation is None or not allocation.nodes:
        return network.LOOPBACK
    first = slurm.node_address(allocation.nodes[0])
    try:
        return network.source_address(first)
    except OSError as err:
        raise HPCAIError(f"this host has no route to the allocation's first node {allocation.nodes[0]} ({first}): {err}",
                         "set HPCAI_CONTROLLER_IP to this host's address on the nodes' network") from None


class Engines:
    """Start, stop, restart and inspect this kernel's engines (one per rank), and run cells on them."""

    def __init__(self, allocation: Allocation | None = None) -> None:
        self.allocation = allocation
        self.layout: Layout | None = None
        self.cluster: ipp.Cluster | None = None
        self._client: ipp.Client | None = None
        self.ranks: list[Rank] = []
        self.listens = ""  # the controller's address, and the file the ranks read it from (set at start)
        self.connection_file: Path | None = None
        self.framework: str | None = None  # initialised on every rank
        self.warm: str | None = None  # initialised by the ranks as they boot
        self.versions: dict[int, dict[str, Any]] = {}
        self.timeline: Timeline | None = None
        self.folder: Path | None = None  # the set's private folder (listing.py): rank output, telemetry, rank table
        self.telemetry_interval = telemetry.DEFAULT_INTERVAL
        self.replaced: list[listing.EngineSet] = []  # sets no kernel used, stopped by the last start
        self.own_job: own_job.OwnJob | None = None  # the allocation this kernel asked for itself (own_job.py)
        self.pending: dict[str, str] | None = None  # its Slurm record while it waits to run
        self._starting = threading.Lock()  # one start at a time (the panel's waits in a thread)
        if allocation is None:  # outside a job nothing would stop them: they go with the kernel (ipyparallel's atexit)
            atexit.register(self._remove_folder)
        self.state: State = "stopped"
        self._listeners: list[Callable[[Engines], None]] = []
        self._running_cell = threading.Lock()

    # --- state, for the panel and the magics --------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._client is not None

    def subscribe(self, listener: Callable[[Engines], None]) -> Callable[[], None]:
        """Call ``listener(engines)`` on every change of state (start, stop, restart); returns the unsubscribe."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _set_state(self, state: State) -> None:
        self.state = state
        for listener in list(self._listeners):
            listener(self)

    # --- start and stop -----------------------------------------------------------------------------------
    def command(self, layout: Layout, folder: Path | None = None) -> list[str]:
        """The command that starts the ranks for ``layout`` (printable before anything starts)."""
        return LAUNCHERS[layout.launcher].command(layout, self._node_addresses(), rank_logs=folder)

    def start(self, *, n: int | None = None, nodes: int | None = None, gpus_per_node: int | None = None,
              launcher: str | None = None, framework: str | None = "auto", timeout: float = 180,
              telemetry_interval: float = telemetry.DEFAULT_INTERVAL, progress: Progress | None = None,
              ask: own_job.Request | None = None, pending: own_job.Pending | None = None) -> list[Rank]:
        """Start the engines (stopping any running ones first) and return the ranks, in rank order.

        ``framework``: initialised by every rank as it boots, so that the first cell finds it ready: a name in
        FRAMEWORKS, "auto" (the env's: Horovod, else torch) or None (only on first use).
        ``telemetry_interval``: seconds between the ranks' telemetry samples (0: off).
        ``ask``: outside any job, the allocation to submit and start in (own_job.py), kept until ``stop``;
        ``pending`` hears its record while Slurm has not started it.
        """
        if not self._starting.acquire(blocking=False):
            raise HPCAIError("a start of these engines is under way (in the panel, or another thread)",
                             "wait for it, or %hpc stop (which also releases a job that waits)")
        try:
            return self._start_or_ask(n, nodes, gpus_per_node, launcher, framework, timeout, telemetry_interval,
                                      progress, ask, pending)
        finally:
            self._starting.release()

    def _start_or_ask(self, n: int | None, nodes: int | None, gpus_per_node: int | None, launcher: str | None,
                      framework: str | None, timeout: float, telemetry_interval: float, progress: Progress | None,
                      ask: own_job.Request | None, pending: own_job.Pending | None) -> list[Rank]:
        self.telemetry_interval = telemetry.checked_interval(telemetry_interval)
        if ask is not None:
            self.check_request(ask, launcher)
        new_job = ask is not None and self.own_job is None
        # bad arguments leave running engines be; a new job's layout is checked against the request before it is
        # submitted, and planned on the real allocation once it runs
        layout = None if new_job else plan(self.allocation, n=n, nodes=nodes, gpus_per_node=gpus_per_node,
                                           launcher=launcher)
        if new_job:
            plan(ask.as_allocation(), n=n, nodes=nodes, gpus_per_node=gpus_per_node, launcher=launcher)  # type: ignore[union-attr]
        warm = default_framework() if framework == "auto" else framework
        if warm is not None and warm not in FRAMEWORKS:
            raise HPCAIError(f"unknown framework '{warm}'", f"use one of: {', '.join(FRAMEWORKS)}, or none")
        restarting = self.state == "restarting"
        self.stop(notify=False, release=False)
        self._set_state("restarting" if restarting else "starting")
        try:
            if new_job:
                self._enter_own_job(ask, pending)  # type: ignore[arg-type]
            elif self.own_job is not None:
                self._check_own_job()
            layout = layout or plan(self.allocation, n=n, nodes=nodes, gpus_per_node=gpus_per_node, launcher=launcher)
            self.replaced = listing.stop_detached(self.job)  # a restarted kernel's engines: GPUs nobody uses
            self._start(layout, warm, timeout, progress)
        except BaseException:
            # a job that never ran (an interrupt while it waited, Slurm's refusal) is cancelled; one the kernel is
            # in stays for the next start (%hpc stop releases it), as the engines' failure is no reason to lose it
            self.stop(release=self.own_job is not None and not self.own_job.entered)
            raise
        self._set_state("running")
        return self.ranks

    def check_request(self, ask: own_job.Request, launcher: str | None) -> None:
        """An allocation may be asked for outside any job, once, for ranks that srun starts."""
        if self.allocation is not None and self.own_job is None:
            raise HPCAIError(f"this kernel runs in Slurm job {self.allocation.job_id} already",
                             "leave out --time, --partition and --account: the engines start in that job")
        if self.own_job is not None and self.own_job.request != ask:
            raise HPCAIError(f"this kernel holds Slurm job {self.own_job.job_id} ({self.own_job.request.describe()})",
                             "use it (%hpc start without --time), or %hpc stop to release it, then ask again")
        if launcher not in (None, "srun"):
            raise HPCAIError(f"the ranks in a job this kernel asks for start with srun, not {launcher}",
                             "leave out --launcher")

    def _enter_own_job(self, ask: own_job.Request, pending: own_job.Pending | None) -> None:
        """Submit ``ask``, wait until Slurm runs it (state "pending" meanwhile), and take it as the allocation."""
        self.own_job = job = own_job.OwnJob(ask)
        job.submit()

        def waiting(info: dict[str, str]) -> None:
            self.pending = info
            self._set_state("pending")
            if pending:
                pending(info)

        job.enter(job.wait(waiting))
        self.pending = None
        self._set_state("starting")
        self.allocation = Allocation.current()

    def _check_own_job(self) -> None:
        """This kernel's own job still runs (a time limit may have ended it)."""
        job = self.own_job
        assert job is not None
        info = slurm.job_info(job.job_id)
        if not info or info["JobState"] != "RUNNING":
            self.stop(notify=False)  # out of it: the kernel may ask for a new one
            state = info["JobState"] if info else "gone"
            raise HPCAIError(f"this kernel's Slurm job {job.job_id} is no longer running ({state})",
                             f"ask for a new one: %hpc start --nodes {job.request.nodes} --gpus-per-node "
                             f"{job.request.gpus_per_node} --time ...")

    def _start(self, layout: Layout, warm: str | None, timeout: float, progress: Progress | None) -> None:
        self.timeline = timeline = Timeline()
        cluster_id = f"hpcai-{self.job}-{os.getpid()}-{next(_start_ids)}"  # never a previous start's files
        config = Config()
        config.RankSetLauncher.launcher = layout.launcher
        if self.goes_with_kernel:  # a killed kernel's controller stops too (controller.py)
            config.LocalControllerLauncher.controller_cmd = tied_controller(os.getpid())
        self.listens = controller_ip(self.allocation)
        self.cluster = cluster = ipp.Cluster(
            n=layout.n, engine_launcher_class=RankSetLauncher, controller_ip=self.listens,
            cluster_id=cluster_id, config=config, engine_timeout=int(timeout), log_level=40,
            controller_args=CONTROLLER_ARGS, send_engines_connection_env=False,
            shutdown_atexit=self.goes_with_kernel)
        # the set's folder sits in the profile, which every node reads already (the connection file); the
        # command names it, so it is set once the cluster knows its profile (the engine set reads the cluster's config)
        self.folder = listing.create_set_folder(Path(cluster.profile_dir), cluster_id)
        cluster.config.RankSetLauncher.command = self.command(layout, self.folder)
        self.connection_file = connection_file = (Path(cluster.profile_dir) / "security"
                                                  / f"ipcontroller-{cluster_id}-engine.json")
        self.layout, self.warm = layout, warm
        self._write_rank_table()  # owned from the start: another kernel's start leaves a starting set alone
        cluster.start_controller_sync()
        timeline.mark("controller process started")
        # The ranks start now, beside the controller; each waits for the controller's file (boot.py).
        cluster.start_engines_sync(environment={
            network.NODE_ADDRS: network.encode_addresses(self._node_addresses()), "HPCAI_WARM": warm or "",
            "HPCAI_CONNECTION_FILE": str(connection_file), "HPCAI_CONTROLLER_TIMEOUT": str(timeout),
            telemetry.FOLDER_VAR: str(self.folder), telemetry.INTERVAL_VAR: str(self.telemetry_interval)})
        timeline.mark("launcher started")
        listing.record_processes(cluster)
        try:
            self._client = cluster.connect_client_sync()
        except (RuntimeError, TimeoutError) as err:
            said = launcher_said(_output(cluster.controller)) if cluster.controller else ""
            raise HPCAIError(f"the ipyparallel controller could not start on {os.environ.get('SLURMD_NODENAME') or 'this host'}"
                             f" (listening on {self.listens}): {err}" + (f"\nit said:\n{said}" if said else ""),
                             "check HPCAI_CONTROLLER_IP (an address of this node, or unset), then %hpc start again") from None
        timeline.mark("controller up")
        registered = self._wait_for_engines(layout.n, timeout, progress)
        timeline.mark("all registered", max(registered.values()))
        self.ranks, self.versions, rank_timelines, _ = self._rank_table()
        self._write_rank_table()
        timeline.ranks_reached(rank_timelines)
        timeline.mark("rank table + preflight data")

    @property
    def goes_with_kernel(self) -> bool:
        """Outside a job, and in the kernel's own job, the engines stop with the kernel; in a job they outlive it."""
        return self.allocation is None or self.own_job is not None

    @property
    def job(self) -> str:
        """The Slurm job the engines run in, "local" outside one (the first part of their cluster ids)."""
        return self.allocation.job_id if self.allocation else "local"

    def _write_rank_table(self, owners: Sequence[int] = ()) -> None:
        """The rank table, this kernel among the set's owners (the kernels using it), with what another kernel
        needs to attach."""
        assert self.folder is not None and self.layout is not None
        listing.write_rank_table(self.folder, self.layout.launcher, [asdict(r) for r in self.ranks],
                                 container=ContainerLaunch.from_env(os.environ) is not None,
                                 owners=sorted({*owners, os.getpid()}), layout=asdict(self.layout), warm=self.warm,
                                 telemetry_interval=self.telemetry_interval)

    def attach(self, cluster_id: str | None = None, timeout: float = 30) -> list[Rank]:
        """Use engines that are running in this job already (an earlier kernel's, or another notebook's), with
        everything defined on the ranks: ``cluster_id``, else the only set no kernel uses, else the only set."""
        if self.running:
            raise HPCAIError("this kernel has engines already", "use them, or %hpc stop them first")
        found = listing.attachable(self.job, cluster_id)
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
        self.cluster, self._client = cluster, client
        self.folder = found.folder
        self.layout, self.warm = Layout(**found.table["layout"]), found.table.get("warm")
        self.telemetry_interval = found.table.get("telemetry_interval", telemetry.DEFAULT_INTERVAL)
        self.ranks, self.versions, _, frameworks = self._rank_table()
        self.framework = frameworks.pop() if len(frameworks) == 1 else None  # initialised on every rank
        self._write_rank_table(owners=listing.live_owners(found.table))
        self._set_state("running")
        return self.ranks

    def _node_addresses(self) -> dict[str, str]:
        """Every node's Slurm address, for the ranks to find their interface (network.py); none outside a job."""
        return slurm.node_addresses(self.allocation.nodes) if self.allocation and self.allocation.nodes else {}

    def _wait_for_engines(self, n: int, timeout: float, progress: Progress | None) -> dict[int, float]:
        """Until ``n`` engines registered; when each did (wall clock, as the kernel saw it)."""
        assert self._client is not None and self.cluster is not None
        deadline = time.monotonic() + timeout
        seen: dict[int, float] = {}
        while True:
            self._client.spin()
            for eid in self._client.ids:
                seen.setdefault(eid, time.time())
            if len(seen) >= n:
                break
            if progress:
                progress(len(seen), n)
            if any(_exited(launcher) for launcher in self.cluster.engines.values()):
                said = self.launcher_report(wait=0)
                raise HPCAIError(f"the engine launcher exited before {n} engines registered ({self.dialled()}):\n{said}",
                                 "check the allocation (squeue), that the env runs on every node, and that the nodes "
                                 "reach that address (else set HPCAI_CONTROLLER_IP to one they reach)")
            if time.monotonic() > deadline:
                raise HPCAIError(f"only {len(seen)} of {n} engines registered within {timeout:g} s ({self.dialled()})",
                                 "the nodes may be slow to start python (try again with a longer timeout), or may not "
                                 "reach that address (set HPCAI_CONTROLLER_IP to one they reach)")
            time.sleep(0.02)
        if progress:
            progress(n, n)
        return seen

    def dialled(self) -> str:
        """Where the controller listens and the address the ranks dial (from the connection file they read)."""
        try:
            info = json.loads(self.connection_file.read_text()) if self.connection_file else {}
            dial = f"{info['interface']}:{info['registration']}"
        except (OSError, ValueError, KeyError):
            dial = "(no connection file yet)"
        return f"the controller listens on {self.listens}; the ranks dial {dial}"

    def _rank_table(self) -> tuple[list[Rank], dict[int, dict[str, Any]], list[dict[str, float]], set[str | None]]:
        """One round trip: who each engine is, the versions the preflight compares, its boot timeline, and the
        frameworks the ranks initialised."""
        assert self._client is not None
        ids = list(self._client.ids)
        infos = self._client[ids].apply_sync(rankside.rank_info, list(DISTRIBUTIONS))
        ranks = sorted(((Rank(i["rank"], i["host"], i["gpu"], i["pid"], eid, i["addr"]), i) for eid, i in zip(ids, infos)),
                       key=lambda pair: (pair[0].rank, pair[0].engine_id))
        if [r.rank for r, _ in ranks] != list(range(len(ranks))):  # no MPI rank (local launcher without MPI)
            ranks = [(replace(r, rank=k), i) for k, (r, i) in enumerate(ranks)]
        return ([r for r, _ in ranks], {r.rank: i["versions"] for r, i in ranks}, [i["timeline"] for _, i in ranks],
                {i["framework"] for _, i in ranks})

    def stop(self, notify: bool = True, release: bool = True) -> None:
        """Stop the engines and the controller, and (``release``) end this kernel's own job if it has one.
        Harmless when nothing runs."""
        client, cluster = self._client, self.cluster
        self._client = self.cluster = None
        self.ranks, self.framework, self.warm = [], None, None
        if client is not None:
            client.close()
        if cluster is not None:
            try:
                cluster.stop_cluster_sync()
            except Exception:  # engines that died already; the controller still goes
                cluster.stop_controller_sync()
            listing.forget_processes(cluster.cluster_id)
        self._remove_folder()
        if release and self.own_job is not None:
            self.own_job.release()
            self.own_job = self.pending = self.allocation = None
        if notify:
            self._set_state("stopped")

    def _remove_folder(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def restart(self, *, timeout: float = 180, progress: Progress | None = None) -> list[Rank]:
        """Stop everything and start the same layout again (the same framework initialised at boot)."""
        if self.layout is None:
            raise HPCAIError("no engines were started in this kernel", "start them first: %hpc start")
        layout, warm = self.layout, self.warm or self.framework
        self._set_state("restarting")
        return self.start(n=layout.n, nodes=layout.nodes, gpus_per_node=layout.per_node, launcher=layout.launcher,
                          framework=warm, timeout=timeout, telemetry_interval=self.telemetry_interval, progress=progress)

    # --- what the ranks are doing -------------------------------------------------------------------------
    def status(self) -> list[Rank]:
        """The ranks, each marked alive or not (an engine the controller lost is not alive)."""
        if self._client is None:
            return []
        self._client.spin()
        alive = set(self._client.ids)
        return [replace(r, alive=r.engine_id in alive) for r in self.ranks]

    def set_telemetry(self, interval: float) -> None:
        """Sample every ``interval`` seconds on every rank from now on (0: off), the ranks staying as they are."""
        self.view().apply_sync(telemetry.set_interval, telemetry.checked_interval(interval))
        self.telemetry_interval = interval

    def samples(self) -> list[telemetry.Sample]:
        """Every rank's latest telemetry (read from the set's folder: nothing asks the ranks)."""
        return telemetry.read(self.folder) if self.folder else []

    def dead(self) -> list[Rank]:
        return [r for r in self.status() if not r.alive]

    def controller_alive(self) -> bool:
        """True while the controller process (it runs beside the kernel) is there."""
        controller = self.cluster.controller if self.cluster else None
        return bool(controller and controller.state == "running") and not _exited(controller)

    def launcher_report(self, wait: float = 10) -> str:
        """After ranks died: what the launcher printed, once it has exited (waiting at most ``wait`` s), cut down
        to the part that names the cause (report.launcher_said): what ranks wrote before dying (Open MPI's error
        blocks whole, once for all the ranks that printed them) and srun's word on dead tasks."""
        if self.cluster is None:
            return ""
        launchers = list(self.cluster.engines.values())
        try:
            wait_until(lambda: all(_exited(ln) for ln in launchers), timeout=wait, what="the launcher to exit")
        except HPCAIError:
            pass  # report what it said so far
        ranks = sorted(self.folder.glob("rank-*.log")) if self.folder else []
        return launcher_said("\n".join([*map(_output, launchers), *(p.read_text(errors="replace") for p in ranks)]))

    def view(self) -> ipp.DirectView:
        """A DirectView on the ranks, in rank order (for %%px and ipyparallel's own API)."""
        if self._client is None:
            raise HPCAIError("no engines are running", "start them: %hpc start")
        return self._client[[r.engine_id for r in self.ranks]]

    def call(self, rank: int, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` on one rank, its result (frameworks' params use it)."""
        assert self._client is not None
        return self._client[self.ranks[rank].engine_id].apply_sync(function, *args)

    def boot_timelines(self) -> list[dict[str, float]]:
        """Each rank's boot phases as they are now (one round trip; the breakdown asks after the first cell)."""
        return [i["timeline"] for i in self.view().apply_sync(rankside.rank_info)]

    def stacks(self, native: bool = False, timeout: float = 60) -> list[rank_stacks.StackGroup]:
        """Every rank's Python stack (py-spy, from outside, so it works while ranks are blocked in C), identical
        ones grouped; ``native`` adds the C frames."""
        if not self.ranks or self.layout is None:
            raise HPCAIError("no engines are running", "start them: %hpc start")
        if ContainerLaunch.from_env(os.environ) is not None:
            raise rank_stacks.container_refusal()
        return rank_stacks.collect([(r.rank, r.host, r.pid) for r in self.ranks],
                                   LAUNCHERS[self.layout.launcher].on_nodes, native, timeout)

    # --- frameworks ---------------------------------------------------------------------------------------
    def preflight(self, framework: str) -> dict[int, dict[str, Any]]:
        """Check that every rank sees the same python and framework versions (gathered with the rank table);
        raise with a table when not."""
        names = ("python", "executable", *FRAMEWORKS[framework].distributions)
        found = {rank: {k: v.get(k) for k in names} for rank, v in self.versions.items()}
        reference = found[0]
        if any(v != reference for v in found.values()):
            rows = "\n".join(f"  rank {rank} ({self.ranks[rank].host}): {v}" for rank, v in sorted(found.items()))
            raise HPCAIError(f"the ranks do not see the same environment:\n{rows}",
                             "make the env reachable at the same path on every node (a shared filesystem), then %hpc restart")
        return found

    def _framework_setup(self, name: str) -> Callable[[], Any] | None:
        """What a cell's ranks run first so that ``name`` is initialised (None once it is)."""
        if self.framework == name:
            return None
        if name not in FRAMEWORKS:
            raise HPCAIError(f"unknown framework '{name}'", f"use one of: {', '.join(FRAMEWORKS)}")
        self.preflight(name)
        framework = FRAMEWORKS[name]
        params = framework.params(self) if framework.params else {}
        return partial(rankside.init_framework, framework, params)

    # --- the walltime ------------------------------------------------------------------------------------
    def checkpoint(self, directory: str | None = None, *, pending_only: bool = False, timeout: float | None = None,
                   write: Write | None = None) -> dict[int, dict[str, Any]]:
        """Run the ranks' walltime hooks (``hpc.on_walltime``) now, checkpoints going to ``directory`` if given;
        ``pending_only``: only if the walltime signal came and they did not run for it yet. Each rank's report."""
        call = "run_pending" if pending_only else "run_hooks"
        return self.run(f"{CONTINUITY}.{call}({directory!r})", framework=None, timeout=timeout, write=write)

    def restore(self, directory: str | None = None, write: Write | None = None) -> dict[int, dict[str, Any]]:
        """Every ``hpc.Checkpoint`` made on the ranks loads its latest save; each rank's report."""
        return self.run(f"{CONTINUITY}.restore_all({directory!r})", framework=None, write=write)

    # --- running cells ------------------------------------------------------------------------------------
    def run(self, code: str, *, framework: str | None = "horovod", timeout: float | None = None,
            output: str = "all", push: dict[str, Any] | None = None, write: Write | None = None,
            first_line: int = 1) -> dict[int, Any]:
        """Run ``code`` on every rank and return each rank's value of the cell's last expression.

        Guarantees: an exception on any rank shows every failing rank with its full traceback; a rank that
        dies is reported by rank and host and the rest of the world is stopped (the kernel lives on, `%hpc
        restart` brings the world back); a timeout names the ranks that were stuck; Ctrl-C interrupts every
        rank. ``first_line``: the number of the cell's first line as the user sees it, for tracebacks.
        """
        with self._running_cell:  # one cell at a time, whichever thread asks (the walltime guard's, say)
            return self._run(code, framework, timeout, output, push, write, first_line)

    def _run(self, code: str, framework: str | None, timeout: float | None, output: str,
             push: dict[str, Any] | None, write: Write | None, first_line: int) -> dict[int, Any]:
        if output not in OUTPUT_MODES:
            raise HPCAIError(f"unknown output mode '{output}'", f"use one of: {', '.join(OUTPUT_MODES)}")
        write = write or (lambda text: (sys.stdout.write(text), sys.stdout.flush()))
        if not self.running:
            self.start(framework=framework)
        setup = self._framework_setup(framework) if framework else None
        if setup is not None:  # its own request: a rank that dies in it died of the framework's init
            self._request("pass", 1, None, setup, timeout, "all", write, initialising=framework)
            self.framework = framework
        outcomes = self._request(code, first_line, push, None, timeout, output, write, initialising=None)
        failed = {rank: o for rank, o in outcomes.items() if not o["ok"]}
        if failed:
            write(self._tracebacks(failed))
            summary = ", ".join(f"{r} ({o['ename']}: {o['evalue'][:80]})" for r, o in sorted(failed.items()))
            raise RankFailure(f"{len(failed)} of {len(outcomes)} ranks failed: {summary}",
                              "the tracebacks above show each failing rank; the engines are still running", outcomes)
        return {rank: o["value"] for rank, o in outcomes.items()}

    def _request(self, code: str, first_line: int, push: dict[str, Any] | None, setup: Callable[[], Any] | None,
                 timeout: float | None, output: str, write: Write, initialising: str | None) -> dict[int, dict[str, Any]]:
        """One run_cell request to every rank, watched and streamed; each rank's outcome, by rank."""
        client = self._client
        assert client is not None
        ids = [r.engine_id for r in self.ranks]
        whole = client[ids].apply_async(rankside.run_cell, code, first_line, push, setup)  # one request, rank order
        streamer = Streamer(self.ranks, output, write)
        try:
            self._watch(whole, streamer, timeout, initialising)
        except KeyboardInterrupt:
            client.send_signal(signal.SIGINT, targets=ids, block=False)
            freed = whole.wait(10)
            streamer.feed(self._texts(whole), final=True)
            if not freed:  # blocked in C (a collective), where SIGINT waits
                write(f"some ranks are still busy after the interrupt; where each rank is:\n{self._where_stuck()}\n"
                      "%hpc restart frees them\n")
            raise
        whole.wait_for_output(10)  # a result can arrive before the last of its rank's output does
        streamer.feed(self._texts(whole), final=True)
        outcomes = dict(enumerate(whole.get()))
        failed = {rank: o for rank, o in outcomes.items() if o.get("setup")}
        if failed:
            raise HPCAIError(f"initialising {initialising} failed on the ranks:\n{self._tracebacks(failed)}",
                             "fix the cause above, then %hpc restart")
        return outcomes

    def _tracebacks(self, failed: dict[int, dict[str, Any]]) -> str:
        """Each failing rank's traceback under a line naming the rank, its host and the error."""
        return "".join(f"---- rank {rank} on {self.ranks[rank].host}: {o['ename']} ----\n{o['traceback']}"
                       for rank, o in sorted(failed.items()))

    def _where_stuck(self) -> str:
        """The ranks' grouped stacks for an error message, or why there are none."""
        try:
            return rank_stacks.render(self.stacks())
        except HPCAIError as err:
            return f"(no stacks: {err.message})"

    @staticmethod
    def _texts(whole: Any) -> Streams:
        """Each rank's stdout and stderr so far, by rank, from the AsyncResult's raw metadata (its ``stdout``
        attribute parses the metadata's dates with dateutil first: about 3 ms a cell on 4 ranks)."""
        return {rank: (md.get("stdout") or "", md.get("stderr") or "") for rank, md in enumerate(whole._metadata)}

    def _watch(self, whole: Any, streamer: Streamer, timeout: float | None, initialising: str | None) -> None:
        """Stream output until every rank is done; stop the world on a dead rank, a dead controller or the timeout.
        ``initialising``: the framework this cell initialises first (ranks that die then died of its init)."""
        deadline = time.monotonic() + timeout if timeout else None
        while True:
            done = whole.wait(0.1)
            if done and whole.successful():  # run_cell returns every outcome; only a rank's death fails it
                return
            streamer.feed(self._texts(whole))
            if not self.controller_alive():
                self.stop()
                raise RankFailure("the ipyparallel controller died, so the ranks can no longer be reached; they were "
                                  "stopped and the notebook kernel is fine", "bring the world back with %hpc restart")
            if dead := self.dead():
                streamer.feed(self._texts(whole), final=True)
                report = self.launcher_report()
                self.stop()
                who = ", ".join(f"rank {r.rank} on {r.host}" for r in dead)
                if initialising:  # e.g. MPI_Init aborting the process, in the rank's boot or in the cell's setup
                    raise HPCAIError(f"initialising {initialising} failed on the ranks: ranks died: {who}"
                                     + (f"\nthe launcher said:\n{report}" if report else ""),
                                     "fix the cause above, then %hpc restart")
                raise RankFailure(f"ranks died: {who}" + (f"\n{report}" if report else "")
                                  + "\nthe other ranks were stopped; the notebook kernel is fine",
                                  "bring the world back with %hpc restart, then run the cell again")
            if done:
                return  # failed otherwise: get() raises it
            if deadline and time.monotonic() > deadline:
                outstanding = self._client.outstanding if self._client else set()
                stuck = [rank for rank, msg_id in enumerate(whole.msg_ids) if msg_id in outstanding]
                streamer.feed(self._texts(whole), final=True)
                hosts = ", ".join(f"rank {r} on {self.ranks[r].host}" for r in stuck)
                where = self._where_stuck()
                self.stop()
                raise RankFailure(f"timed out after {timeout:g} s; still running: {hosts} "
                                  "(stuck, e.g. waiting in a collective for a rank that never joined). "
                                  f"Where each rank was:\n{where}\nThe engines were stopped",
                                  "bring the world back with %hpc restart")


def _exited(launcher: Any) -> bool:
    """Whether a launcher's process has ended (a zombie has). Asks the process: ipyparallel moves ``state`` to
    'after' from its event loop, which runs only during its own calls."""
    try:
        return launcher.process.status() == "zombie" or launcher.poll() is not None
    except Exception:  # psutil.NoSuchProcess: already reaped
        return True


def _output(launcher: Any) -> str:
    """All a launcher printed so far (its ``get_output`` caches the first read, so read the file while there)."""
    try:
        return Path(launcher.output_file).read_text(errors="replace")
    except (OSError, TypeError):
        return launcher.get_output(remove=False) or ""


_current: Engines | None = None


def current() -> Engines:
    """This kernel's engines (one set per kernel, shared by the magics and the widget)."""
    global _current
    if _current is None:
        _current = Engines(Allocation.current())
    return _current
