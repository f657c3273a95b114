"""The README's main command walks the whole path: a 2-node server spawned through the hub as a real user,
a kernel from the built env, the demo notebook's own cells (Horovod training on 4 ranks in that server's job, on
the engines the job started), then stop. A notebook cell the check does not know fails the check."""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.envs import shipped_env_held
from helpers.jupyter import free_port
from jupyter_hpcai.scheduler import slurm
from jupyter_hpcai.scheduler.interface import TERMINAL_STATES
from jupyter_hpcai.demo import DEMO_USER, NOTEBOOK, REPO, _running, check_cells, copy_examples, ensure_user
from jupyter_hpcai.errors import HPCAIError

HPCAI = str(Path(sys.executable).parent / "hpcai")

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_demo_check_walks_the_whole_path(devcluster, tf_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    state = tmp_path / "hub"
    env = {**os.environ, "HPCAI_HUB_DIR": str(state), "HPCAI_HUB_PORT": str(free_port()),
           "HPCAI_HUB_INTERNAL_PORT": str(free_port()), "HPCAI_PROXY_API_PORT": str(free_port()),
           "HPCAI_ENV_ROOT": str(tf_env.root.path), "COLUMNS": "200"}
    try:
        with shipped_env_held(tf_env.name):  # the demo builds (or reuses) the shipped env, as the run's other process may
            done = subprocess.run([HPCAI, "demo", "--check"], capture_output=True, text=True, timeout=1200, env=env)
    finally:  # the hub outlives the command by design: --stop ends it, its proxy and the cluster
        stopped = subprocess.run([HPCAI, "demo", "--stop"], capture_output=True, text=True, timeout=300, env=env)
        again = subprocess.run([HPCAI, "demo", "--stop"], capture_output=True, text=True, timeout=300, env=env)
        devcluster.up()  # back for the tests that follow
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-2000:]
    for step in ("spawn a 2-node server through the REST API", "open a kernel from the tf-horovod-cpu env",
                 "JupyterLab opens the demo notebook: /lab/tree/demo.ipynb",
                 "load the extension", "open the panel",
                 "a Horovod world of 4 ranks, its output collapsed: [all 4 ranks] Horovod world of 4 ranks",
                 "train a small Keras model on 4 ranks", "the status of the 4 ranks:", "stop the engines: engines stopped",
                 "stop the server"):
        assert f"[ok] {step}" in out, out
    assert "samples/sec on 4 ranks" in out and "the whole path works" in out
    assert "login: hpcai-demo   password: " in out
    # each [ok] says what Slurm showed: the job, its nodes, how it ended; Slurm still says the same
    ready = re.search(r"\[ok\] server ready: Slurm job (\d+) running on n1, n2$", out, re.M)
    ended = re.search(r"\[ok\] stop the server: job (\d+) ([A-Z_]+)$", out, re.M)
    assert ready and ended and ready.group(1) == ended.group(1), out
    job = slurm.job_info(ready.group(1)) or {}
    assert slurm.expand_hostlist(job.get("NodeList", "")) == ["n1", "n2"] and job.get("JobState") == ended.group(2)
    assert ended.group(2) in TERMINAL_STATES
    # --stop: the hub and its proxy are gone, the cluster is down, and a second --stop is harmless
    assert stopped.returncode == 0 and "stopped the hub" in stopped.stdout and "stopped the proxy" in stopped.stdout
    assert "dev cluster stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    pids = [int(p) for p in re.findall(r"pid (\d+)", stopped.stdout)]
    assert len(pids) == 2 and not any(_running(p, "") for p in pids)
    assert again.returncode == 0 and "stopped the hub" not in again.stdout and "dev cluster stopped" in again.stdout


def test_the_demo_user_gets_the_examples_and_keeps_their_changes() -> None:
    ensure_user(DEMO_USER)
    home = Path(pwd.getpwnam(DEMO_USER).pw_dir)
    notebook = home / "demo.ipynb"
    notebook.unlink(missing_ok=True)
    assert copy_examples(DEMO_USER) == [f"example notebook: {notebook}"]
    assert notebook.read_bytes() == (REPO / "examples" / "demo.ipynb").read_bytes()
    assert notebook.stat().st_uid == pwd.getpwnam(DEMO_USER).pw_uid
    assert copy_examples(DEMO_USER) == [f"example notebook: {notebook}"]  # unchanged: refreshed
    changed = json.loads(notebook.read_text())
    changed["cells"].append({"cell_type": "markdown", "metadata": {}, "source": ["my own notes"]})
    notebook.write_text(json.dumps(changed))
    assert "kept" in copy_examples(DEMO_USER)[0] and "my own notes" in notebook.read_text()
    notebook.unlink()


def test_the_check_runs_every_cell_of_the_demo_notebook_and_knows_each(tmp_path: Path) -> None:
    cells = [c for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
    assert [code for _, code, _ in check_cells()[1:]] == ["".join(c["source"]) for c in cells]
    for change in ("append", "swap"):  # a new cell, or two cells in another order: the check says which it knows
        notebook = json.loads(NOTEBOOK.read_text())
        code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
        if change == "append":
            notebook["cells"].append({**code[0], "source": ["print('a new cell')"]})
        else:
            code[2]["source"], code[3]["source"] = code[3]["source"], code[2]["source"]
        (tmp_path / "demo.ipynb").write_text(json.dumps(notebook))
        with pytest.raises(HPCAIError, match="and the demo check knows"):
            check_cells(tmp_path / "demo.ipynb")


@pytest.mark.slurm
def test_a_hub_that_cannot_listen_says_where_and_leaves_no_proxy(devcluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The hub's API address taken (as when another hub runs, or the dev cluster's bridge is down): JupyterHub has
    started its proxy by then and leaves it running (cleanup_proxy is off); the start stops it and names the
    address."""
    import socket

    from helpers.hub import Hub

    taken = socket.socket()
    taken.bind((devcluster.login_address, 0))
    taken.listen()
    hub = Hub(tmp_path / "hub")
    hub.internal_port = taken.getsockname()[1]
    try:
        with pytest.raises(HPCAIError) as err:
            hub.start()
    finally:
        taken.close()
    address = f"http://{devcluster.login_address}:{hub.internal_port}/hub/"
    assert f"the hub could not listen: its API on {address} (Address already in use)" in err.value.message, err.value
    assert "ss -ltnp" in err.value.hint and str(hub.log) in err.value.hint
    assert "proxy" in hub.log.read_text()  # its proxy had started
    assert not (tmp_path / "hub" / "proxy.pid").exists()
    with pytest.raises(ConnectionRefusedError):  # nothing listens on the hub's public port any more
        socket.create_connection(("127.0.0.1", hub.port), timeout=5).close()
