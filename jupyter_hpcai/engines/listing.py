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
from pathlib import Path
from typing import Any

from ..errors import HPCAIError
from . import telemetry

RANK_TABLE = "ranks.json"
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


def write_rank_table(folder: Path, launcher: str, ranks: list[dict[str, Any]], container: bool) -> None:
    """Who each rank is (rank, host, gpu, pid, engine_id), written whole."""
    partial = folder / f".{RANK_TABLE}"
    partial.write_text(json.dumps({"launcher": launcher, "container": container, "ranks": ranks}))
    os.replace(partial, folder / RANK_TABLE)


def read_rank_table(folder: Path) -> dict[str, Any] | None:
    """A set's rank table, or None before its ranks registered (or after it stopped)."""
    try:
        return json.loads((folder / RANK_TABLE).read_text())
    except (OSError, ValueError):
        return None


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


def list_engine_sets(connect_timeout: float = 2.0) -> list[dict[str, Any]]:
    """Each hpcai engine set: cluster id, engines asked for and registered, launcher, controller state, and
    each rank (rank, host, GPU, pid, alive) with its latest telemetry."""
    sets = []
    for cluster in _hpcai_clusters().values():
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
                     "state": "running" if controller_running and registered else "stopped", "ranks": ranks})
    return sets
