"""One engine set while it runs (in the kernel): its ipyparallel controller and engines, the client that reaches
them, the ranks as they reported themselves, and the set's folder (contract.py).

A set is started or attached by startup.py; then the world re-forms on other ranks here (membership.py decides
who), rests while idle (rest.py decides when), and says what its ranks are doing. Running cells on it is cells.py;
the kernel's handle is engines.py.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import ipyparallel as ipp

from .. import network
from ..container_launch import ContainerLaunch
from ..contract import RANK_LOG, TELEMETRY, RankTable
from ..errors import HPCAIError
from ..proc import wait_until
from ..ranks import calls, telemetry
from ..ranks import stacks as rank_stacks
from ..ranks import world as rank_world
from ..ranks.frameworks import DISTRIBUTIONS, FRAMEWORKS
from ..scheduler import chosen
from ..scheduler.allocation import Allocation
from . import listing
from .launch import LAUNCHERS, Layout
from .report import exited, launcher_said, printed

scheduler = chosen()


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


@dataclass
class RunningSet:
    """A started (or attached: startup.py) engine set. ``framework``: initialised on every rank (cells.py sets it)."""

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

    @property
    def connected(self) -> ipp.Client:
        """The client, once the controller is up."""
        if self.client is None:
            raise HPCAIError("the engines are still starting", "wait for the start to end, or %hpc stop")
        return self.client

    def write_rank_table(self, owners: Sequence[int] = ()) -> None:
        """The rank table, this kernel among the set's owners (the kernels using it)."""
        table: RankTable = {
            "launcher": self.layout.launcher, "container": ContainerLaunch.from_env(os.environ) is not None,
            "ranks": [asdict(r) for r in self.ranks],  # type: ignore[misc]
            "owners": sorted({*owners, os.getpid()}), "layout": asdict(self.layout), "warm": self.warm,
            "telemetry_interval": self.telemetry_interval,
            "grown": {job: [g.nodes, g.ranks] for job, g in self.grown.items()}}
        listing.write_rank_table(self.folder, table)

    def read_ranks(self) -> tuple[list[dict[str, float]], set[tuple[str | None, str | None]]]:
        """One round trip: who each engine is and the versions the preflight compares (kept), each rank's boot
        timeline and the frameworks the ranks initialised, each with the one it keeps at rest (returned)."""
        ids = list(self.connected.ids)
        infos = self.connected[ids].apply_sync(calls.join, list(DISTRIBUTIONS))
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
        """What each engine says it is (calls.join), by engine id."""
        infos = self.connected[engine_ids].apply_sync(calls.join, list(DISTRIBUTIONS))
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
        point_px_at(self)

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
        return bool(controller and controller.state == "running") and not exited(controller)

    def launcher_report(self, wait: float = 10) -> str:
        """After ranks died: what the launcher printed, once it has exited (waiting at most ``wait`` s), cut down
        to the part that names the cause (report.launcher_said): what ranks wrote before dying (Open MPI's error
        blocks whole, once for all the ranks that printed them) and srun's word on dead tasks."""
        launchers = list(self.cluster.engines.values())
        try:
            wait_until(lambda: all(exited(ln) for ln in launchers), timeout=wait, what="the launcher to exit")
        except HPCAIError:
            pass  # report what it said so far
        ranks = sorted(self.folder.glob(RANK_LOG.format(rank="*")))
        return launcher_said("\n".join([*map(printed, launchers), *(p.read_text(errors="replace") for p in ranks)]))

    def view(self) -> ipp.DirectView:
        """A DirectView on the ranks, in rank order (for %%px and ipyparallel's own API)."""
        return self.connected[[r.engine_id for r in self.ranks]]

    def broadcast(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` on every rank as one request (the controller's broadcast scheduler fans it out), each
        rank's reply and output apart, in rank order: the kernel's cost to send no longer grows with N. Its
        AsyncResult."""
        view = self.connected.broadcast_view(targets=[r.engine_id for r in self.ranks], is_coalescing=False)
        result = view.apply_async(function, *args)
        # ipyparallel 9 leaves the request's own id outstanding for ever (the replies come under one id per rank):
        # the client would never look idle (rest() asks it)
        self.connected.outstanding.discard(result.msg_ids[0].rsplit("_", 1)[0])
        return result

    def call(self, rank: int, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` on one rank, its result (frameworks' params use it)."""
        return self.connected[self.ranks[rank].engine_id].apply_sync(function, *args)

    def boot_timelines(self) -> list[dict[str, float]]:
        """Each rank's boot phases as they are now (one round trip; the breakdown asks after the first cell)."""
        return [i["timeline"] for i in self.view().apply_sync(calls.rank_info)]

    def stacks(self, native: bool = False, timeout: float = 60, source: str | None = None
               ) -> list[rank_stacks.StackGroup]:
        """Every rank's Python stack (py-spy, from outside, so it works while ranks are blocked in C; else each
        rank's own thread: ``source``, stacks.py), identical ones grouped; ``native`` adds the C frames."""
        source = rank_stacks.source(ContainerLaunch.from_env(os.environ) is not None, source, native)
        return rank_stacks.collect([(r.rank, r.host, r.pid) for r in self.ranks],
                                   LAUNCHERS[self.layout.launcher].on_nodes, self.folder, native, timeout, source)

    def set_telemetry(self, interval: float) -> None:
        """Sample every ``interval`` seconds on every rank from now on (0: off), the ranks staying as they are."""
        self.view().apply_sync(telemetry.set_interval, telemetry.checked_interval(interval))
        self.telemetry_interval = interval

    def samples(self) -> list[telemetry.Sample]:
        """Every rank's latest telemetry (read from the set's folder: nothing asks the ranks)."""
        return telemetry.read(self.folder)


def point_px_at(world: RunningSet) -> None:
    """``%px`` and ``%%px`` run on ``world``'s ranks, in rank order, blocking: ipyparallel points them at the first
    client of a kernel only, which a restart closes ("Client cannot be used after its sockets have been closed")."""
    from IPython import get_ipython

    if get_ipython() is not None:
        view = world.view()
        view.block = True
        view.activate()
