"""The engine sets this user's kernels started, read from ipyparallel's cluster files (status only)."""

from __future__ import annotations

from typing import Any


def list_engine_sets(connect_timeout: float = 2.0) -> list[dict[str, Any]]:
    """Each hpcai engine set: cluster id, engines asked for and registered, launcher, controller state."""
    import ipyparallel as ipp

    sets = []
    for key, cluster in ipp.ClusterManager().load_clusters().items():
        if not cluster.cluster_id.startswith("hpcai-"):
            continue
        asked = sum(es.n or 0 for es in cluster.engines.values())
        registered = 0
        controller_running = bool(cluster.controller and cluster.controller.state == "running")
        if controller_running:
            try:
                client = cluster.connect_client_sync(timeout=connect_timeout)
                registered = len(client.ids)
                client.close()
            except Exception:  # a controller that stopped answering counts as not running
                controller_running = False
        launcher = next(iter(cluster.engines.values()), None)
        sets.append({"cluster_id": cluster.cluster_id, "key": key, "engines": asked, "registered": registered,
                     "launcher": (getattr(launcher, "launcher", "") or type(launcher).__name__) if launcher else None,
                     "state": "running" if controller_running and registered else "stopped"})
    return sets
