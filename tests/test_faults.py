"""Faults and security on a real allocation: a killed controller, ranks that cannot start or cannot start MPI,
a read-only manifest, private connection files, the controller's bind address. Each fault is survived: nothing
is lost and the user is told."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers.kernels import JobKernel, kernel_in_job
from jupyter_hpcai.devcluster.cluster import SEPARATE
from jupyter_hpcai.envs import Builder, EnvStore, Event, load_recipe
from jupyter_hpcai.errors import HPCAIError

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def world(devcluster, tf_env, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with kernel_in_job(tf_env, tmp_path_factory.mktemp("faults-kernel"), ("-N2", "--ntasks-per-node=1",
                                                                           "--gpus-per-node=1")) as kernel:
        assert kernel.run("%load_ext jupyter_hpcai").status == "ok"
        assert kernel.run("%hpc start").status == "ok"
        yield kernel


def test_connection_files_are_private_and_controller_binds_the_node_address(world: JobKernel, devcluster) -> None:  # type: ignore[no-untyped-def]
    info = json.loads(world.run("import json, os, jupyter_hpcai.engines as E; c = E.current().set.cluster\n"
                                "print(json.dumps({'dir': c.profile_dir, 'id': c.cluster_id, "
                                "'pid': c.controller.process.pid, 'node': os.environ['SLURMD_NODENAME']}))").stdout)
    security = Path(info["dir"]) / "security"
    assert stat.S_IMODE(security.stat().st_mode) == 0o700  # nobody else may even list it
    files = [f for f in security.iterdir() if f.name.startswith(f"ipcontroller-{info['id']}")]  # the keys
    assert len(files) == 2 and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    # the sockets as the kernel's node sees them (with separate hosts, this host sees none of them)
    listening = world.run("import subprocess; print(subprocess.run(['ss', '-ltnpH'], capture_output=True, text=True,"
                          " timeout=30).stdout)").stdout
    ours = [ln.split()[3] for ln in listening.splitlines() if f"pid={info['pid']}," in ln]
    node_address = devcluster.node_address(info["node"])
    print(f"dev cluster: {devcluster.mode}; controller on {info['node']} listens on {ours}")
    assert ours and all(addr.startswith(f"{node_address}:") for addr in ours), ours  # the NodeAddr, never 0.0.0.0
    if devcluster.mode == SEPARATE:  # the node's own address, told apart from the loopback fallback
        assert not node_address.startswith("127."), node_address
    # another unix user cannot read the keys that let a client drive these engines
    reader = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "cat", str(files[0])],
                            capture_output=True, text=True, timeout=30)
    assert reader.returncode != 0 and "Permission denied" in reader.stderr


def test_killed_controller_is_reported_and_restart_recovers(world: JobKernel) -> None:
    pid = int(world.run("import jupyter_hpcai.engines as E; E.current().set.cluster.controller.process.pid").result or 0)
    world.client.execute("%%horovod_run\nimport time\ntime.sleep(120)", stop_on_error=False)  # see JobKernel.run
    os.kill(pid, signal.SIGKILL)
    reply = world.client.get_shell_msg(timeout=120)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "RankFailure"
    assert "controller died" in reply["content"]["evalue"] and "%hpc restart" in reply["content"]["evalue"]
    assert world.run("6 * 7").result == "42", "the notebook kernel lives on"
    restarted = world.run("%hpc restart")
    assert restarted.status == "ok", restarted.error
    cell = world.run("%%horovod_run\nhvd.size()")
    assert cell.status == "ok" and cell.result == "2"


def test_stopped_slurmd_leaves_running_ranks_working(world: JobKernel, devcluster) -> None:  # type: ignore[no-untyped-def]
    """slurmd on n2 dies mid-training and is restarted within SlurmdTimeout (60 s here), as an admin or
    systemd would: the running ranks never needed it, the cell finishes, the job and the node stay up."""
    from jupyter_hpcai.scheduler import slurm
    from jupyter_hpcai.proc import wait_until

    assert world.run("%hpc status").status == "ok"
    slurmd = next(d for d in devcluster.daemons() if d.name == "slurmd n2")
    pid = slurmd.pid()
    assert pid
    world.client.execute("%%horovod_run\nimport time, tensorflow as tf\ntime.sleep(8)\n"
                         "float(hvd.allreduce(tf.constant(float(rank + 1)), op=hvd.Sum))")
    os.kill(pid, signal.SIGKILL)  # during the cell
    reply = world.client.get_shell_msg(timeout=120)
    assert reply["content"]["status"] == "ok", reply["content"]
    assert world.run("%%horovod_run -o ranks\nrank").status == "ok"
    assert world.run("ranks").result == "[0, 1]", "both ranks (n1, n2) still answer"
    devcluster.up()  # restart the stopped slurmd (idempotent: only what is not running starts)
    assert slurmd.pid() not in (None, pid)
    job = slurm.job_info(str(world.job_id))
    assert job and job["JobState"] == "RUNNING"  # the notebook's job was never lost
    wait_until(lambda: all(n.usable for n in slurm.nodes()), timeout=60, what="n2 to be usable again")
    assert world.run("%hpc restart").status == "ok"  # a new srun step reaches n2 again
    assert world.run("%%horovod_run\nhvd.size()").result == "2"


@contextmanager
def broken_rank_environment(world: JobKernel, name: str, value: str) -> Iterator[None]:
    """``name=value`` in the kernel's environment, which the ranks it starts inherit. Inside, the test breaks
    the ranks; after it the kernel must still answer, and with the variable gone a restart must bring both
    ranks back."""
    assert world.run(f"import os\nos.environ[{name!r}] = {value!r}").status == "ok"
    try:
        yield
        assert world.run("6 * 7").result == "42", "the notebook kernel lives on"
    finally:
        assert world.run(f"del os.environ[{name!r}]").status == "ok"
    restarted = world.run("%hpc restart")
    assert restarted.status == "ok", restarted.error
    assert world.run("%%horovod_run\nhvd.size()").result == "2"


def test_mpi_that_cannot_start_is_reported_in_its_own_words(world: JobKernel) -> None:
    """A bad MPI setting makes every rank abort in hvd.init() (Horovod over MPI, HPCAI_HOROVOD_CONTROLLER=mpi): the
    cell shows what Open MPI and srun said (not only 'engine died')."""
    with broken_rank_environment(world, "HPCAI_HOROVOD_CONTROLLER", "mpi"), \
            broken_rank_environment(world, "OMPI_MCA_pml", "no_such_pml"):
        # the ranks initialise Horovod as they boot: they die after registering (TensorFlow's import takes
        # longer), so the first cell reports it; if one died first, %hpc restart says so itself
        cell = world.run("%hpc restart", timeout=180)
        if cell.status == "ok":
            cell = world.run("%%horovod_run\nhvd.size()", timeout=180)
            assert cell.status == "error" and "initialising horovod failed" in cell.error, cell.error
            assert "the launcher said:" in cell.error, cell.error
        else:
            assert "the engine launcher exited before" in cell.error, cell.error
        assert "Component: no_such_pml" in cell.error, cell.error  # Open MPI's
        assert "A requested component was not found" in cell.error, cell.error  # the block that names the cause, whole
        assert "MPI_Init" in cell.error and "srun: error:" in cell.error, cell.error


def test_engines_that_cannot_start_are_reported_at_once(world: JobKernel, tmp_path: Path) -> None:
    """An env broken on the nodes (here: a sitecustomize on PYTHONPATH makes python exit in every rank of the
    srun step, PMIX_RANK set; the controller beside the kernel is unaffected): the launcher exits, and
    %hpc start says so with the ranks' own words, without waiting out its 180 s for registrations."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os\nif 'PMIX_RANK' in os.environ:\n    raise SystemExit('the env is broken on this node')\n")
    with broken_rank_environment(world, "PYTHONPATH", str(tmp_path)):
        cell = world.run("%hpc start")  # after 180 s, "only 0 of 2 engines registered" if the exit went unnoticed
        assert cell.status == "error" and "the engine launcher exited before 2 engines registered" in cell.error
        assert "the env is broken on this node" in cell.error and "srun: error:" in cell.error, cell.error


def test_unwritable_manifest_fails_the_build_and_keeps_the_env(small_recipe: Path, env_store: EnvStore) -> None:
    """The manifest is written last, before `current` moves: if it cannot be written, nothing changes."""
    name = "readonly"
    Builder(load_recipe(small_recipe), store=env_store, name=name).run()
    env = env_store.env(name)
    before = env.current()
    builds = env.path / "builds"
    changed = small_recipe.parent / "readonly.yaml"
    changed.write_text(small_recipe.read_text().replace("six==1.16.0", "six==1.17.0"))

    def block_meta(event: Event) -> None:
        """Once verify passed, put a file where the new build's .hpcai/ folder goes (root ignores read-only modes)."""
        if event.phase == "verify" and event.state == "done":
            for build in builds.iterdir():
                if build.name != before.id:  # type: ignore[union-attr]
                    shutil.rmtree(build / ".hpcai", ignore_errors=True)
                    (build / ".hpcai").write_text("in the way")

    with pytest.raises(HPCAIError) as err:
        Builder(load_recipe(changed), store=env_store, name=name, progress=block_meta).run()
    assert "cannot write the manifest" in err.value.message
    assert "is still current" in err.value.hint and "full log" in err.value.hint
    assert env.current() == before and [(p.name, p.version) for p in before.manifest().pip] == [("six", "1.16.0")]  # type: ignore[union-attr,index]
