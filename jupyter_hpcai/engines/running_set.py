"""One engine set while it runs (in the kernel): its ipyparallel controller and engines, the client that reaches
them, the ranks as they reported themselves, and the set's folder (contract.py).

``RunningSet.prepare`` then ``launch`` start the controller and the ranks side by side: each rank imports and
initialises its framework (ranks/boot.py) while the controller starts and the engines register.
``RunningSet.attach`` takes over a set another kernel of the job started. Running cells on it is cells.py; the
kernel's handle is engines.py.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import ipyparallel as ipp
from traitlets.config import Config

from .. import network
from ..container_launch import ContainerLaunch
from ..contract import RANK_LOG, TELEMETRY, RankTable
from ..errors import HPCAIError
from ..proc import wait_until
from ..ranks import calls, telemetry
from ..ranks import stacks as rank_stacks
from ..ranks import world as rank_world
from ..ranks.frameworks import DISTRIBUTIONS, FRAMEWORKS, LAUNCH_VARS
from ..scheduler import chosen
from ..scheduler.allocation import Allocation
from . import listing
from .controller import command as tied_controller
from .launch import LAUNCHERS, Layout, RankSetLauncher
from .report import launcher_said

scheduler = chosen()
environment = chosen().environment

Progress = Callable[[int, int], None]  # (engines registered, engines wanted)
# Heartbeats every 250 ms (a new engine registers at the first beat it answers); 20 misses (5 s) before an
# engine counts as dead, as before.
CONTROLLER_ARGS = ["--HeartMonitor.period=250", "--HeartMonitor.max_heartmonitor_misses=20"]
_start_ids = itertools.count()
# a rank's task ended, as the scheduler's step says it and the local launcher
TASK_ENDED = re.compile(rf"^(?:{scheduler.TASK_ENDED}|hpcai-local: error: rank \d+): ", re.M)


@dataclass(frozen=True)
class Rank:
    """One engine as the user sees it (a contract.RankRow)."""

    rank: int
    host: str
    gpu: str
    pid: int
    engine_id: int
    addr: str = ""  # the node's address, which the other nodes reach
    alive: bool = True
    job: str = ""  # the Slurm job it runs in: the set's, or a grown one's (membership.py)


@dataclass(frozen=True)
class Grown:
    """A grown job (``%hpc grow``): the nodes it asked for and the ranks it brings."""

    nodes: int
    ranks: int


@dataclass
class Timeline:
    """When each phase of a start ended, in seconds after the start was asked for (the last rank's, for
    phases every rank goes through): what ``hpcai bench overhead --breakdown`` prints."""

    started: float = field(default_factory=time.time)
    phases: dict[str, float] = field(default_factory=dict)

    def mark(self, phase: str, at: float | None = None) -> None:
        self.phases[phase] = (time.time() if at is None else at) - self.started

    def ranks_reached(self, timelines: list[dict[str, float]]) -> None:
        """The ranks' own boot phases (ranks/boot.py), each at the last rank to end it."""
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
    first = scheduler.node_address(allocation.nodes[0])
    try:
        return network.source_address(first)
    except OSError as err:
        raise HPCAIError(f"this host has no route to the allocation's first node {allocation.nodes[0]} "
                         f"({first}): {err}", "set HPCAI_CONTROLLER_IP to this host's address on the nodes' network"
                         ) from None


def node_addresses(allocation: Allocation | None) -> dict[str, str]:
    """Every node's Slurm address, for the ranks to find their interface (network.py); none outside a job."""
    return scheduler.node_addresses(allocation.nodes) if allocation and allocation.nodes else {}


def command(layout: Layout, allocation: Allocation | None, folder: Path | None = None) -> list[str]:
    """The command that starts the ranks for ``layout`` (printable before anything starts)."""
    return LAUNCHERS[layout.launcher].command(layout, node_addresses(allocation), rank_logs=folder)


@dataclass
class RunningSet:
    """A started (or attached) engine set. ``framework``: initialised on every rank (cells.py sets it)."""

    cluster: ipp.Cluster
    client: ipp.Client | None  # None until the controller is up
    folder: Path
    layout: Layout
    warm: str | None  # initialised by the ranks as they booted
    telemetry_interval: float
    listens: str = ""  # this kernel's address toward the nodes: a started set's controller, a world's rendezvous
    connection_file: Path | None = None  # the file the ranks read the controller's address from
    ranks: list[Rank] = field(default_factory=list)
    versions: dict[int, dict[str, Any]] = field(default_factory=dict)
    framework: str | None = None
    timeline: Timeline | None = None
    grown: dict[str, Grown] = field(default_factory=dict)  # Slurm jobs grown (membership.py), by id
    removed: set[int] = field(default_factory=set)  # engine ids stopped or lost: never taken back
    changes: int = 0  # re-formings of the world since it started
    services: dict[str, Any] = field(default_factory=dict)  # kept for the world by its framework (a rendezvous)
    resting: str | None = None  # the framework initialised in the form that costs less while idle (rest.py)
    rest_request: Any = None  # the request that put it to rest, until a cell waits for it
    stopped: bool = False

    @classmethod
    def prepare(cls, allocation: Allocation | None, job: str, layout: Layout, warm: str | None, timeout: float,
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
                              controller_args=CONTROLLER_ARGS, send_engines_connection_env=False,
                              shutdown_atexit=goes_with_kernel)
        # the set's folder sits in the profile, which every node reads already (the connection file); the
        # command names it, so it is set once the cluster knows its profile
        folder = listing.create_set_folder(Path(cluster.profile_dir), cluster_id)
        cluster.config.RankSetLauncher.command = command(layout, allocation, folder)
        connection_file = Path(cluster.profile_dir) / "security" / f"ipcontroller-{cluster_id}-engine.json"
        self = cls(cluster, None, folder, layout, warm, telemetry_interval, listens,  # type: ignore[arg-type]
                   connection_file, timeline=Timeline())
        self.write_rank_table()  # owned from the start: another kernel's start leaves a starting set alone
        return self

    def launch(self, allocation: Allocation | None, timeout: float, progress: Progress | None) -> None:
        """Start the controller and the ranks side by side; return once every rank registered."""
        cluster, timeline = self.cluster, self.timeline
        assert timeline is not None
        cluster.start_controller_sync()
        timeline.mark("controller process started")
        # The ranks start now, beside the controller; each waits for the controller's file (ranks/boot.py).
        addresses = node_addresses(allocation)
        cluster.start_engines_sync(environment={
            network.NODE_ADDRS: network.encode_addresses(addresses), "HPCAI_WARM": self.warm or "",
            "HPCAI_CONNECTION_FILE": str(self.connection_file), "HPCAI_CONTROLLER_TIMEOUT": str(timeout),
            telemetry.FOLDER_VAR: str(self.folder), telemetry.INTERVAL_VAR: str(self.telemetry_interval),
            **self._frameworks_env(addresses.values())})
        timeline.mark("launcher started")
        listing.record_processes(cluster)
        try:
            self.client = cluster.connect_client_sync()
        except (RuntimeError, TimeoutError) as err:
            said = launcher_said(_output(cluster.controller)) if cluster.controller else ""
            raise self._cannot_listen(err, said) from None
        timeline.mark("controller up")
        registered = self._wait_for_engines(self.layout.n, timeout, progress)
        timeline.mark("all registered", max(registered.values()))
        rank_timelines, _ = self._read_ranks()
        self.write_rank_table()
        timeline.ranks_reached(rank_timelines)
        timeline.mark("rank table + preflight data")

    def _frameworks_env(self, addresses: Iterable[str]) -> dict[str, str]:
        """What the ranks need to initialise the env's frameworks in this world (a rendezvous the kernel holds,
        on the controller's address)."""
        counts = self.layout.counts
        env = dict.fromkeys(LAUNCH_VARS, "")
        for framework in FRAMEWORKS.values():
            if framework.launch_env and framework.installed():
                try:
                    env.update(framework.launch_env(self, counts, addresses))
                except OSError as err:
                    raise self._cannot_listen(err) from None
        return env

    def _cannot_listen(self, err: BaseException, said: str = "") -> HPCAIError:
        """The error for a controller (or a rendezvous beside it) that could not listen where it was told."""
        where = os.environ.get(environment.NODE_NAME) or "this host"
        return HPCAIError(f"the ipyparallel controller could not start on {where} (listening on {self.listens}): "
                          f"{err}" + (f"\nit said:\n{said}" if said else ""),
                          "check HPCAI_CONTROLLER_IP (an address of this node, or unset), then %hpc start again")

    @property
    def connected(self) -> ipp.Client:
        """The client, once the controller is up."""
        if self.client is None:
            raise HPCAIError("the engines are still starting", "wait for the start to end, or %hpc stop")
        return self.client

    @classmethod
    def attach(cls, allocation: Allocation | None, job: str, cluster_id: str | None, timeout: float) -> RunningSet:
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
        self = cls(cluster, client, found.folder, Layout(**found.table["layout"]), found.table.get("warm"),
                   found.table.get("telemetry_interval", telemetry.DEFAULT_INTERVAL), listens)
        _, frameworks = self._read_ranks()
        # initialised on every rank (and kept at rest, or not, alike)
        self.framework, self.resting = frameworks.pop() if len(frameworks) == 1 else (None, None)
        self.grown = {job: Grown(*counts) for job, counts in found.table.get("grown", {}).items()}
        self.changes = 1  # the launch's rendezvous (Horovod's) lived in the kernel that started the set
        self.write_rank_table(owners=listing.live_owners(found.table))
        return self

    def write_rank_table(self, owners: Sequence[int] = ()) -> None:
        """The rank table, this kernel among the set's owners (the kernels using it)."""
        table: RankTable = {
            "launcher": self.layout.launcher, "container": ContainerLaunch.from_env(os.environ) is not None,
            "ranks": [asdict(r) for r in self.ranks],  # type: ignore[misc]
            "owners": sorted({*owners, os.getpid()}), "layout": asdict(self.layout), "warm": self.warm,
            "telemetry_interval": self.telemetry_interval,
            "grown": {job: [g.nodes, g.ranks] for job, g in self.grown.items()}}
        listing.write_rank_table(self.folder, table)

    def _wait_for_engines(self, n: int, timeout: float, progress: Progress | None) -> dict[int, float]:
        """Until ``n`` engines registered; when each did (wall clock, as the kernel saw it)."""
        deadline = time.monotonic() + timeout
        seen: dict[int, float] = {}
        while True:
            self.connected.spin()
            for eid in self.connected.ids:
                seen.setdefault(eid, time.time())
            if len(seen) >= n:
                break
            if progress:
                progress(len(seen), n)
            if self._a_rank_exited():
                said = self.launcher_report(wait=0)
                raise HPCAIError(f"the engine launcher exited before {n} engines registered ({self.dialled()}):"
                                 f"\n{said}", "check the allocation (squeue), that the env runs on every node, and "
                                 "that the nodes reach that address (else set HPCAI_CONTROLLER_IP to one they reach)")
            if time.monotonic() > deadline:
                said = self.launcher_report(wait=0)
                raise HPCAIError(f"only {len(seen)} of {n} engines registered within {timeout:g} s ({self.dialled()})"
                                 + (f"; the launcher and the ranks said:\n{said}" if said else ""),
                                 "the nodes may be slow to start python (try again with a longer timeout), or may not "
                                 "reach that address (set HPCAI_CONTROLLER_IP to one they reach)")
            time.sleep(0.02)
        if progress:
            progress(n, n)
        return seen

    def _a_rank_exited(self) -> bool:
        """The launcher ended, or (srun and the local launcher leave the other ranks running) said that a rank's
        task ended."""
        launchers = list(self.cluster.engines.values())
        return any(_exited(ln) for ln in launchers) or any(TASK_ENDED.search(_output(ln)) for ln in launchers)

    def dialled(self) -> str:
        """Where the controller listens and the address the ranks dial (from the connection file they read)."""
        try:
            info = json.loads(self.connection_file.read_text()) if self.connection_file else {}
            dial = f"{info['interface']}:{info['registration']}"
        except (OSError, ValueError, KeyError):
            dial = "(no connection file yet)"
        return f"the controller listens on {self.listens}; the ranks dial {dial}"

    def _read_ranks(self) -> tuple[list[dict[str, float]], set[tuple[str | None, str | None]]]:
        """One round trip: who each engine is and the versions the preflight compares (kept), each rank's boot
        timeline and the frameworks the ranks initialised, each with the one it keeps at rest (returned)."""
        ids = list(self.connected.ids)
        infos = self.connected[ids].apply_sync(calls.rank_info, list(DISTRIBUTIONS))
        ranks = sorted(((Rank(i["rank"], i["host"], i["gpu"], i["pid"], eid, i["addr"], job=i["job"]), i)
                        for eid, i in zip(ids, infos)), key=lambda pair: (pair[0].rank, pair[0].engine_id))
        if [r.rank for r, _ in ranks] != list(range(len(ranks))):  # no MPI rank (local launcher without MPI)
            ranks = [(replace(r, rank=k), i) for k, (r, i) in enumerate(ranks)]
        self.ranks, self.versions = [r for r, _ in ranks], {r.rank: i["versions"] for r, i in ranks}
        return [i["timeline"] for _, i in ranks], {(i["framework"], i["resting"]) for _, i in ranks}

    # --- who is in the world (membership.py decides; these change the set) ---------------------------------------
    def ranks_of(self, job: str) -> list[Rank]:
        return [r for r in self.ranks if r.job == job]

    def joined(self) -> list[int]:
        """Engines registered that are not ranks of the world, and were never stopped by it (a grown job's)."""
        self.connected.spin()
        known = {r.engine_id for r in self.ranks} | self.removed
        return sorted(set(self.connected.ids) - known)

    def identify(self, engine_ids: list[int]) -> dict[int, dict[str, Any]]:
        """What each engine says it is (calls.rank_info), by engine id."""
        infos = self.connected[engine_ids].apply_sync(calls.rank_info, list(DISTRIBUTIONS))
        return dict(zip(engine_ids, infos))

    def adopt(self, infos: dict[int, dict[str, Any]]) -> None:
        """Engines that joined (``identify``'s answers) become ranks after the world's, in their own order, and
        the world re-forms."""
        new = sorted((Rank(i["rank"], i["host"], i["gpu"], i["pid"], eid, i["addr"], job=i["job"])
                      for eid, i in infos.items()), key=lambda r: (r.rank, r.engine_id))
        versions = {**{r.engine_id: self.versions[r.rank] for r in self.ranks},
                    **{eid: i["versions"] for eid, i in infos.items()}}
        self.reform([*self.ranks, *new], versions)

    def remove(self, ranks: list[Rank]) -> None:
        """Stop ``ranks``' engines and re-form the world on the others."""
        self.rested()  # not in the middle of a rest's rendezvous, which the survivors would wait in
        gone = {r.engine_id for r in ranks}
        self.removed |= gone  # they may still look registered for a moment: never taken back (joined)
        # Not block=True: ipyparallel then waits for each engine's reply without a timeout, and an engine that exits
        # as it answers can lose it (a shrink waited 5 minutes, under load). Its leaving the controller is the sign.
        self.connected.shutdown(targets=sorted(gone), block=False)
        wait_until(lambda: not gone & set(self.connected.ids), timeout=60, what=f"{len(gone)} engine(s) to stop",
                   hint="the world may be half re-formed: %hpc restart")
        self.reform([r for r in self.ranks if r.engine_id not in gone])

    def drop(self, ranks: list[Rank]) -> None:
        """Ranks that died leave the world; it re-forms on the survivors."""
        gone = {r.engine_id for r in ranks}
        self.removed |= gone
        self.reform([r for r in self.ranks if r.engine_id not in gone])

    def reform(self, ranks: list[Rank], versions: dict[int, dict[str, Any]] | None = None) -> None:
        """``ranks`` (in this order) become the world: numbered 0..n-1, each told its place (ranks/world.py), the
        framework left to the next cell to initialise again. A rank that does not take its place leaves the
        world unusable: the error says to restart it."""
        self.rested()
        by_engine = versions or {r.engine_id: self.versions[r.rank] for r in ranks}
        hosts = [r.host for r in ranks]
        renumbered = [replace(r, rank=k) for k, r in enumerate(ranks)]
        self.framework, self.changes = None, self.changes + 1  # whatever happens next, the old world is gone
        self.resting = None
        told = [self.connected[r.engine_id].apply_async(
            rank_world.assign, r.rank, len(ranks), hosts[:r.rank].count(r.host), hosts.count(r.host))
            for r in renumbered]
        try:
            for call in told:
                call.get(timeout=30)
        except Exception as err:
            raise HPCAIError(f"the world could not re-form on {len(ranks)} ranks: {err}",
                             "start it again: %hpc restart") from None
        self.ranks, self.versions = renumbered, {r.rank: by_engine[r.engine_id] for r in renumbered}
        for stale in self.folder.glob(TELEMETRY.format(rank="*")):  # the samples of ranks no longer in the world
            number = stale.stem.rpartition("-")[2]
            if number.isdigit() and int(number) >= len(ranks):
                stale.unlink(missing_ok=True)
        self.write_rank_table()

    def stop(self) -> None:
        """Stop the engines and the controller, and remove the set's folder."""
        self.stopped = True  # no rest starts a service now
        if self.client is not None:
            self.client.close()
        for service in list(self.services.values()):
            service.shutdown()
            service.server_close()
        try:
            self.cluster.stop_cluster_sync()
        except Exception:  # engines that died already (or never started); the controller still goes
            self.cluster.stop_controller_sync()
        listing.forget_processes(self.cluster.cluster_id)
        self.remove_folder()

    def remove_folder(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    # --- rest (rest.py decides when) -------------------------------------------------------------------------
    def rest(self) -> bool:
        """Initialise the world's framework again in the form that costs less while idle, if it has one (sent, not
        waited for: each rank runs it before any later request); whether it did. Not while a request of this
        kernel's is outstanding (a %%px), nor in a set another kernel uses too. The next cell wakes the world."""
        framework = FRAMEWORKS.get(self.framework or "")
        if (self.resting or self.stopped or framework is None or framework.rest is None or self.connected.outstanding
                or self._shared()):
            return False
        params = framework.rest(self)
        if params is None:
            return False
        self.rest_request = self.view().apply_async(calls.init_framework, framework, params, True)
        self.resting = framework.name
        return True

    def _shared(self) -> bool:
        """Whether another live kernel uses this set (its cells would not know of the rest)."""
        table = listing.read_rank_table(self.folder)
        return table is not None and set(listing.live_owners(table)) - {os.getpid()} != set()

    def rested(self, timeout: float = 60) -> bool:
        """Wait until the ranks are at rest, before a cell wakes them (waking resets the rendezvous that resting
        uses) or the world re-forms; whether the rest worked. A rest that failed stays marked: the wake initialises
        the framework again in full."""
        request = self.rest_request
        if request is None:
            return True
        if not request.wait(timeout):
            raise HPCAIError(f"the engines are still busy with an earlier request after {timeout:g} s (the idle "
                             "world's rest waits behind it)", "wait for it to end (a %%px --noblock job?), or "
                             "%hpc restart")
        self.rest_request = None
        if not request.successful():
            print(f"hpcai: the idle world could not rest ({request.exception()}); the next cell that uses "
                  f"{self.resting} initialises it again", file=sys.__stderr__, flush=True)
        return bool(request.successful())

    # --- what the ranks are doing -------------------------------------------------------------------------
    def status(self) -> list[Rank]:
        """The ranks, each marked alive or not (an engine the controller lost is not alive)."""
        self.connected.spin()
        alive = set(self.connected.ids)
        return [replace(r, alive=r.engine_id in alive) for r in self.ranks]

    def dead(self) -> list[Rank]:
        return [r for r in self.status() if not r.alive]

    def controller_alive(self) -> bool:
        """True while the controller process (it runs beside the kernel) is there."""
        controller = self.cluster.controller
        return bool(controller and controller.state == "running") and not _exited(controller)

    def launcher_report(self, wait: float = 10) -> str:
        """After ranks died: what the launcher printed, once it has exited (waiting at most ``wait`` s), cut down
        to the part that names the cause (report.launcher_said): what ranks wrote before dying (Open MPI's error
        blocks whole, once for all the ranks that printed them) and srun's word on dead tasks."""
        launchers = list(self.cluster.engines.values())
        try:
            wait_until(lambda: all(_exited(ln) for ln in launchers), timeout=wait, what="the launcher to exit")
        except HPCAIError:
            pass  # report what it said so far
        ranks = sorted(self.folder.glob(RANK_LOG.format(rank="*")))
        return launcher_said("\n".join([*map(_output, launchers), *(p.read_text(errors="replace") for p in ranks)]))

    def view(self) -> ipp.DirectView:
        """A DirectView on the ranks, in rank order (for %%px and ipyparallel's own API)."""
        return self.connected[[r.engine_id for r in self.ranks]]

    def call(self, rank: int, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` on one rank, its result (frameworks' params use it)."""
        return self.connected[self.ranks[rank].engine_id].apply_sync(function, *args)

    def boot_timelines(self) -> list[dict[str, float]]:
        """Each rank's boot phases as they are now (one round trip; the breakdown asks after the first cell)."""
        return [i["timeline"] for i in self.view().apply_sync(calls.rank_info)]

    def stacks(self, native: bool = False, timeout: float = 60) -> list[rank_stacks.StackGroup]:
        """Every rank's Python stack (py-spy, from outside, so it works while ranks are blocked in C), identical
        ones grouped; ``native`` adds the C frames."""
        if ContainerLaunch.from_env(os.environ) is not None:
            raise rank_stacks.container_refusal()
        return rank_stacks.collect([(r.rank, r.host, r.pid) for r in self.ranks],
                                   LAUNCHERS[self.layout.launcher].on_nodes, native, timeout)

    def set_telemetry(self, interval: float) -> None:
        """Sample every ``interval`` seconds on every rank from now on (0: off), the ranks staying as they are."""
        self.view().apply_sync(telemetry.set_interval, telemetry.checked_interval(interval))
        self.telemetry_interval = interval

    def samples(self) -> list[telemetry.Sample]:
        """Every rank's latest telemetry (read from the set's folder: nothing asks the ranks)."""
        return telemetry.read(self.folder)


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
