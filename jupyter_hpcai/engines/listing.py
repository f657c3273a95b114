"""The engine sets this user's kernels started, for the server extension (the side panel).

Each set has a private folder in the ipyparallel profile it runs in (its layout and the rank table's format are
in contract.py), made by the kernel at start and removed at stop. The controller's state comes from
ipyparallel's own cluster files.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contract import RANK_TABLE, SET_FOLDERS, RankTable
from ..errors import HPCAIError
from ..ranks import telemetry
from ..scheduler.allocation import JOB_STATE_VAR
from .output import COLLAPSE_ABOVE

PROCESSES = "engines"  # in the job's private folder: one file per set, the pids the batch shell stops at its exit
RANK_SET_NAMES = ("hpcai", "jupyter_hpcai.engines.launch:ranksetlauncher")  # how ipyparallel writes our launcher
SET_ID = re.compile(r"hpcai-[\w.-]+")  # Engines' cluster ids: never a path


def set_folder(profile_dir: Path, cluster_id: str) -> Path:
    return profile_dir / SET_FOLDERS / cluster_id


def create_set_folder(profile_dir: Path, cluster_id: str) -> Path:
    """The set's folder and its missing parents, readable by this user only."""
    path = set_folder(profile_dir, cluster_id)
    for folder in reversed([path, *path.parents]):
        if not folder.exists():
            folder.mkdir(mode=0o700, exist_ok=True)  # another kernel's start may make it at the same moment
    found = path.lstat()  # the ranks write and the kernel reads here: another's folder, or a link, is no set's
    if stat.S_ISLNK(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise HPCAIError(f"{path} is not a folder of this user's alone (a link, another's, or open to others)",
                         "remove it, then start again (it is made anew, mode 700)")
    return path


def write_rank_table(folder: Path, table: RankTable) -> None:
    """The set's rank table (contract.RankTable), written whole."""
    partial = folder / f".{RANK_TABLE}"
    partial.write_text(json.dumps(table))
    os.replace(partial, folder / RANK_TABLE)


def read_rank_table(folder: Path) -> RankTable | None:
    """A set's rank table, or None before its ranks registered (or after it stopped)."""
    try:
        return json.loads((folder / RANK_TABLE).read_text())
    except (OSError, ValueError):
        return None


def live_owners(table: dict[str, Any]) -> list[int]:
    """The kernels using a set (those that started or attached to it) that still run: kernels run on the job's
    first node, as does every caller (the server, the other kernels)."""
    return [pid for pid in table.get("owners", []) if isinstance(pid, int) and pid > 0 and process_alive(pid)]


def owner_alive(table: dict[str, Any]) -> bool:
    return bool(live_owners(table))


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs and is this user's (another user's process by now is not the one we knew)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or someone else's process now: not our kernel
        return False
    return True


@dataclass
class EngineSet:
    """A set of this user's, as its ipyparallel cluster file and its rank table say. Both are read as files:
    ipyparallel's own loading starts a thread per running process it finds, which the side panel's listing
    every 2 s would pile up; ``cluster()`` loads it for what needs one (stop, attach)."""

    file: Path  # ipyparallel's cluster file
    data: dict[str, Any]  # what it holds
    table: dict[str, Any]  # the rank table ({} before the set's folder has one)

    @property
    def cluster_id(self) -> str:
        return str(self.data["cluster"]["cluster_id"])

    @property
    def profile_dir(self) -> Path:
        return Path(self.data["cluster"]["profile_dir"])

    @property
    def folder(self) -> Path:
        return set_folder(self.profile_dir, self.cluster_id)

    @property
    def running(self) -> bool:
        """Whether its controller's process is there."""
        state = (self.data.get("controller") or {}).get("state") or {}
        return state.get("state") == "running" and isinstance(state.get("pid"), int) and process_alive(state["pid"])

    @property
    def attached(self) -> bool:
        return owner_alive(self.table)

    @property
    def n(self) -> int:
        return len(self.table.get("ranks", []))

    @property
    def asked(self) -> int:
        return sum(int(s.get("n") or 0) for s in self._engine_sets())

    @property
    def launcher(self) -> str | None:
        first = next(iter(self._engine_sets()), None)
        return (first.get("launcher") or self.data["engines"].get("class")) if first else None

    def _engine_sets(self) -> list[dict[str, Any]]:
        return list(((self.data.get("engines") or {}).get("sets") or {}).values())

    def cluster(self) -> Any:
        """The ipyparallel Cluster (it watches the processes it finds running)."""
        import ipyparallel as ipp

        from .launch import RankSetLauncher

        data = json.loads(self.file.read_text())
        engines = data.get("engines")
        if isinstance(engines, dict) and str(engines.get("class", "")).lower() in RANK_SET_NAMES:  # the entry point
            # a container's python lacks
            engines["class"] = RankSetLauncher
        return ipp.Cluster.from_dict(data, cluster_file=str(self.file))

    def client(self, timeout: float) -> Any:
        import ipyparallel as ipp

        return ipp.Client(profile_dir=str(self.profile_dir), cluster_id=self.cluster_id, timeout=timeout)


def engine_sets() -> list[EngineSet]:
    """This user's hpcai engine sets, in every IPython profile, oldest first."""
    from IPython.paths import get_ipython_dir

    found = []
    for path in sorted(Path(get_ipython_dir()).glob("profile_*/security/cluster-hpcai-*.json")):
        try:
            data = json.loads(path.read_text())
            cluster_id = data["cluster"]["cluster_id"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or not ipyparallel's
        if SET_ID.fullmatch(str(cluster_id)):
            table = read_rank_table(set_folder(Path(data["cluster"]["profile_dir"]), cluster_id)) or {}
            found.append(EngineSet(path, data, table))
    return found


def job_sets(job: str) -> list[EngineSet]:
    """The sets started in Slurm job ``job`` ("local" outside Slurm), oldest first."""
    return [s for s in engine_sets() if s.cluster_id.startswith(f"hpcai-{job}-")]


def stop_set(engine_set: EngineSet) -> None:
    """Stop a set's ranks and controller; its folder, cluster file and job-end record go with it."""
    if engine_set.running or engine_set._engine_sets():
        cluster = engine_set.cluster()
        try:
            cluster.stop_cluster_sync()
        except Exception:  # ranks that died already; the controller still goes
            if cluster.controller:
                cluster.stop_controller_sync()
    engine_set.file.unlink(missing_ok=True)
    shutil.rmtree(engine_set.folder, ignore_errors=True)
    forget_processes(engine_set.cluster_id)


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


def stacks(cluster_id: str, native: bool = False) -> tuple[list[dict[str, Any]], str]:
    """A running set's grouped stacks (stacks.py), for the side panel's button: each group's ranks, headline
    and frames as text; and who read them (the server's HPCAI_STACKS chooses, auto when unset)."""
    from ..ranks.stacks import collect, source, who_read
    from .launch import LAUNCHERS

    found = next((s for s in engine_sets() if s.cluster_id == cluster_id), None)
    if found is None or not found.table:
        raise HPCAIError(f"no running engine set '{cluster_id}'", "start the engines in a notebook: %hpc start")
    table = found.table
    ranks = [(r["rank"], r["host"], r["pid"]) for r in table["ranks"]]
    groups = collect(ranks, LAUNCHERS[table["launcher"]].on_nodes, found.folder, native,
                     source=source(bool(table["container"]), native=native))
    return [{"ranks": list(g.ranks), "headline": g.headline(len(ranks)), "text": g.render(len(ranks))}
            for g in groups], who_read(groups)


def list_engine_sets(job: str | None = None, connect_timeout: float = 2.0) -> list[dict[str, Any]]:
    """Each hpcai engine set (of Slurm job ``job`` only, if given): cluster id, engines asked for and registered,
    launcher, controller state, whether a kernel uses it, and each rank (rank, host, GPU, pid, alive) with its
    latest telemetry; above COLLAPSE_ABOVE ranks, ``nodes`` too: a row per node (telemetry.node_table) for the lab
    panel to show instead of a row per rank."""
    sets = []
    for engine_set in engine_sets() if job is None else job_sets(job):
        registered: set[int] = set()
        controller_running = engine_set.running
        if controller_running:
            try:
                client = engine_set.client(connect_timeout)
                registered = set(client.ids)
                client.close()
            except Exception:  # a controller that stopped answering counts as not running
                controller_running = False
        read = telemetry.read(engine_set.folder)
        samples = {row["rank"]: row for row in telemetry.summary(read)}
        ranks = [{**rank, "alive": controller_running and rank["engine_id"] in registered,
                  "telemetry": samples.get(rank["rank"])} for rank in engine_set.table.get("ranks", [])]
        sets.append({"cluster_id": engine_set.cluster_id, "engines": engine_set.asked, "registered": len(registered),
                     "launcher": engine_set.launcher,
                     "state": "running" if controller_running and registered else "stopped",
                     "attached": engine_set.attached, "ranks": ranks})
        if len(ranks) > COLLAPSE_ABOVE:
            members = [(r["rank"], r["host"], r["alive"]) for r in ranks]
            sets[-1]["nodes"] = [dict(zip(telemetry.NODE_TABLE_COLUMNS, row))
                                 for row in telemetry.node_table(members, read)]
    return sets


def claim(name: str, content: str = "") -> bool:
    """True for the first caller in this notebook job only: a file ``name`` (holding ``content``) made exclusively
    in the job's private folder, which the job's end removes (warm.py's claims)."""
    try:
        fd = os.open(Path(os.environ[JOB_STATE_VAR]) / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW,
                     0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(content)
    return True
