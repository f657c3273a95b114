"""Fixtures (and pytest hooks) only: the dev cluster, a local conda channel, built envs, JupyterLab in a job, the
hub, benchmarks. Helpers are in tests/helpers/."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import machine, record
from helpers.channel import add_binary, index, make_package
from helpers.envs import LIB_SOURCE, MODULEFILE, SMALL_RECIPE, shipped_env
from helpers.kernels import JobLab, lab_in_job
from jupyter_hpcai.envs import Builder, EnvDir, EnvStore, load_recipe, open_env

pytest_plugins = ["jupyter_hpcai.devcluster.pytest_plugin"]


@pytest.fixture(scope="session")
def bench() -> list[str]:
    """Append benchmark lines here; they are printed at the end of the run (never asserted)."""
    return record.BENCH


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    record.report(terminalreporter)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Each test (with the fixtures it sets up and tears down) beside the other process's, or alone (helpers/machine.py)."""
    with machine.share(alone=item.get_closest_marker("alone") is not None):
        yield


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    record.timed(report)


def pytest_sessionfinish(session: pytest.Session) -> None:
    record.handed(session.config)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's, in the main process
def pytest_testnodedown(node: Any, error: Any) -> None:
    record.received(getattr(node, "workeroutput", {}))


def pytest_itemcollected(item: pytest.Item) -> None:
    """A test that uses the dev cluster (its fixture, or marked so) is marked ``slurm``, and one that asks for the
    bench fixture itself ``benchmark``, as it is collected (before -m selects)."""
    if "devcluster" in getattr(item, "fixturenames", ()) or item.get_closest_marker("slurm"):
        item.add_marker(pytest.mark.slurm)
    function = getattr(item, "function", None)  # its own arguments, not those of the fixtures it uses
    if function is not None and "bench" in inspect.signature(function).parameters:
        item.add_marker(pytest.mark.benchmark)


# The longest files of a full run (3-12 minutes each, in this order), run first: scripts/test.sh hands whole files to
# its two processes (each with a dev cluster of its own) as they free up, so neither is left with one at the end.
LONGEST_FILES = ("test_bench.py", "test_engines.py", "test_elastic.py", "test_continuity.py", "test_containers.py",
                 "test_hub_load.py", "test_spawner.py", "test_torch.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first, each file's tests in their own order."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_configure(config: pytest.Config) -> None:
    """A suite started in the background (``nohup ... &``) inherits SIGINT ignored, and so would every CLI it
    starts: the Ctrl-C tests need it delivered, so the children get the default disposition back. The main process
    samples the machine's busy cores for the run's timeline."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if not hasattr(config, "workerinput"):
        record.sample_the_machine()


@pytest.fixture(scope="session")
def conda_channel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local conda channel with tiny packages:

    - hpcai-test-activate: an activate.d script that sets HPCAI_TEST_ACTIVATED and extends PATH;
    - hpcai-test-lib: a real shared library, lib/libhpcaitest.so (hpcai_answer() == 42);
    - hpcai-test-six: a six.py in site-packages, which the pip layer's six then overwrites.
    """
    channel = tmp_path_factory.mktemp("channel")
    lib = channel / "libhpcaitest.so"
    src = channel / "lib.c"
    src.write_text(LIB_SOURCE)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=60)
    make_package(channel, "hpcai-test-activate", "1.0", {
        "etc/conda/activate.d/hpcai-test.sh":
            'export HPCAI_TEST_ACTIVATED=yes\nexport PATH="$CONDA_PREFIX/opt/hpcai-test/bin:$PATH"\n',
        "opt/hpcai-test/bin/hpcai-test-tool.sh": "#!/bin/sh\necho tool-ok\n",
    })
    make_package(channel, "hpcai-test-lib", "1.0", {}, depends=("hpcai-test-activate",))
    # make_package takes text; a binary library goes in by rebuilding the tarball with it.
    add_binary(channel / "noarch" / "hpcai-test-lib-1.0-0.tar.bz2", "lib/libhpcaitest.so", lib.read_bytes())
    make_package(channel, "hpcai-test-lib", "2.0", {"lib/hpcai-test-lib-2.txt": "2\n"}, depends=("hpcai-test-activate",))
    make_package(channel, "hpcai-test-six", "1.0", {"lib/python3.11/site-packages/six.py": "# the conda package's six\n"})
    index(channel)
    return channel


@pytest.fixture(scope="session")
def small_recipe(conda_channel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("recipes") / "small.yaml"
    path.write_text(SMALL_RECIPE.format(channel=conda_channel))
    return path


@pytest.fixture(scope="session")
def env_store(tmp_path_factory: pytest.TempPathFactory) -> EnvStore:
    return EnvStore(tmp_path_factory.mktemp("envs"))


@pytest.fixture(scope="session")
def small_env(small_recipe: Path, env_store: EnvStore, bench: list[str]) -> EnvDir:
    """The small env built from the local channel (conda layer) and PyPI (pip layer)."""
    result = Builder(load_recipe(small_recipe), store=env_store).run()
    return result.env_dir


@pytest.fixture(scope="session")
def tf_env() -> EnvDir:
    """The real tf-horovod-cpu env (TensorFlow 2.15.1, Horovod 0.28.1 with Gloo and MPI)."""
    return shipped_env("tf-horovod-cpu")


@pytest.fixture(scope="session")
def torch_env() -> EnvDir:
    """The real torch-cpu env (torch 2.13.0, Gloo)."""
    return shipped_env("torch-cpu")


@pytest.fixture(scope="session")
def kernel_env(small_recipe: Path, env_store: EnvStore, tmp_path_factory: pytest.TempPathFactory) -> EnvDir:
    """The small env plus ipykernel and a real Lmod module; its kernelspec is on JUPYTER_PATH."""
    from jupyter_hpcai import kernelspec

    modules = tmp_path_factory.mktemp("modulefiles")
    (modules / "hpcai-test").mkdir()
    (modules / "hpcai-test" / "1.0.lua").write_text(MODULEFILE)
    os.environ["MODULEPATH"] = str(modules)
    recipe = small_recipe.parent / "kernel.yaml"
    recipe.write_text(small_recipe.read_text().replace("name: small", "name: kernel")
                      .replace("pip: [six==1.16.0]", "pip: [six==1.16.0, ipykernel]")
                      + "modules: [hpcai-test/1.0]\n")
    env = Builder(load_recipe(recipe), store=env_store).run().env_dir
    jupyter = tmp_path_factory.mktemp("jupyter")
    kernelspec.install(open_env(env), prefix=str(jupyter))
    os.environ["JUPYTER_PATH"] = str(jupyter / "share" / "jupyter")
    return env


@pytest.fixture(scope="module")
def job_lab(devcluster, tf_env: EnvDir, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobLab]:  # type: ignore[no-untyped-def]
    """JupyterLab (with the jupyter-hpcai extension) inside a 1-node job with 2 fake GPUs."""
    with lab_in_job(tf_env, tmp_path_factory.mktemp("job-lab")) as lab:
        yield lab


@pytest.fixture(scope="session")
def hub(devcluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator["Hub"]:  # type: ignore[no-untyped-def]  # noqa: F821
    """A real JupyterHub with the demo config, spawning as the real unix user hpcai-alice."""
    from helpers.hub import USER, Hub, demo_config_with, ensure_user

    ensure_user(USER)
    folder = tmp_path_factory.mktemp("hub")
    # its tests start many servers, and report ports, for one user within a minute, as no person does; the
    # hostile-input test alone sends 300 refused starts (test_fair_hub.py tests the limit on a hub of its own)
    config = demo_config_with(folder, "c.HPCSlurmSpawner.hub_api_per_minute = 600")
    hub = Hub(folder, environ={"HPCAI_HUB_LOG_LEVEL": "DEBUG"}, config=config)  # all it logs is searched
    hub.start()
    hub.api("POST", f"/users/{USER}")  # 201, or 409 when a restarted hub already has the user
    yield hub
    if hub.proc and hub.proc.poll() is None and hub.server(USER) is not None:
        hub.stop_server(USER)
    hub.stop(proxy=True)
    subprocess.run(["scancel", "--user", USER], timeout=30, check=False)
