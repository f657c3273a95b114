"""The engine sets this user's kernels started, for the server extension (the side panel).

Each set has a private folder, ``<jupyter runtime dir>/hpcai-ranks/<cluster id>/`` (mode 700), made by the
kernel's ``Engines`` at start and removed at stop: each rank's output (``rank-N.log``), its telemetry
(``telemetry-N.json``, telemetry.py) and the rank table (``ranks.json``: who each rank is, the launcher).
The controller's state comes from ipyparallel's own cluster files.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_runtime_dir

from ..errors import HPCAIError
from . import telemetry

RANK_TABLE = "ranks.json"
SET_ID = re.compile(r"hpcai-[\w.-]+")  # Engines' cluster ids: never a path


def sets_root() -> Path:
    return Path(jupyter_runtime_dir()) / "hpcai-ranks"


def create_set_folder(cluster_id: str) -> Path:
    """The set's folder and its missing parents, readable by this user only."""
    path = sets_root() / cluster_id
    for folder in reversed([path, *path.parents]):
        if not folder.exists():
            folder.mkdir(mode=0o700)
    return path


def write_rank_table(folder: Path, launcher: str, ranks: list[dict[str, Any]], container: bool) -> None:
    """Who each rank is (rank, host, gpu, pid, engine_id), written whole."""
    partial = folder / f".{RANK_TABLE}"
    partial.write_text(json.dumps({"launcher": launcher, "container": container, "ranks": ranks}))
    os.replace(partial, folder / RANK_TABLE)


def read_rank_table(cluster_id: str) -> dict[str, Any] | None:
    """A set's rank table, or None before its ranks registered (or after it stopped)."""
    try:
        return json.loads((sets_root() / cluster_id / RANK_TABLE).read_text())
    except (OSError, ValueError):
        return None


def stacks(cluster_id: str, native: bool = False) -> list[dict[str, Any]]:
    """A running set's grouped stacks (stacks.py), for the side panel's button: each group's ranks, headline
    and frames as text."""
    from .launch import LAUNCHERS
    from .stacks import collect, container_refusal

    table = read_rank_table(cluster_id) if SET_ID.fullmatch(cluster_id) else None
    if table is None:
        raise HPCAIError(f"no running engine set '{cluster_id}'", "start the engines in a notebook: %hpc start")
    if table["container"]:
        raise container_refusal()
    ranks = [(r["rank"], r["host"], r["pid"]) for r in table["ranks"]]
    groups = collect(ranks, LAUNCHERS[table["launcher"]].on_nodes(sorted({h for _, h, _ in ranks})), native)
    return [{"ranks": list(g.ranks), "headline": g.headline(len(ranks)), "text": g.render(len(ranks))} for g in groups]


def list_engine_sets(connect_timeout: float = 2.0) -> list[dict[str, Any]]:
    """Each hpcai engine set: cluster id, engines asked for and registered, launcher, controller state, and
    each rank (rank, host, GPU, pid, alive) with its latest telemetry."""
    import ipyparallel as ipp

    sets = []
    for key, cluster in ipp.ClusterManager().load_clusters().items():
        if not cluster.cluster_id.startswith("hpcai-"):
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
        table = read_rank_table(cluster.cluster_id) or {}
        samples = {row["rank"]: row for row in telemetry.summary(telemetry.read(sets_root() / cluster.cluster_id))}
        ranks = [{**rank, "alive": controller_running and rank["engine_id"] in registered,
                  "telemetry": samples.get(rank["rank"])} for rank in table.get("ranks", [])]
        launcher = next(iter(cluster.engines.values()), None)
        sets.append({"cluster_id": cluster.cluster_id, "key": key, "engines": asked, "registered": len(registered),
                     "launcher": (getattr(launcher, "launcher", "") or type(launcher).__name__) if launcher else None,
                     "state": "running" if controller_running and registered else "stopped", "ranks": ranks})
    return sets
