"""pytest fixture for the dev cluster: ``pytest_plugins = ["jupyter_hpcai.devcluster.pytest_plugin"]``."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from .cluster import DevCluster

_used: list[DevCluster] = []  # the session's cluster, for the summary line


@pytest.fixture(scope="session")
def devcluster() -> Iterator[DevCluster]:
    """The dev cluster (2 nodes x 4 fake GPUs), up for the session; SLURM_CONF is set for every test.

    A cluster that was already running is reused and left running; one started here is stopped
    at the end of the session.
    """
    cluster = DevCluster()
    started_here = not cluster.running()
    cluster.up()
    os.environ.update(cluster.variables())
    _used.append(cluster)
    yield cluster
    if started_here:
        cluster.down()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say which network mode the tests ran on (tests that need separate hosts skip without it)."""
    for cluster in _used:
        nodes = ", ".join(f"{n} {cluster.node_address(n)}" for n in cluster.node_names)
        note = f" ({cluster.note})" if cluster.note else ""
        cpu = f"CPU shared as the host's own ({cluster.cpu_note})" if cluster.cpu_note else f"cgroup {cluster.cpu.path}"
        terminalreporter.write_line(f"dev cluster: {cluster.mode}{note}; login node {cluster.login_address}; {nodes}; "
                                    f"nodes' processes: {cpu}")
