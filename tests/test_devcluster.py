"""The dev cluster is a real Slurm: nodes, GPU gres, multi-node jobs, PMIx MPI, start and stop."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_hpcai import slurm
from jupyter_hpcai.devcluster import DevCluster, check_prerequisites
from jupyter_hpcai.errors import HPCAIError
from jupyter_hpcai.proc import wait_until

pytestmark = pytest.mark.slurm

# Holds its GPUs until the file named by $1 exists, after each node has reported its GPUs.
HOLD_GPUS = """#!/bin/bash
srun --ntasks-per-node=1 bash -c 'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"'
while [ ! -e "$1" ]; do sleep 0.1; done
"""


def test_nodes_idle_with_four_gpus(devcluster: DevCluster) -> None:
    out = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N %T %G %P"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    rows = {tuple(line.split()) for line in out.splitlines()}
    assert {(n, "idle", "gpu:4") for n in ("n1", "n2")} == {r[:3] for r in rows}
    assert {r[3].rstrip("*") for r in rows} == {"gpu", "debug"}
    assert {(n.name, n.gpus) for n in slurm.nodes()} == {("n1", 4), ("n2", 4)}


def _gpu_lines(output: Path) -> dict[str, str] | None:
    """node -> CUDA_VISIBLE_DEVICES, once both nodes have written their line."""
    lines = output.read_text().split("\n")[:-1] if output.exists() else []
    found = dict(line.split(" ", 1) for line in lines)
    return found if len(found) == 2 else None


def test_two_node_gpu_jobs_get_distinct_gpus(devcluster: DevCluster, tmp_path: Path) -> None:
    script = tmp_path / "hold.sh"
    script.write_text(HOLD_GPUS)
    release = tmp_path / "release"
    jobs, seen = [], []
    try:
        for name in ("a", "b"):
            out = tmp_path / f"{name}.out"
            jobs.append(slurm.sbatch(["-N2", "--gpus-per-node=2", f"--output={out}", str(script), str(release)]))
            seen.append(wait_until(lambda: _gpu_lines(out), timeout=60, what=f"job {name} to report its GPUs"))
    finally:
        release.touch()
    first, second = seen
    assert set(first) == set(second) == {"n1", "n2"}
    assert first == {"n1": "0,1", "n2": "0,1"}
    for node in ("n1", "n2"):  # both jobs run at once on each node, on other GPUs
        assert not set(first[node].split(",")) & set(second[node].split(","))
        assert len(second[node].split(",")) == 2
    for job in jobs:
        wait_until(lambda: slurm.job_info(job)["JobState"] == "COMPLETED", timeout=60, what=f"job {job} to complete")


def test_srun_pmix_mpi_allreduce_across_nodes(devcluster: DevCluster) -> None:
    code = "from mpi4py import MPI; import os; c = MPI.COMM_WORLD; print(c.rank, os.environ['SLURMD_NODENAME'], c.allreduce(c.rank + 1))"
    done = subprocess.run(["srun", "--mpi=pmix", "-N2", "-n4", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = sorted(line.split() for line in done.stdout.splitlines())
    assert [r[0] for r in rows] == ["0", "1", "2", "3"]
    assert {r[1] for r in rows} == {"n1", "n2"}
    assert {r[2] for r in rows} == {"10"}


def test_up_twice_is_harmless(devcluster: DevCluster) -> None:
    before = devcluster.status()["daemons"]
    devcluster.up()
    assert devcluster.status()["daemons"] == before


def test_up_with_other_shape_while_running_is_refused(devcluster: DevCluster) -> None:
    with pytest.raises(HPCAIError, match="different dev cluster") as err:
        DevCluster(state_dir=devcluster.state_dir, nodes=1).up()
    assert "hpcai devcluster down" in err.value.hint


def _daemon_pids(state_dir: Path) -> list[int]:
    """Processes started with this cluster's SLURM_CONF in their environment."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                environ = (proc / "environ").read_bytes()
            except OSError:
                continue
            if f"SLURM_CONF={state_dir}/slurm.conf".encode() in environ:
                pids.append(int(proc.name))
    return pids


def test_down_stops_everything_and_up_works_again(devcluster: DevCluster, tmp_path: Path) -> None:
    """A second, separate cluster (own state dir and ports) beside the session's one."""
    other = DevCluster(state_dir=tmp_path / "cluster", nodes=2, gpus_per_node=1, port=7817)
    try:
        for _ in range(2):
            other.up()
            assert {(n.name, n.gpus, n.state) for n in slurm.nodes(other.environ())} == {("n1", 1, "idle"), ("n2", 1, "idle")}
            daemons = {d.pid() for d in other.daemons()}
            assert None not in daemons and len(daemons) == 4  # munged, slurmctld, two slurmd
            assert daemons <= set(_daemon_pids(other.state_dir))
            other.down()
            assert _daemon_pids(other.state_dir) == []
            assert not other.running()
        other.down()  # nothing running: harmless
    finally:
        other.down()
    assert all(devcluster.status()["daemons"].values()), "the session's cluster must be untouched"


def test_missing_slurm_names_the_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("jupyter_hpcai.devcluster.cluster._SBIN_PATH", str(tmp_path))  # an empty PATH
    with pytest.raises(HPCAIError, match="Slurm is not installed") as err:
        check_prerequisites()
    assert "apt-get install -y slurm-wlm munge" in err.value.hint


def test_cli_without_root_says_so() -> None:
    """Run the real CLI as an unprivileged user (nobody); scripts/setup.sh lets every user run .venv."""
    if os.geteuid() != 0:
        pytest.fail("the dev-cluster tests run as root (they start Slurm daemons)")
    done = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", str(Path(sys.executable).parent / "hpcai"),
         "devcluster", "up", "--state-dir", "/tmp/hpcai-nobody-cluster"],
        capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"], "HOME": "/tmp"},
    )
    assert done.returncode == 1, done.stderr
    assert "needs root" in done.stdout and "sudo" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
