"""The test run's two lanes (scripts/test.sh runs pytest-xdist with --dist loadgroup): the dev cluster's lane runs its
tests one after another in one process, the other lane beside it in a second. A test joins the cluster's lane when it
uses the dev cluster (conftest.py marks it as collected), or, marked ``CLUSTER_LANE`` by hand, when it changes what the
cluster's tests use: the shipped envs in the site root, the hub users' homes.

The cluster's lane is the run's critical path: the other lane's tests run at a lower CPU priority (nice 10, set as
each test starts: its processes inherit it), so that its compiles and builds take the cores the cluster's tests
leave idle rather than theirs."""

from __future__ import annotations

import os

import pytest

CLUSTER_LANE = pytest.mark.xdist_group("cluster")
OTHER_LANE_NICE = 10


def in_cluster_lane(item: pytest.Item) -> bool:
    """Whether ``item`` runs in the cluster's lane."""
    group = item.get_closest_marker("xdist_group")
    return group is not None and group.args[:1] == ("cluster",)


def yield_to_the_cluster(item: pytest.Item) -> None:
    """Under pytest-xdist, this process (and what it starts next) takes the priority of ``item``'s lane."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.setpriority(os.PRIO_PROCESS, 0, 0 if in_cluster_lane(item) else OTHER_LANE_NICE)
