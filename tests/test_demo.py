"""The README's main command walks the whole path: a 2-node server spawned through the hub as a real user,
a kernel from the built env, Horovod training on 4 ranks in that server's job, then stop."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_helpers import free_port
from jupyter_hpcai.demo import HubProcess

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_demo_check_walks_the_whole_path(devcluster, tf_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    state = tmp_path / "hub"
    env = {**os.environ, "HPCAI_HUB_DIR": str(state), "HPCAI_HUB_PORT": str(free_port()),
           "HPCAI_ENV_ROOT": str(tf_env.root), "COLUMNS": "200"}
    try:
        done = subprocess.run([str(Path(sys.executable).parent / "hpcai"), "demo", "--check"], capture_output=True,
                              text=True, timeout=1200, env=env)
    finally:
        HubProcess(state, 0).stop()  # the hub outlives the command by design; stop it and its proxy
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-2000:]
    for step in ("spawn a 2-node server through the REST API", "open a kernel from the tf-horovod-cpu env",
                 "start 4 engines on 2 nodes", "train a small Keras model on 4 ranks", "stop the server"):
        assert f"[ok] {step}" in out, out
    assert "samples/sec on 4 ranks" in out and "the whole path works" in out
    assert "login: hpcai-demo   password: " in out
