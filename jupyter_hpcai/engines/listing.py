"""The engine sets this user's kernels started, for the server extension (the side panel).

Each set has a private folder in the ipyparallel profile it runs in, ``<profile>/hpcai-ranks/<cluster id>/``
(mode 700; every node reads the profile already, for the controller's connection file, so the ranks can
write there wherever they run), made by the kernel's ``Engines`` at start and removed at stop: each rank's
output (``rank-N.log``), its telemetry (``telemetry-N.json``, telemetry.py) and the rank table
(``ranks.json``: who each rank is, the launcher). The controller's state comes from ipyparallel's own
cluster files.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..allocation import JOB_STATE_VAR
from ..errors import HPCAIError
from . import telemetry

RANK_TABLE = "ranks.json"
PROCESSES = "engines"  # in the job's private folder: one file per set, the pids the batch shell stops at its exit
SET_ID = re.compile(r"hpcai-[\w.-]+")  # Engines' cluster ids: never a path


def set_folder(profile_dir: Path, cluster_id: str) -> Path:
    return profile_dir / "hpcai-ranks" / cluster_id


def create_set_folder(profile_dir: Path, cluster_id: str) -> Path:
    """The set's folder and its missing parents, readable by this user only."""
    path = set_folder(profile_dir, cluster_id)
    for folder in reversed([path, *path.parents]):
        if not folder.exists():
            folder.mkdir(mode=0o700)
    return path


def write_rank_table(folder: Path, launcher: str, ranks: list[dict[str, Any]], container: bool,
                     **state: Any) -> None:
    """Who each rank is (rank, host, gpu, pid, engine_id), and what a kernel attaching needs (``state``: the
    pids of the kernels using the set, the layout, the framework started at boot, the telemetry interval),
    written whole."""
    partial = folder / f".{RANK_TABLE}"
    partial.write_text(json.dumps({"launcher": launcher, "container": container, "ranks": ranks, **state}))
    os.replace(partial, folder / RANK_TABLE)


def read_rank_table(folder: Path) -> dict[str, Any] | None:
    """A set's rank table, or None before its ranks registered (or after it stopped)."""
    try:
        return json.loads((folder / RANK_TABLE).read_text())
    except (OSError, ValueError):
        return None


def owner_alive(table: dict[str, Any]) -> bool:
    """Whether a kernel that started or attached to a set is still running (kernels run on the job's first node,
    as does every caller: the server and the other kernels)."""
    return any(_running(pid) for pid in table.get("owners", []) if isinstance(pid, int) and pid > 0)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or someone else's process now: not our kernel
        return False
    return True


@dataclass
class EngineSet:
    """A set of this user's, as its cluster file and rank table describe it."""

    cluster: Any  # ipp.Cluster, loaded from its file (stopping it stops the controller and the ranks)
    table: dict[str, Any]  # its rank table ({} before its ranks registered)

    @property
    def cluster_id(self) -> str:
        return str(self.cluster.cluster_id)

    @property
    def running(self) -> bool:
        return bool(self.cluster.controller and self.cluster.controller.state == "running")

    @property
    def attached(self) -> bool:
        return owner_alive(self.table)

    @property
    def n(self) -> int:
        return len(self.table.get("ranks", []))


def job_sets(job: str) -> list[EngineSet]:
    """The sets started in Slurm job ``job`` ("local" outside Slurm), oldest first."""
    found = [EngineSet(c, read_rank_table(set_folder(Path(c.profile_dir), c.cluster_id)) or {})
             for c in _hpcai_clusters().values() if c.cluster_id.startswith(f"hpcai-{job}-")]
    return sorted(found, key=lambda s: s.cluster_id)


def stop_set(engine_set: EngineSet) -> None:
    """Stop a set's ranks and controller; its folder, cluster file and job-end record go with it."""
    cluster = engine_set.cluster
    try:
        cluster.stop_cluster_sync()
    except Exception:  # ranks that died already; the controller still goes
        if cluster.controller:
            cluster.stop_controller_sync()
    cluster.remove_cluster_file()
    shutil.rmtree(set_folder(Path(cluster.profile_dir), cluster.cluster_id), ignore_errors=True)
    forget_processes(cluster.cluster_id)


def stop_detached(job: str) -> list[EngineSet]:
    """Stop the sets of ``job`` that no running kernel uses (their kernel restarted or died); the ones stopped."""
    detached = [s for s in job_sets(job) if not s.attached]
    for engine_set in detached:
        stop_set(engine_set)
    return detached


def attachable(job: str, cluster_id: str | None = None) -> EngineSet:
    """The running set a kernel attaches to: ``cluster_id``, else the only one no kernel uses, else the only one."""
    running = [s for s in job_sets(job) if s.running and s.table.get("ranks")]
    listed = "; ".join(f"{s.cluster_id} ({s.n} ranks, {'in use by a kernel' if s.attached else 'no kernel'})"
                       for s in running)
    if cluster_id is not None:
        chosen = [s for s in running if s.cluster_id == cluster_id]
        if not chosen:
            raise HPCAIError(f"no running engine set '{cluster_id}' in this job",
                             f"running: {listed}" if listed else "start engines with %hpc start")
        return chosen[0]
    if not running:
        raise HPCAIError("no engines are running in this job to attach to", "start them with %hpc start")
    detached = [s for s in running if not s.attached]
    candidates = detached or running
    if len(candidates) > 1:
        raise HPCAIError(f"{len(candidates)} engine sets could be attached to: {listed}",
                         "name one: %hpc attach CLUSTER_ID")
    return candidates[0]


def record_processes(cluster: Any) -> None:
    """Note the controller's and the launchers' pids in the job's private folder: they run in sessions of their
    own (ipyparallel starts them so) and outlive their kernel, and the batch shell's exit stops them (a process
    whose parent died is no longer the job's to Slurm's process tracking)."""
    state = os.environ.get(JOB_STATE_VAR)
    if not state or not Path(state).is_dir():
        return
    pids = [launcher.pid for launcher in (cluster.controller, *cluster.engines.values()) if launcher and launcher.pid]
    folder = Path(state) / PROCESSES
    folder.mkdir(mode=0o700, exist_ok=True)
    (folder / cluster.cluster_id).write_text(" ".join(map(str, pids)) + "\n")


def forget_processes(cluster_id: str) -> None:
    state = os.environ.get(JOB_STATE_VAR)
    if state and SET_ID.fullmatch(cluster_id):
        (Path(state) / PROCESSES / cluster_id).unlink(missing_ok=True)


def _hpcai_clusters() -> dict[str, Any]:
    """This user's engine sets as ipyparallel knows them, by cluster id."""
    import ipyparallel as ipp

    clusters = ipp.ClusterManager().load_clusters().values()
    return {c.cluster_id: c for c in clusters if SET_ID.fullmatch(c.cluster_id)}


def stacks(cluster_id: str, native: bool = False) -> list[dict[str, Any]]:
    """A running set's grouped stacks (stacks.py), for the side panel's button: each group's ranks, headline
    and frames as text."""
    from .launch import LAUNCHERS
    from .stacks import collect, container_refusal

    cluster = _hpcai_clusters().get(cluster_id)
    table = read_rank_table(set_folder(Path(cluster.profile_dir), cluster_id)) if cluster else None
    if table is None:
        raise HPCAIError(f"no running engine set '{cluster_id}'", "start the engines in a notebook: %hpc start")
    if table["container"]:
        raise container_refusal()
    ranks = [(r["rank"], r["host"], r["pid"]) for r in table["ranks"]]
    groups = collect(ranks, LAUNCHERS[table["launcher"]].on_nodes, native)
    return [{"ranks": list(g.ranks), "headline": g.headline(len(ranks)), "text": g.render(len(ranks))} for g in groups]


def list_engine_sets(job: str | None = None, connect_timeout: float = 2.0) -> list[dict[str, Any]]:
    """Each hpcai engine set (of Slurm job ``job`` only, if given): cluster id, engines asked for and registered,
    launcher, controller state, whether a kernel uses it, and each rank (rank, host, GPU, pid, alive) with its
    latest telemetry."""
    sets = []
    for cluster in _hpcai_clusters().values():
        if job is not None and not cluster.cluster_id.startswith(f"hpcai-{job}-"):
            continue
        asked = sum(es.n or 0 for es in cluster.engines.values())
        registered: set[int] = set()
        controller_running = bool(cluster.controller and cluster.controller.state == "running")
        if controller_running:
            try:
                client = cluster.connect_client_sync(timeout=connect_timeout)
                registered = set(client.ids)
                client.close()
            except Exception:  # a controller that stopped answering counts as not running
                controller_running = False
        folder = set_folder(Path(cluster.profile_dir), cluster.cluster_id)
        table = read_rank_table(folder) or {}
        samples = {row["rank"]: row for row in telemetry.summary(telemetry.read(folder))}
        ranks = [{**rank, "alive": controller_running and rank["engine_id"] in registered,
                  "telemetry": samples.get(rank["rank"])} for rank in table.get("ranks", [])]
        launcher = next(iter(cluster.engines.values()), None)
        sets.append({"cluster_id": cluster.cluster_id, "engines": asked, "registered": len(registered),
                     "launcher": (getattr(launcher, "launcher", "") or type(launcher).__name__) if launcher else None,
                     "state": "running" if controller_running and registered else "stopped",
                     "attached": owner_alive(table), "ranks": ranks})
    return sets
