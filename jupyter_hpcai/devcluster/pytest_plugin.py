"""pytest fixture for the dev cluster: ``pytest_plugins = ["jupyter_hpcai.devcluster.pytest_plugin"]``."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from .cluster import DevCluster


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
    yield cluster
    if started_here:
        cluster.down()
