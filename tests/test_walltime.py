"""The walltime guard's parts without a cluster: the batch script's trap run by a real bash, the profile's
setting, the ranks' hooks once per signal, a checkpoint saved whole and restored.

Fake here: the model in the checkpoint test is a stand-in with Keras's get_weights/set_weights (numpy
arrays); test_continuity.py saves and restores a real Keras model through the hub.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from jupyter_hpcai import guard
from jupyter_hpcai.scheduler import allocation
from jupyter_hpcai.ranks import continuity
from jupyter_hpcai.ranks.identity import rank_ranges
from jupyter_hpcai.proc import wait_until
from jupyter_hpcai.spawner import script
from jupyter_hpcai.spawner.options import Profile, SpawnOptions

OPTIONS = SpawnOptions(profile="p", partition="gpu", nodes=1, gpus_per_node=1, walltime="00:03:00")


def _render(warning: int, cmd: list[str], home: str = "/home/alice") -> str:
    return script.render(OPTIONS, Profile(name="p", partition="gpu"), user="alice", homedir=home, keepvars="PATH",
                         cmd=cmd, bind_node_address=False, walltime_warning=warning)


def test_the_script_asks_for_the_signal_at_most_half_the_walltime() -> None:
    assert "#SBATCH --signal=B:USR1@60\n" in _render(60, ["server"])
    assert "#SBATCH --signal=B:USR1@90\n" in _render(600, ["server"])  # a 3-minute job: half of it
    plain = _render(0, ["server"])
    assert "--signal" not in plain and "USR1" not in plain and " server || status=$?;" in plain


def test_the_jobs_end_stops_engines_that_outlived_their_kernel(tmp_path: Path) -> None:
    """Slurm's SIGTERM at the job's end (scancel, the walltime) runs the batch shell's exit: the processes an
    engine set recorded are stopped if they are this job's (here: started with its SLURM_JOB_ID, their parent
    gone, as a controller is when its kernel died), a recorded pid now another job's is left alone."""
    path = tmp_path / "job.sh"
    path.write_text(_render(0, ["sleep", "300"], home=str(tmp_path)))
    job = subprocess.Popen(["bash", str(path)], env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "77"},
                           start_new_session=True)
    state = tmp_path / ".hpcai" / "jobs" / "77"
    wait_until(lambda: state.is_dir() or None, timeout=10, what="the job's folder")
    # the server's subshell forked and running its command: a signal before that would find bash mid-fork
    serving = ["pgrep", "--pgroup", str(job.pid), "--exact", "sleep"]
    wait_until(lambda: subprocess.run(serving, capture_output=True).returncode == 0 or None, timeout=10,
               what="the job's server")
    ours, other = (subprocess.Popen(["sleep", "300"], start_new_session=True,
                                    env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": job_id}) for job_id in ("77", "78"))
    (state / "engines").mkdir(mode=0o700)
    (state / "engines" / "hpcai-77-1-0").write_text(f"{ours.pid} {other.pid}\n")
    os.killpg(job.pid, signal.SIGTERM)  # as Slurm signals every process of the batch step
    assert job.wait(timeout=30) == 128 + signal.SIGTERM  # the trap's exit, after the job's end ran
    try:
        assert ours.wait(timeout=10) == -signal.SIGTERM
        assert other.poll() is None
        assert not state.exists()
    finally:
        for process in (ours, other):
            process.kill()
            process.wait()


def test_the_trap_marks_the_signal_and_the_server_goes_on(tmp_path: Path) -> None:
    """The rendered script in a real bash: USR1 writes the mark, the server keeps running to its own end, its
    exit status is the script's, and the job's folder is gone afterwards."""
    done, go = tmp_path / "server-done", tmp_path / "server-may-end"
    path = tmp_path / "job.sh"
    server = f"until [ -e {go} ]; do sleep 0.1; done; touch {done}; exit 3"  # runs until the test lets it end
    path.write_text(_render(60, ["bash", "-c", server], home=str(tmp_path)))
    job = subprocess.Popen(["bash", str(path)], env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "77"})
    state = tmp_path / ".hpcai" / "jobs" / "77"
    try:
        wait_until(lambda: state.is_dir() or None, timeout=10, what="the job's folder")
        assert state.stat().st_mode & 0o777 == 0o700
        job.send_signal(signal.SIGUSR1)
        mark = wait_until(lambda: allocation.walltime_signal({allocation.JOB_STATE_VAR: str(state)}), timeout=10,
                          what="the walltime mark")
        assert abs(mark - time.time()) < 10 and job.poll() is None  # the server still runs
    finally:
        go.touch()  # the server ends, whatever failed above
    assert job.wait(timeout=30) == 3 and done.exists()
    assert not state.exists()


def test_a_signal_in_the_servers_last_instant_keeps_the_servers_exit_status(tmp_path: Path) -> None:
    """The server ends just as Slurm's USR1 cuts the shell's wait short: the job still ends with the server's own
    status (3). Before the fix every such run ended 138 (the cut wait's status); bash's wait asked once more said
    255 in about one run of four."""
    path, shell = tmp_path / "job.sh", tmp_path / "batch-shell"  # the server signals the pid the test writes there
    server = f"until [ -s {shell} ]; do sleep 0.05; done; kill -USR1 $(cat {shell}); exit 3"
    path.write_text(_render(60, ["bash", "-c", server], home=str(tmp_path)))
    for _ in range(8):
        shell.unlink(missing_ok=True)
        job = subprocess.Popen(["bash", str(path)], env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "77"})
        shell.write_text(str(job.pid))
        assert job.wait(timeout=30) == 3


def test_a_server_whose_status_goes_unrecorded_ends_the_job_with_waits(tmp_path: Path) -> None:
    """The subshell that records the server's status killed (nothing recorded): the job ends with wait's status for
    it (137)."""
    path = tmp_path / "job.sh"
    path.write_text(_render(60, ["bash", "-c", "kill -KILL $PPID; exit 3"], home=str(tmp_path)))
    for _ in range(3):
        job = subprocess.run(["bash", str(path)], env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "77"}, timeout=30,
                             capture_output=True, text=True)
        assert job.returncode == 128 + signal.SIGKILL, job.stderr


def test_profile_setting_overrides_the_spawner() -> None:
    assert Profile(name="p", partition="gpu", walltime_warning=0).walltime_warning == 0
    with pytest.raises(ValueError):
        Profile(name="p", partition="gpu", walltime_warning=-1)


class StandIn:
    """Keras's get_weights/set_weights over numpy arrays."""

    def __init__(self, seed: int) -> None:
        self.weights = [np.random.default_rng(seed).normal(size=(4, 3)), np.zeros(3)]

    def get_weights(self) -> list[np.ndarray]:
        return [w.copy() for w in self.weights]

    def set_weights(self, weights: list[np.ndarray]) -> None:
        self.weights = [w.copy() for w in weights]


@pytest.fixture
def job_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(allocation.JOB_STATE_VAR, str(tmp_path / "job"))
    monkeypatch.setenv(continuity.CHECKPOINT_DIR_VAR, str(tmp_path / "checkpoints"))
    (tmp_path / "job").mkdir()
    monkeypatch.setattr(continuity, "_hooks", {})
    monkeypatch.setattr(continuity, "_checkpoints", {})
    monkeypatch.setattr(continuity, "_steps", 0)
    monkeypatch.setattr(continuity, "_epoch", 0)
    monkeypatch.setattr(continuity, "_next_check", continuity.CHECK_EVERY)
    monkeypatch.setattr(continuity, "_ran_for", None)
    monkeypatch.setattr(continuity, "LOOK_EVERY", 0.0)  # rank 0 looks at every check (once a second in a job)
    return tmp_path / "job"


def test_hooks_run_once_per_signal_at_a_step_boundary(job_state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[int] = []
    continuity.on_walltime(lambda: calls.append(continuity.steps()))
    for _ in range(15):
        continuity.step()
    assert calls == [] and not continuity.pending()
    (job_state / allocation.SIGNAL_MARK).write_text("1000\n")
    assert continuity.pending()
    for _ in range(25):
        continuity.step()
    assert calls == [20]  # the first check after the signal, and only once
    assert "walltime near: ran 1 walltime hook(s) at step 20" in capsys.readouterr().out
    assert continuity.run_pending()["already"] and calls == [20]
    (job_state / allocation.SIGNAL_MARK).write_text("2000\n")  # a second signal (after an extension, say)
    assert continuity.run_pending()["hooks"] == 1 and calls == [20, 40]


def test_a_checkpoint_is_saved_whole_and_restored(job_state: Path) -> None:
    model = StandIn(seed=1)
    ckpt = continuity.Checkpoint(model, name="unit")
    for _ in range(7):
        continuity.step()
    first = ckpt.save()
    model.weights[0] += 1
    for _ in range(3):
        continuity.step()
    continuity._epoch = 2  # as the Keras callback keeps it
    second = ckpt.save()
    continuity._epoch = 5
    assert (first.name, second.name) == ("step-000000007", "step-000000010")
    assert (ckpt.directory / "latest").read_text() == second.name and not list(ckpt.directory.glob(".*partial*"))
    fresh = StandIn(seed=2)
    again = continuity.Checkpoint(fresh, name="unit")
    assert again.restore() == 10 and continuity.steps() == 10 and continuity.epoch() == 2
    assert all(np.array_equal(a, b) for a, b in zip(fresh.weights, model.weights))
    report = continuity.restore_all()
    assert report["step"] == 10 and len(report["restored"]) == 1  # the latest Checkpoint of that name
    for _ in range(3):
        continuity.step()
    ckpt.save()
    assert sorted(p.name for p in ckpt.directory.glob("step-*")) == ["step-000000010", "step-000000013"]  # 2 kept


def test_reports_group_ranks_with_the_same_outcome() -> None:
    same = {"hooks": 1, "seconds": 0.2, "step": 30, "errors": [], "saved": ["/c/step-30"]}
    text = guard.report({0: same, 1: {**same, "seconds": 0.5}, 2: same, 3: {**same, "errors": ["save: OSError: full"]}})
    assert text == ("hpcai: ranks 0-2: ran 1 walltime hook(s) at step 30 in 0.5 s; saved /c/step-30\n"
                    "hpcai: rank 3: ran 1 walltime hook(s) at step 30 in 0.5 s; saved /c/step-30; 1 failed: "
                    "save: OSError: full\n")
    assert rank_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


@pytest.mark.oldest_slurm
@pytest.mark.slurm
def test_the_guard_speaks_in_the_running_cell_of_a_job_kernel(devcluster, tf_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A kernel in a job whose batch shell would write the mark: the warning lands in the cell that runs."""
    import threading

    from helpers.kernels import kernel_in_job

    state = tmp_path / "job-state"
    state.mkdir()
    environ = {allocation.JOB_STATE_VAR: str(state), allocation.WARNING_VAR: "60"}
    with kernel_in_job(tf_env, tmp_path / "kernel", sbatch_args=("-N1", "--ntasks-per-node=1"), environ=environ) as kernel:
        assert kernel.run("%load_ext jupyter_hpcai").status == "ok"
        threading.Timer(3, lambda: (state / allocation.SIGNAL_MARK).write_text(f"{time.time():.0f}\n")).start()
        cell = kernel.run("import time; time.sleep(8); print('cell done')")
        assert cell.status == "ok", cell.error
        assert re.search(rf"hpcai: Slurm job {kernel.job_id} reaches its walltime at \d\d:\d\d:\d\d \(in about \d+ min\)",
                         cell.stdout), cell.stdout
        assert cell.stdout.index("reaches its walltime") < cell.stdout.index("cell done")  # while it ran


def test_the_extend_policy_says_why_not() -> None:
    from jupyter_hpcai.errors import HPCAIError
    from jupyter_hpcai.spawner.extend import new_limit

    policy = {"gpu": "04:00:00"}
    assert new_limit(policy, "gpu", 3600, 1800, None) == 5400
    assert new_limit({"*": "02:00:00"}, "any", 3600, 1800, None) == 5400
    with pytest.raises(HPCAIError, match="does not extend notebook jobs on partition debug"):
        new_limit(policy, "debug", 3600, 1800, None)
    with pytest.raises(HPCAIError, match="would be 05:00:00, over 04:00:00, the most this site allows on gpu") as err:
        new_limit(policy, "gpu", 3600, 4 * 3600, None)
    assert err.value.hint == "ask for at most 03:00:00 more"
    with pytest.raises(HPCAIError, match="over 01:30:00"):  # the partition's own limit caps the policy
        new_limit(policy, "gpu", 3600, 3600, 5400)
    with pytest.raises(HPCAIError) as err:
        new_limit(policy, "gpu", 4 * 3600, 600, None)
    assert "at its longest" in err.value.hint


def test_hooks_registered_after_the_signal_still_run(job_state: Path) -> None:
    (job_state / allocation.SIGNAL_MARK).write_text("1000\n")
    assert continuity.run_pending()["hooks"] == 0 and continuity.pending()  # nothing to run: still pending
    calls: list[int] = []
    continuity.on_walltime(lambda: calls.append(1))
    for _ in range(continuity.CHECK_EVERY):
        continuity.step()
    assert calls == [1] and not continuity.pending()


def test_a_cell_run_again_replaces_its_hooks(job_state: Path) -> None:
    model = StandIn(seed=1)
    for _ in range(2):  # the same registering cell, twice
        continuity.on_walltime(continuity.Checkpoint(model, name="a").save)
    continuity.on_walltime(continuity.Checkpoint(model, name="b").save)
    continuity.on_walltime(lambda: None)
    continuity.on_walltime(lambda: None)
    assert len(continuity._hooks) == 4  # checkpoint a, checkpoint b, two lambdas
    report = continuity.run_hooks()
    assert report["hooks"] == 4 and not report["errors"] and len(report["saved"]) == 2


def test_a_failing_save_is_reported_and_the_others_still_run(job_state: Path) -> None:
    class Full(StandIn):
        def get_weights(self) -> list[np.ndarray]:
            raise OSError("No space left on device")

    continuity.on_walltime(continuity.Checkpoint(Full(seed=1), name="full").save)
    continuity.on_walltime(continuity.Checkpoint(StandIn(seed=2), name="fine").save)
    report = continuity.run_hooks()
    assert len(report["errors"]) == 1 and "OSError: No space left on device" in report["errors"][0]
    assert [Path(p).parent.name for p in report["saved"]] == ["fine"]
    full = continuity.Checkpoint(StandIn(seed=3), name="full").directory
    assert not list(full.glob("step-*")) and not (full / "latest").exists()  # nothing half-written counts


def test_asking_the_hub_without_one_says_what_to_do() -> None:
    from jupyter_hpcai import hub_client
    from jupyter_hpcai.errors import HPCAIError

    with pytest.raises(HPCAIError, match="not started by a JupyterHub"):
        hub_client.extend(600, {})
    with pytest.raises(HPCAIError, match="holds no hub token") as err:
        hub_client.extend(600, {"JUPYTERHUB_API_URL": "http://127.0.0.1:1/hub/api"})
    assert "side panel's Extend" in err.value.hint
    with pytest.raises(HPCAIError, match="the hub at http://127.0.0.1:1/hub/api did not answer"):
        hub_client.follow_up({"JUPYTERHUB_API_URL": "http://127.0.0.1:1/hub/api", "JUPYTERHUB_API_TOKEN": "t"})


def test_a_follow_up_job_waits_for_the_one_it_follows() -> None:
    follow_up = script.render(OPTIONS, Profile(name="p", partition="gpu"), user="alice", homedir="/home/alice",
                              keepvars="PATH", cmd=["server"], bind_node_address=False, after="123")
    assert "#SBATCH --dependency=afterany:123\n" in follow_up
    assert "--dependency" not in _render(60, ["server"])
    with pytest.raises(ValueError):
        script.render(OPTIONS, Profile(name="p", partition="gpu"), user="alice", homedir="/home/alice",
                      keepvars="PATH", cmd=["server"], after="1\n#SBATCH --uid=0")


KERAS = """
import json, os, sys
import numpy as np, tensorflow as tf
from jupyter_hpcai.ranks import continuity as hpc
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
opt = tf.keras.optimizers.SGD(0.1, momentum=0.9)
model.compile(opt, "mse")
x, y = np.ones((8, 4), "float32"), np.zeros((8, 2), "float32")
ckpt = hpc.Checkpoint(model, opt, name="keras-unit")
hpc.on_walltime(ckpt.save)
open(os.path.join(os.environ["HPCAI_JOB_STATE"], "walltime"), "w").write("1000")  # the signal, before training
model.fit(x, y, batch_size=2, epochs=3, verbose=0, callbacks=[hpc.keras_callback(2, stop=True)])
saved = [w.copy() for w in model.get_weights()]
model.fit(x, y, batch_size=2, epochs=2, verbose=0)  # the weights move on
fresh = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
fresh_opt = tf.keras.optimizers.SGD(0.1, momentum=0.9)
step = hpc.Checkpoint(fresh, fresh_opt, name="keras-unit").restore()
print(json.dumps({"step": step, "epoch": hpc.epoch(), "same": all(np.array_equal(a, b) for a, b in zip(saved, fresh.get_weights())),
                  "slots": len(fresh_opt.variables)}))
"""


@pytest.mark.slow  # the tf env (built once per machine)
def test_keras_callback_stops_at_the_signal_and_the_checkpoint_restores(tf_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Real Keras (the tf env's python, one process, no framework: the rank's own flag is the world's): the
    callback runs the hook at the first check after the signal and stops training; a fresh model and
    optimizer restore the saved weights, the optimizer's momentum slots and the step and epoch."""
    import json

    (tmp_path / "job").mkdir()
    env = {**os.environ, allocation.JOB_STATE_VAR: str(tmp_path / "job"),
           continuity.CHECKPOINT_DIR_VAR: str(tmp_path / "checkpoints"), "TF_CPP_MIN_LOG_LEVEL": "3"}
    from jupyter_hpcai.envs import open_env

    done = subprocess.run([open_env(tf_env).python, "-c", KERAS], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"step": 10, "epoch": 2, "same": True, "slots": 3}, found  # 4 batches an epoch: step 10 is in epoch 2
    assert "walltime near: ran 1 walltime hook(s) at step 10" in done.stdout


def test_attach_chooses_the_set_no_kernel_uses_and_names_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which running set `%hpc attach` takes: the one named, else the only one no kernel uses, else the only one;
    several candidates, or none, is an error that lists them."""
    from jupyter_hpcai.engines import listing
    from jupyter_hpcai.errors import HPCAIError

    def a_set(cluster_id: str, owner: int, running: bool = True) -> listing.EngineSet:
        controller = {"state": {"state": "running", "pid": os.getpid()}} if running else None  # a live process
        return listing.EngineSet(Path("/nonexistent"), {"cluster": {"cluster_id": cluster_id, "profile_dir": "/x"},
                                                        "controller": controller},
                                 {"owners": [owner], "ranks": [{"engine_id": 0}]})

    dead = subprocess.Popen(["true"])
    dead.wait()
    used, left, gone = a_set("hpcai-7-1-0", os.getpid()), a_set("hpcai-7-2-0", dead.pid), a_set("hpcai-7-3-0", 0, False)
    sets = [used, left, gone]
    monkeypatch.setattr(listing, "job_sets", lambda job: sets)
    assert used.attached and not left.attached
    assert listing.attachable("7") is left
    assert listing.attachable("7", "hpcai-7-1-0") is used
    with pytest.raises(HPCAIError, match="no running engine set 'hpcai-7-3-0'"):
        listing.attachable("7", "hpcai-7-3-0")
    sets.remove(left)
    assert listing.attachable("7") is used  # another notebook's, the only one
    sets.append(a_set("hpcai-7-4-0", os.getpid()))
    with pytest.raises(HPCAIError, match="2 engine sets could be attached to") as err:
        listing.attachable("7")
    assert "%hpc attach CLUSTER_ID" in err.value.hint
    sets.clear()
    with pytest.raises(HPCAIError, match="no engines are running in this job"):
        listing.attachable("7")
