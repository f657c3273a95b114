"""Builds as Slurm jobs on the partition that will use the env, and the toolchain preflight."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.gpus import real_gpus
from jupyter_hpcai.scheduler import slurm
from jupyter_hpcai.scheduler.interface import TERMINAL_STATES
from jupyter_hpcai.devcluster import SEPARATE
from jupyter_hpcai.envs import EnvStore, open_env, parse_recipe
from jupyter_hpcai.envs.preflight import preflight
from jupyter_hpcai.errors import HPCAIError
from jupyter_hpcai.proc import wait_until
from test_envs import blocking_recipe

HPCAI = str(Path(sys.executable).parent / "hpcai")


def _cli(args: list[str], store: EnvStore, **kwargs) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    return subprocess.Popen([HPCAI, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "HPCAI_ENV_ROOT": str(store.root), "COLUMNS": "200"}, **kwargs)


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small recipe's pip package, downloaded here (the login node) onto the shared filesystem: compute
    nodes have no route out (the dev cluster's, as many sites'), so a build job installs from it."""
    path = tmp_path_factory.mktemp("wheelhouse")
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(path), "six==1.16.0"],
                   check=True, timeout=300)
    return path


@pytest.mark.slurm
def test_build_job_on_the_gpu_partition(devcluster, small_recipe: Path, env_store: EnvStore,  # type: ignore[no-untyped-def]
                                        wheelhouse: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip's own settings reach the build job through its environment
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheelhouse))
    proc = _cli(["env", "build", str(small_recipe), "--name", "remote", "--on-partition", "gpu", "--gpus", "1"], env_store)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    job_id = output.split("build job ")[1].split()[0]
    assert f"{job_id}| ✓ pip done" in output and f"{job_id}| env 'remote' built" in output, output
    env = env_store.env("remote")
    site = env.current().manifest().build_site  # type: ignore[index,union-attr]
    assert (site["job_id"], site["partition"], len(site["gpus"])) == (job_id, "gpu", 1)
    assert site["node"] in ("n1", "n2") and "Open MPI" in site["mpi"]
    assert open_env(env).check().passed


@pytest.mark.slurm
def test_a_build_job_on_a_node_without_a_route_out_says_how_to_install(devcluster, small_recipe: Path,  # type: ignore[no-untyped-def]
                                                                       env_store: EnvStore,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """pip on a node that cannot reach the index (with separate hosts the nodes have no route out)."""
    if devcluster.mode != SEPARATE:
        pytest.skip(f"the dev cluster runs with {devcluster.mode}: its nodes share this host's network")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # only pip's default, public index (no local mirror)
    monkeypatch.setenv("PIP_RETRIES", "1")
    proc = _cli(["env", "build", str(small_recipe), "--name", "offline", "--on-partition", "gpu"], env_store)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, output
    assert "cannot reach the package index" in output and "PIP_INDEX_URL" in output and "--here" in output, output
    assert "Traceback" not in output and env_store.env("offline").current() is None


@pytest.mark.slurm
def test_cancelling_a_build_job_keeps_the_old_env(devcluster, small_recipe: Path, env_store: EnvStore,  # type: ignore[no-untyped-def]
                                                  tmp_path: Path, wheelhouse: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the nodes have no route out: the job installs from the wheelhouse
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheelhouse))
    proc = _cli(["env", "build", str(small_recipe), "--name", "cancelled", "--here"], env_store)
    assert proc.wait(timeout=300) == 0
    env = env_store.env("cancelled")
    before = env.current()
    recipe = blocking_recipe(small_recipe, tmp_path)
    started = tmp_path / "started"
    proc = subprocess.Popen([HPCAI, "env", "build", str(recipe), "--name", "cancelled", "--on-partition", "gpu"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "HPCAI_ENV_ROOT": str(env_store.root), "HPCAI_TEST_STARTED": str(started)})
    try:
        wait_until(started.exists, timeout=300, what="the build job to reach its pip layer")
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate("y\n", timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run(["scancel", "--name=hpcai-build-cancelled"], timeout=30)  # no job outlives a failure
    job_id = output.split("build job ")[1].split()[0]
    assert "cancel build job" in output and f"cancelling job {job_id}" in output, output
    wait_until(lambda: slurm.job_info(job_id)["JobState"] in TERMINAL_STATES, timeout=60, what="the job to end")  # type: ignore[index]
    assert slurm.job_info(job_id)["JobState"] == "CANCELLED"  # type: ignore[index]
    assert env.current() == before and open_env(env).check().passed
    wait_until(lambda: [b.id for b in env.builds()] == [before.id], timeout=30,  # type: ignore[union-attr]
               what="the cancelled build's prefix to be discarded")


# -- preflight ----------------------------------------------------------------------------------------

HOROVOD_RECIPE = """
name: hvd
python: /usr/bin/python3
pip: [horovod==0.28.1, mpi4py]
build_env: {HOROVOD_WITH_MPI: "1"}
"""


def test_preflight_passes_here() -> None:
    checked = preflight(parse_recipe(HOROVOD_RECIPE))
    assert checked.problems == [] and checked.facts["compiler"] and "Open MPI" in checked.facts["mpi"]


def test_compiler_too_old() -> None:
    checked = preflight(parse_recipe(HOROVOD_RECIPE + "build: {min_gcc: '99.1'}\n"))
    (what, fix), = checked.problems
    assert f"gcc {checked.facts['compiler']} is older than 99.1" in what and "module load" in fix


def test_mpi_missing(tmp_path: Path) -> None:
    for tool in ("gcc", "cmake", "bash"):  # a PATH with the compiler and CMake, without MPI
        (tmp_path / tool).symlink_to(shutil.which(tool))  # type: ignore[arg-type]
    checked = preflight(parse_recipe(HOROVOD_RECIPE), {**os.environ, "PATH": str(tmp_path)})
    (what, fix), = checked.problems
    assert "mpicc not found" in what and "module load openmpi" in fix


def test_nccl_home_not_found() -> None:
    recipe = parse_recipe(HOROVOD_RECIPE.replace('build_env: {HOROVOD_WITH_MPI: "1"}',
                                                 'build_env: {HOROVOD_WITH_MPI: "1", HOROVOD_GPU_OPERATIONS: NCCL, '
                                                 'HOROVOD_NCCL_HOME: /opt/no-nccl-here}'))
    checked = preflight(recipe)
    nccl = [what for what, _ in checked.problems if "NCCL home" in what]
    assert nccl == ["NCCL home not found: HOROVOD_NCCL_HOME=/opt/no-nccl-here has no include/nccl.h and lib/libnccl.so"]
    gpu_here = bool(real_gpus() or os.environ.get("CUDA_VISIBLE_DEVICES"))  # what preflight counts as a GPU
    assert any("no GPU visible" in w for w in checked.warnings) is not gpu_here, checked.warnings
    with pytest.raises(HPCAIError, match="preflight found"):
        checked.raise_for_problems()


def test_preflight_cli_fails_with_the_fix(tmp_path: Path) -> None:
    recipe = tmp_path / "old.yaml"
    recipe.write_text(HOROVOD_RECIPE + "build: {min_gcc: '99.1'}\n")
    done = subprocess.run([HPCAI, "env", "preflight", str(recipe)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 1 and "is older than 99.1" in done.stdout and "fix: module load" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
