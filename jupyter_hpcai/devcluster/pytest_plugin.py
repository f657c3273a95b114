"""pytest fixture for the dev cluster: ``pytest_plugins = ["jupyter_hpcai.devcluster.pytest_plugin"]``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from .cluster import DevCluster

_used: list[DevCluster] = []  # the session's cluster, for the summary line
_lines: list[str] = []  # that line, from the worker that used the cluster (pytest-xdist's -n)


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


def _summary(cluster: DevCluster) -> str:
    nodes = ", ".join(f"{n} {cluster.node_address(n)}" for n in cluster.node_names)
    note = f" ({cluster.note})" if cluster.note else ""
    cpu = f"CPU shared as the host's own ({cluster.cpu_note})" if cluster.cpu_note else f"cgroup {cluster.cpu.path}"
    return f"dev cluster: {cluster.mode}{note}; login node {cluster.login_address}; {nodes}; nodes' processes: {cpu}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workeroutput"):  # a worker: the main process prints the line
        session.config.workeroutput["hpcai-devcluster"] = [_summary(c) for c in _used]


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's, in the main process
def pytest_testnodedown(node: Any, error: Any) -> None:
    _lines.extend(getattr(node, "workeroutput", {}).get("hpcai-devcluster", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say which network mode the tests ran on (tests that need separate hosts skip without it)."""
    for line in [*_lines, *(_summary(c) for c in _used)]:
        terminalreporter.write_line(line)
