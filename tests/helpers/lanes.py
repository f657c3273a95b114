"""The test run's two lanes (scripts/test.sh runs pytest-xdist with --dist loadgroup): the dev cluster's lane runs its
tests one after another in one process, the other lane beside it in a second. A test joins the cluster's lane when it
uses the dev cluster (conftest.py marks it as collected), or, marked ``CLUSTER_LANE`` by hand, when it changes what the
cluster's tests use: the shipped envs in the site root, the hub users' homes."""

import pytest

CLUSTER_LANE = pytest.mark.xdist_group("cluster")
