"""pytest fixture for the dev cluster: ``pytest_plugins = ["jupyter_hpcai.devcluster.pytest_plugin"]``.

Each of pytest-xdist's worker processes (``-n``) has a dev cluster of its own, so that two never share nodes: the
first worker (or a run without ``-n``) the default one; worker gwN (N >= 1) one with its own state dir, ports,
network, bridge, namespaces and job ids, whose nodes are named n1, n2... too. The hook below starts those workers
with an /etc/hosts of their own (own_hosts.py), where those names mean their cluster's nodes.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from ..errors import HPCAIError
from . import own_hosts
from .cluster import DevCluster


def worker_number() -> int:
    """N of pytest-xdist's worker gwN that runs this; 0 without pytest-xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker.removeprefix("gw")) if worker.startswith("gw") else 0


def worker_cluster(number: int) -> DevCluster:
    """Worker ``number``'s dev cluster: the default one for 0, else one beside it that shares nothing with it."""
    default = DevCluster()
    if number == 0:
        return default
    return DevCluster(state_dir=default.state_dir.with_name(f"{default.state_dir.name}-{number}"),
                      port=default.port + 200 * number, network=f"10.214.{number}.0/24", bridge=f"hpcai{number}",
                      netns_prefix=f"hpcai{number}-", first_job_id=100_000 * number + 1)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's, in the main process
def pytest_xdist_setupnodes(config: pytest.Config, specs: list[Any]) -> None:
    """Start every worker but the first with an /etc/hosts of its own."""
    for spec in specs[1:]:
        spec.python = shlex.join(own_hosts.command([spec.python or sys.executable]))

_used: list[DevCluster] = []  # the session's cluster, for the summary line
_lines: list[str] = []  # that line, from the worker that used the cluster (pytest-xdist's -n)
_stopped: list[str] = []  # daemons found stopped at the session's end, with their logs' last lines


@pytest.fixture(scope="session")
def devcluster() -> Iterator[DevCluster]:
    """This process's dev cluster (2 nodes x 4 fake GPUs), up for the session; SLURM_CONF and
    HPCAI_DEVCLUSTER_DIR are set for every test.

    A cluster that was already running is reused and left running; one started here is stopped
    at the end of the session.
    """
    number = worker_number()
    if number and not own_hosts.hosts_are_own():
        raise HPCAIError(f"pytest-xdist's worker gw{number} would start a second dev cluster, but the names of its nodes"
                         " would mean the first one's: this process has the host's /etc/hosts",
                         "load this plugin in the main process too (tests/conftest.py does), so that its hook starts"
                         " the workers with an /etc/hosts of their own")
    cluster = worker_cluster(number)
    if number and cluster.running():  # a killed run's: its namespaces and hosts entries went with that run's mounts
        cluster.down()
    started_here = not cluster.running()
    cluster.up()
    os.environ.update(cluster.variables())
    _used.append(cluster)
    yield cluster
    _stopped.extend(stopped_daemons(cluster))
    if started_here:
        cluster.down()


def stopped_daemons(cluster: DevCluster, lines: int = 20) -> list[str]:
    """Each of the cluster's daemons that no longer runs, with the last lines of its log: what the failures after
    its end came from (a CI run's output shows nothing else of the cluster)."""
    said = []
    daemons = [*cluster.daemons(), *(cluster.acct.daemons() if cluster.accounting else [])]
    for daemon in daemons:
        if daemon.pid() is not None:
            continue
        slug = daemon.name.replace(" ", "-")
        logs = [p for p in (cluster.state_dir / "log" / f"{slug}.log", cluster.acct.dir / "log" / f"{slug}.log")
                if p.exists()]
        tail = logs[0].read_text(errors="replace").splitlines()[-lines:] if logs else ["(no log)"]
        said.append(f"dev cluster {cluster.state_dir}: {daemon.name} had stopped before the session's end; the "
                    f"last lines of its log:\n" + "\n".join(f"  {line}" for line in tail))
    return said


def _summary(cluster: DevCluster) -> str:
    nodes = ", ".join(f"{n} {cluster.node_address(n)}" for n in cluster.node_names)
    note = f" ({cluster.note})" if cluster.note else ""
    cpu = f"CPU shared as the host's own ({cluster.cpu_note})" if cluster.cpu_note else f"cgroup {cluster.cpu.path}"
    return f"dev cluster: {cluster.mode}{note}; login node {cluster.login_address}; {nodes}; nodes' processes: {cpu}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workeroutput"):  # a worker: the main process prints the line
        session.config.workeroutput["hpcai-devcluster"] = [*(_summary(c) for c in _used), *_stopped]


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's, in the main process
def pytest_testnodedown(node: Any, error: Any) -> None:
    _lines.extend(getattr(node, "workeroutput", {}).get("hpcai-devcluster", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say which network mode the tests ran on (tests that need separate hosts skip without it)."""
    for line in dict.fromkeys([*_lines, *(_summary(c) for c in _used), *_stopped]):  # each worker's, once
        terminalreporter.write_line(line)
