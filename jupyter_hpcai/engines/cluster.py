"""The engines of a kernel: an ipyparallel cluster whose engines are this allocation's ranks.

One controller runs beside the kernel, bound to the address Slurm uses for this node (never all
interfaces); the engines are launched as one set (see launch.py). Cluster files live where
ipyparallel keeps them (the IPython profile's security/ folder, private to the user), so the
server extension can list them without a registry of its own.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import ipyparallel as ipp
from traitlets.config import Config

from .. import slurm
from ..allocation import Allocation
from ..errors import HPCAIError
from ..proc import wait_until
from . import rankside
from .frameworks import FRAMEWORKS
from .launch import Layout, launcher_config, plan
from .report import launcher_said

Progress = Callable[[int, int], None]  # (engines registered, engines wanted)


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


def controller_ip(allocation: Allocation | None) -> str:
    """Where the controller listens: ``HPCAI_CONTROLLER_IP``, else this node's Slurm address, else loopback."""
    if os.environ.get("HPCAI_CONTROLLER_IP"):
        return os.environ["HPCAI_CONTROLLER_IP"]
    node = os.environ.get("SLURMD_NODENAME")
    if allocation is None or not node:
        return "127.0.0.1"
    return slurm.node_address(node)


class Engines:
    """Start, stop, restart and inspect this kernel's engines (one per rank)."""

    def __init__(self, allocation: Allocation | None = None) -> None:
        self.allocation = allocation
        self.layout: Layout | None = None
        self.cluster: ipp.Cluster | None = None
        self.client: ipp.Client | None = None
        self.ranks: list[Rank] = []
        self.framework: str | None = None

    @property
    def running(self) -> bool:
        return self.client is not None

    def start(self, *, n: int | None = None, nodes: int | None = None, gpus_per_node: int | None = None,
              launcher: str | None = None, timeout: float = 180, progress: Progress | None = None) -> list[Rank]:
        """Start the engines (stopping any running ones first) and return the ranks, in rank order."""
        layout = plan(self.allocation, n=n, nodes=nodes, gpus_per_node=gpus_per_node, launcher=launcher)
        if self.running:
            self.stop()
        launcher_class, traits = launcher_config(layout, self._node_addresses())
        config = Config()
        for key, value in traits.items():
            setattr(config[launcher_class.__name__], key, value)
        job = self.allocation.job_id if self.allocation else "local"
        self.cluster = ipp.Cluster(
            n=layout.n, engine_launcher_class=launcher_class, controller_ip=controller_ip(self.allocation),
            cluster_id=f"hpcai-{job}-{os.getpid()}", config=config, engine_timeout=int(timeout), log_level=40,
            controller_args=["--HeartMonitor.period=1000", "--HeartMonitor.max_heartmonitor_misses=5"],
        )
        self.layout = layout
        try:
            self.cluster.start_cluster_sync()
            self.client = self.cluster.connect_client_sync()
            self._wait_for_engines(layout.n, timeout, progress)
            self.ranks = self._rank_table()
        except BaseException:
            self.stop()
            raise
        return self.ranks

    def _node_addresses(self) -> dict[str, str]:
        """Every node's Slurm address, for the ranks to find their interface (network.py); none outside a job."""
        return slurm.node_addresses(self.allocation.nodes) if self.allocation and self.allocation.nodes else {}

    def _wait_for_engines(self, n: int, timeout: float, progress: Progress | None) -> None:
        assert self.client is not None and self.cluster is not None
        deadline = time.monotonic() + timeout
        while len(self.client.ids) < n:
            if progress:
                progress(len(self.client.ids), n)
            if any(_exited(launcher) for launcher in self.cluster.engines.values()):
                said = self.launcher_report(wait=0)
                raise HPCAIError(f"the engine launcher exited before {n} engines registered:\n{said}",
                                 "check the allocation (squeue) and that the env runs on every node")
            if time.monotonic() > deadline:
                raise HPCAIError(f"only {len(self.client.ids)} of {n} engines registered within {timeout:g} s",
                                 "the nodes may be slow to start python; try again with a longer timeout")
            self.client.spin()
            time.sleep(0.1)
        if progress:
            progress(n, n)

    def _rank_table(self) -> list[Rank]:
        assert self.client is not None
        infos = self.client[:].apply_sync(rankside.rank_info)
        ranks = [Rank(i["rank"], i["host"], i["gpu"], i["pid"], eid, i["addr"])
                 for eid, i in zip(self.client.ids, infos)]
        ranks.sort(key=lambda r: (r.rank, r.engine_id))
        if [r.rank for r in ranks] != list(range(len(ranks))):  # no MPI rank (local launcher without MPI)
            ranks = [Rank(i, r.host, r.gpu, r.pid, r.engine_id, r.addr) for i, r in enumerate(ranks)]
        return ranks

    def status(self) -> list[Rank]:
        """The ranks, each marked alive or not (an engine the controller lost is not alive)."""
        if self.client is None:
            return []
        self.client.spin()
        alive = set(self.client.ids)
        return [Rank(**{**asdict(r), "alive": r.engine_id in alive}) for r in self.ranks]

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
        return launcher_said("\n".join(_output(launcher) for launcher in launchers))

    def stop(self) -> None:
        """Stop the engines and the controller. Harmless when nothing runs."""
        client, cluster = self.client, self.cluster
        self.client = self.cluster = None
        self.ranks, self.framework = [], None
        if client is not None:
            client.close()
        if cluster is not None:
            try:
                cluster.stop_cluster_sync()
            except Exception:  # engines that died already; the controller still goes
                cluster.stop_controller_sync()

    def restart(self, *, timeout: float = 180, progress: Progress | None = None) -> list[Rank]:
        """Stop everything and start the same layout again (frameworks are initialised again on next use)."""
        if self.layout is None:
            raise HPCAIError("no engines were started in this kernel", "start them first: %hpc start")
        layout = self.layout
        return self.start(n=layout.n, nodes=layout.nodes, gpus_per_node=layout.per_node, launcher=layout.launcher,
                          timeout=timeout, progress=progress)

    def view(self) -> ipp.DirectView:
        if self.client is None:
            raise HPCAIError("no engines are running", "start them: %hpc start")
        return self.client[[r.engine_id for r in self.ranks]]

    def init_framework(self, name: str) -> None:
        """Initialise ``name`` on every rank, once per engine set."""
        if self.framework == name:
            return
        self.preflight(name)
        framework = FRAMEWORKS[name]
        params = framework.params(self)
        try:
            self.view().apply_sync(rankside.init_framework, name, params)
        except ipp.error.CompositeError as err:
            died = any(ename == "EngineError" for ename, *_ in err.elist)
            said = self.launcher_report() if died else ""
            raise HPCAIError(f"initialising {name} failed on the ranks:\n{_first_lines(err)}"
                             + (f"\nthe launcher said:\n{said}" if said else ""),
                             "fix the cause above, then %hpc restart") from None
        self.framework = name

    def preflight(self, framework: str) -> dict[int, dict[str, Any]]:
        """Check that every rank sees the same python and framework versions; raise with a table when not."""
        found = dict(zip((r.rank for r in self.ranks),
                         self.view().apply_sync(rankside.versions, list(FRAMEWORKS[framework].distributions))))
        reference = found[0]
        differ = {rank: v for rank, v in found.items() if v != reference}
        if differ:
            rows = "\n".join(f"  rank {rank} ({self.ranks[rank].host}): {v}" for rank, v in sorted(found.items()))
            raise HPCAIError(f"the ranks do not see the same environment:\n{rows}",
                             "make the env reachable at the same path on every node (a shared filesystem), then %hpc restart")
        return found


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


def _first_lines(err: Exception, limit: int = 8) -> str:
    return "\n".join(str(err).splitlines()[:limit])


_current: Engines | None = None


def current() -> Engines:
    """This kernel's engines (one set per kernel, shared by the magics and the widget)."""
    global _current
    if _current is None:
        _current = Engines(Allocation.current())
    return _current
