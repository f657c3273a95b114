"""Session fixtures shared by every test: the dev cluster, a local conda channel, built envs, benchmarks."""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from condachan import index, make_package
from jupyter_hpcai.envs import Builder, EnvDir, EnvStore, load_recipe, open_env
from jupyter_hpcai.spawner.script import NODE_ADDRESS

pytest_plugins = ["jupyter_hpcai.devcluster.pytest_plugin"]

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
_BENCH: list[str] = []
_ATTACKS: list[tuple[str, str, str]] = []  # (attack, "blocked" or "LEAKED", what was observed)


def attack(name: str, blocked: bool, observed: str) -> None:
    """Record one attack's outcome for the run's table (printed, and written to test-artifacts/), then fail the
    test if it was not blocked: the table shows every attack tried, the leaks included."""
    _ATTACKS.append((name, "blocked" if blocked else "LEAKED", observed))
    assert blocked, f"{name}: {observed}"


@pytest.fixture(scope="session")
def bench() -> list[str]:
    """Append benchmark lines here; they are printed at the end of the run (never asserted)."""
    return _BENCH


def pytest_configure(config: pytest.Config) -> None:
    """A suite started in the background (``nohup ... &``) inherits SIGINT ignored, and so would every CLI it
    starts: the Ctrl-C tests need it delivered, so the children get the default disposition back."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from jupyter_hpcai.bench.stamp import stamp

    made = stamp()
    if _ATTACKS:
        blocked = f"{sum(o == 'blocked' for _, o, _ in _ATTACKS)} of {len(_ATTACKS)} blocked"
        rows = ["| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in row) + " |"
                for row in _ATTACKS]
        table = [f"# Attacks tried by the test run of {made}", "",
                 f"{blocked}.", "",
                 "| attack | outcome | observed |", "|---|---|---|", *rows]
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "security-attacks.md").write_text("\n".join(table) + "\n")
        terminalreporter.section(f"attacks tried: {blocked} (test-artifacts/security-attacks.md)")
        for name, outcome, seen in _ATTACKS:
            terminalreporter.write_line(f"{outcome:8} {name}: {seen}")
    if _BENCH:
        terminalreporter.section(f"benchmarks (ratios against a baseline measured in the same run): {made}")
        for line in _BENCH:
            terminalreporter.write_line(line)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "measured.md").write_text(f"# Measured by the test run of {made}\n\nRatios against a baseline "
                                               "measured in the same run (printed, never asserted).\n\n"
                                               + "".join(f"- {line}\n" for line in _BENCH))


LIB_SOURCE = "int hpcai_answer(void) { return 42; }\n"


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
    _add_binary(channel / "noarch" / "hpcai-test-lib-1.0-0.tar.bz2", "lib/libhpcaitest.so", lib.read_bytes())
    make_package(channel, "hpcai-test-lib", "2.0", {"lib/hpcai-test-lib-2.txt": "2\n"}, depends=("hpcai-test-activate",))
    make_package(channel, "hpcai-test-six", "1.0", {"lib/python3.11/site-packages/six.py": "# the conda package's six\n"})
    index(channel)
    return channel


def _add_binary(package: Path, path: str, data: bytes) -> None:
    import hashlib
    import io
    import json
    import tarfile

    with tarfile.open(package) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    paths = json.loads(members["info/paths.json"])
    paths["paths"].append({"_path": path, "path_type": "hardlink", "sha256": hashlib.sha256(data).hexdigest(),
                           "size_in_bytes": len(data)})
    members["info/paths.json"] = json.dumps(paths).encode()
    members["info/files"] += f"{path}\n".encode()
    members[path] = data
    with tarfile.open(package, "w:bz2") as tar:
        for name, blob in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(blob), 0o755
            tar.addfile(info, io.BytesIO(blob))


SMALL_RECIPE = """
name: small
conda:
  channels: [{channel}]
  specs: [hpcai-test-lib=1.0, hpcai-test-six]
python: /usr/bin/python3
pip: [six==1.16.0]
activate:
  LD_LIBRARY_PATH: ${{CONDA_PREFIX}}/lib:${{LD_LIBRARY_PATH}}
verify:
  imports: [six]
  commands:
    - run: hpcai-test-tool.sh
      expect: [tool-ok]
"""


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
    return result.dir


def _shipped_env(recipe: str) -> EnvDir:
    """A shipped recipe's env, in a store outside the checkout that persists between runs: rebuilt only
    when the recipe changed (jupyter_hpcai is installed editable, so code changes need no rebuild)."""
    store = EnvStore(Path(os.environ.get("HPCAI_TEST_ENV_ROOT", "/opt/hpcai/envs")))
    return Builder(load_recipe(REPO / "recipes" / f"{recipe}.yaml"), store=store).run().dir


@pytest.fixture(scope="session")
def tf_env() -> EnvDir:
    """The real tf-horovod-cpu env (TensorFlow 2.15.1, Horovod 0.28.1 with Gloo and MPI)."""
    return _shipped_env("tf-horovod-cpu")


@pytest.fixture(scope="session")
def torch_env() -> EnvDir:
    """The real torch-cpu env (torch 2.13.0, Gloo)."""
    return _shipped_env("torch-cpu")


MODULEFILE = """-- a real Lmod modulefile, loaded by the kernel env's activation
setenv("HPCAI_TEST_MODULE", "loaded")
prepend_path("PATH", "/opt/hpcai-test-module/bin")
"""


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
    env = Builder(load_recipe(recipe), store=env_store).run().dir
    jupyter = tmp_path_factory.mktemp("jupyter")
    kernelspec.install(open_env(env), prefix=str(jupyter))
    os.environ["JUPYTER_PATH"] = str(jupyter / "share" / "jupyter")
    return env


ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Cell:
    status: str
    stdout: str = ""
    error: str = ""  # the error's rendering (ename, message, hint or traceback), ANSI colours removed
    result: str | None = None
    displays: list[str] = field(default_factory=list)  # display_data and update_display_data, as text/plain


class JobKernel:
    """A real Jupyter kernel (started through the hpcai-env provisioner) inside a dev-cluster job."""

    def __init__(self, connection_file: Path, job_id: int) -> None:
        from jupyter_client import BlockingKernelClient

        self.job_id = job_id
        self.client = BlockingKernelClient()
        self.client.load_connection_file(str(connection_file))
        # no KernelManager here: "alive" is the heartbeat, and a kernel starting slowly (a loaded machine, or
        # python in proot) must not count as dead after the default 1 s without a beat
        self.client.hb_channel.time_to_dead = 30.0
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)
        self.pid = int(self.run("import os; os.getpid()").result or 0)

    def run(self, code: str, timeout: float = 300) -> Cell:
        cell = Cell(status="")

        def hook(msg: dict) -> None:  # type: ignore[type-arg]
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                cell.stdout += content["text"]
            elif kind == "error":
                cell.error = ANSI.sub("", "\n".join(content["traceback"]) or f"{content['ename']}: {content['evalue']}")
            elif kind == "execute_result":
                cell.result = content["data"]["text/plain"]
            elif kind in ("display_data", "update_display_data"):
                cell.displays.append(content["data"].get("text/plain", ""))

        # stop_on_error=False: ipykernel 7 aborts an execute request that reaches it in the instant after an error
        # reply (its abort flag is cleared by a message it queues itself). A person never sends that fast; a test
        # does, and would see 'aborted' for a cell that followed an error. Nothing is ever queued here anyway.
        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=hook, stop_on_error=False)
        cell.status = reply["content"]["status"]
        return cell


# NODE_ADDRESS, in a job's shell line: the node's address as Slurm knows it (the job script's own expression),
# where the test (on the login node) reaches a server or kernel that the job starts (the node's loopback is its own).


def job_node_address(job: int) -> str:
    """The Slurm address of the first node of ``job``, once it runs."""
    from jupyter_hpcai import slurm
    from jupyter_hpcai.proc import wait_until

    def batch_host() -> str | None:
        host = (slurm.job_info(job) or {}).get("BatchHost", "")
        return host if host not in ("", "(null)") else None

    host = wait_until(batch_host, timeout=300, what=f"job {job} to start")
    return slurm.node_address(host)


@contextmanager
def kernel_in_job(env: EnvDir, work: Path, sbatch_args: tuple[str, ...] = ("-N2", "--ntasks-per-node=2", "--gpus-per-node=2"),
                  environ: dict[str, str] | None = None) -> Iterator[JobKernel]:
    """A notebook kernel in ``env`` (through the hpcai-env provisioner), inside a dev-cluster job (the job's
    environment: this process's, updated with ``environ``)."""
    from jupyter_hpcai import slurm

    connection = work / "kernel.json"
    job = slurm.sbatch([*sbatch_args, "--time=00:45:00", f"--output={work}/job.out",
                        "--wrap", f"{_kernel_command(env, work, connection)} --KernelManager.ip={NODE_ADDRESS}"],
                       env={**os.environ, **(environ or {}), "JUPYTER_PATH": str(work / "share" / "jupyter")})
    try:
        with _connected(connection, lambda: job) as kernel:
            yield kernel
    finally:
        subprocess.run(["scancel", str(job)], timeout=30, check=False)


@contextmanager
def kernel_beside_job(env: EnvDir, work: Path, salloc_args: tuple[str, ...] = ("-N2", "--ntasks-per-node=2",
                                                                                  "--gpus-per-node=2")) -> Iterator[JobKernel]:
    """A notebook kernel in ``env`` on this host, the login node, under ``salloc``: the allocation's variables are
    set, the kernel is on no node, and only job steps run on the nodes (a login-node JupyterLab, Open OnDemand)."""
    import shlex

    connection, log = work / "kernel.json", work / "salloc.out"
    with open(log, "w") as out:
        salloc = subprocess.Popen(["salloc", *salloc_args, "--time=00:30:00",
                                   *shlex.split(_kernel_command(env, work, connection))],
                                  env={**os.environ, "JUPYTER_PATH": str(work / "share" / "jupyter")},
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    def granted() -> int:
        found = re.search(r"Granted job allocation (\d+)", log.read_text())
        return int(found[1]) if found else 0

    kernel_pid = 0
    try:
        with _connected(connection, granted) as kernel:
            kernel_pid = kernel.pid
            yield kernel
    finally:
        if granted():
            subprocess.run(["scancel", str(granted())], timeout=30, check=False)
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):  # jupyter-kernel may linger on SIGTERM
            os.killpg(salloc.pid, sig)
            try:
                salloc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        _kill_kernel(kernel_pid)  # salloc runs jupyter-kernel in a process group of its own: killpg missed it


@contextmanager
def kernel_outside_job(env: EnvDir, work: Path, environ: dict[str, str] | None = None) -> Iterator[JobKernel]:
    """A notebook kernel in ``env`` on this host, the login node, in no Slurm job at all (a login-node JupyterLab
    without salloc); its environment: this process's without any SLURM_* variable, updated with ``environ``."""
    import shlex

    connection = work / "kernel.json"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_JOB") and k != "SLURM_NODELIST"}
    with open(work / "kernel.out", "w") as out:
        kernel = subprocess.Popen(shlex.split(_kernel_command(env, work, connection)), stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True,
                                  env={**clean, **(environ or {}), "JUPYTER_PATH": str(work / "share" / "jupyter")})
    kernel_pid = 0
    try:
        with _connected(connection, lambda: 0) as connected:
            kernel_pid = connected.pid
            yield connected
    finally:
        _kill_kernel(kernel_pid)  # in a session of its own (jupyter-kernel starts it so)
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
            try:
                os.killpg(kernel.pid, sig)
                kernel.wait(timeout=grace)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue


def _kill_kernel(pid: int) -> None:
    """SIGKILL a test's kernel and the jupyter-kernel that started it (each leads a process group of its own)."""
    import psutil

    try:
        kernel = psutil.Process(pid) if pid else None
        parent = kernel.parent() if kernel else None
    except psutil.NoSuchProcess:
        return
    for proc in (kernel, parent):
        with suppress(psutil.NoSuchProcess):
            if proc is not None and (proc is kernel or "jupyter-kernel" in " ".join(proc.cmdline())):
                proc.kill()


def _kernel_command(env: EnvDir, work: Path, connection: Path) -> str:
    """The command line of a kernel in ``env`` (its kernelspec installed under ``work``) writing ``connection``."""
    import sys

    from jupyter_hpcai import kernelspec

    kernelspec.install(open_env(env), prefix=str(work))
    return (f"{Path(sys.executable).parent}/jupyter-kernel --kernel={kernelspec.kernel_name(env)} "
            f"--KernelManager.connection_file={connection}")


@contextmanager
def _connected(connection: Path, job: Callable[[], int]) -> Iterator[JobKernel]:
    """A client of the kernel of ``job()``, once it has written ``connection``; its channels stopped after."""
    from jupyter_hpcai.proc import wait_until

    wait_until(lambda: _whole_json(connection), timeout=300, what="the kernel to write its connection file")
    kernel = JobKernel(connection, job())
    yield kernel
    kernel.client.stop_channels()


def _whole_json(path: Path) -> dict | None:  # type: ignore[type-arg]
    """The file's JSON once it is there and completely written (it exists, empty, while it is written)."""
    try:
        return json.loads(path.read_text()) or None
    except (FileNotFoundError, ValueError):
        return None


@dataclass
class JobLab:
    url: str
    token: str
    root: Path
    job_id: int


@pytest.fixture(scope="module")
def job_lab(devcluster, tf_env: EnvDir, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JobLab]:  # type: ignore[no-untyped-def]
    """JupyterLab (with the jupyter-hpcai extension) inside a 1-node job with 2 fake GPUs."""
    with lab_in_job(tf_env, tmp_path_factory.mktemp("job-lab")) as lab:
        yield lab


@contextmanager
def lab_in_job(tf_env: EnvDir, work: Path, walltime: str = "00:30:00") -> Iterator[JobLab]:
    """JupyterLab inside a 1-node job with 2 fake GPUs and ``walltime``; the job is cancelled afterwards."""
    import secrets
    import sys

    from jupyter_helpers import Server, answers, free_port
    from jupyter_hpcai import kernelspec, slurm
    from jupyter_hpcai.proc import wait_until

    kernelspec.install(open_env(tf_env), prefix=str(work))
    settings = work / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    port, token = free_port(), secrets.token_hex(16)
    cmd = (f"{Path(sys.executable).parent}/jupyter-lab --no-browser --allow-root --ip={NODE_ADDRESS} --port={port} "
           f"--IdentityProvider.token={token} --ServerApp.root_dir={work}")
    job = slurm.sbatch(["-N1", "--ntasks-per-node=2", "--gpus-per-node=2", f"--time={walltime}",
                        f"--output={work}/lab.log", "--wrap", cmd],
                       env={**os.environ, "JUPYTER_PATH": str(work / "share" / "jupyter"),
                            "JUPYTERLAB_SETTINGS_DIR": str(work / "settings"), "IPYTHONDIR": str(work / "ipython")})
    try:
        address = job_node_address(job)

        def serving() -> str | None:  # the port it took: ours, or the next one when ours was taken on the node
            log = work / "lab.log"
            found = re.search(rf"http://{re.escape(address)}:(\d+)/lab", log.read_text(errors="replace") if log.exists() else "")
            return f"http://{address}:{found.group(1)}" if found else None

        url = wait_until(serving, timeout=120, what=f"JupyterLab in job {job} to start (its log: {work}/lab.log)")
        lab = JobLab(url, token, work, job)
        wait_until(lambda: answers(Server(lab.url, token, work / "lab.log")), timeout=60,
                   what=f"JupyterLab in job {job} to answer (its log: {work}/lab.log)")
        yield lab
    finally:
        subprocess.run(["scancel", str(job)], timeout=30, check=False)


@pytest.fixture(scope="session")
def hub(devcluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator["Hub"]:  # type: ignore[no-untyped-def]  # noqa: F821
    """A real JupyterHub with the demo config, spawning as the real unix user hpcai-alice."""
    from hub_helpers import USER, Hub, ensure_user

    ensure_user(USER)
    hub = Hub(tmp_path_factory.mktemp("hub"), environ={"HPCAI_HUB_LOG_LEVEL": "DEBUG"})  # all it logs is searched
    hub.start()
    hub.api("POST", f"/users/{USER}")  # 201, or 409 when a restarted hub already has the user
    yield hub
    if hub.proc and hub.proc.poll() is None and hub.server(USER) is not None:
        hub.stop_server(USER)
    hub.stop(proxy=True)
    subprocess.run(["scancel", "--user", USER], timeout=30, check=False)
