"""Engines that start in the background (the profile's start_engines): the job script asks for it, the
kernel in a 2-node job finds its engines running without %hpc start, and with the setting off nothing starts;
Horovod engines started with the job wait at rest until the first cell, and the kernel that took them re-forms them."""

from __future__ import annotations

import ast
import datetime as dt
import statistics
import time
from pathlib import Path

import pytest

from helpers.kernels import JobKernel, kernel_in_job
from jupyter_hpcai.scheduler.allocation import Allocation
from jupyter_hpcai.engines import Engines, listing, warm
from jupyter_hpcai.envs import EnvDir
from jupyter_hpcai.spawner import script
from jupyter_hpcai.spawner.options import Profile, SpawnOptions


def _script(start_engines: bool) -> str:
    profile = Profile(name="2x2", partition="gpu", nodes=2, gpus_per_node=2, start_engines=start_engines)
    options = SpawnOptions(profile="2x2", partition="gpu", nodes=2, gpus_per_node=2, walltime="01:00:00")
    return script.render(options, profile, user="alice", homedir="/home/alice", keepvars="PATH",
                         cmd=["hpcai-singleuser", "jupyterhub-singleuser"])


def test_the_profile_setting_reaches_the_job() -> None:
    on, off = _script(True), _script(False)
    assert "\nexport HPCAI_START_ENGINES=1\n" in on and "\nexport HPCAI_START_ENGINES=0\n" in off  # the default: off
    starter = '"$hpcai_python" -m jupyter_hpcai.engines.warm & fi\n'
    assert on.index("server=$!") < on.index(starter) and starter not in off  # beside the server, only when asked
    assert 'readlink -f "$(command -v hpcai-singleuser)"' in on  # the python of the server's own venv


def _allocation(nodes: int, gpus: int) -> Allocation:
    return Allocation("7", "gpu", [f"n{i + 1}" for i in range(nodes)], gpus, 4, nodes * max(gpus, 1),
                      [str(g) for g in range(gpus)], dt.datetime.now())


@pytest.mark.parametrize(("allocation", "setting", "state", "starts"), [
    (_allocation(2, 2), "1", "/home/a/.hpcai/jobs/7", True),
    (_allocation(1, 2), "1", "/home/a/.hpcai/jobs/7", True),
    (_allocation(2, 2), "0", "/home/a/.hpcai/jobs/7", False),
    (_allocation(2, 2), "", "/home/a/.hpcai/jobs/7", False),
    (_allocation(2, 2), "1", "", False),  # not a notebook job of the hub's: no private folder to claim it in
    (_allocation(1, 1), "1", "/home/a/.hpcai/jobs/7", False),  # one GPU: nothing distributed to warm
    (None, "1", "/home/a/.hpcai/jobs/7", False),  # outside a job
])
def test_only_a_multi_gpu_notebook_job_that_asked_starts_them(allocation: Allocation | None, setting: str, state: str,
                                                              starts: bool) -> None:
    assert warm.wanted(Engines(allocation), {"HPCAI_START_ENGINES": setting, "HPCAI_JOB_STATE": state}) is starts


def test_one_kernel_per_job_claims_the_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "jobs" / "41", tmp_path / "jobs" / "42"
    first.mkdir(parents=True)
    second.mkdir()
    claims = []
    for folder, name in ((first, "engines-taken"), (first, "engines-taken"), (first, "engines-started"),
                         (second, "engines-taken")):
        monkeypatch.setenv("HPCAI_JOB_STATE", str(folder))
        claims.append(listing.claim(name))
    assert claims == [True, False, True, True]


def _job_env(tmp_path: Path, setting: str) -> dict[str, str]:
    """What the hub's batch script exports for the warm start: the setting and the job's private folder."""
    state = tmp_path / "job-state"
    state.mkdir(mode=0o700, parents=True)
    return {"HPCAI_START_ENGINES": setting, "HPCAI_JOB_STATE": str(state)}


def _starter(env: EnvDir) -> str:
    """The job script's starter line, run in ``env`` (the hub's script finds that python itself)."""
    return f"{env.current_link}/bin/python -m jupyter_hpcai.engines.warm --in-env"


FIRST_CELL = "%%torchrun --output collapse\nprint('rank', rank, 'of', world_size, dist.is_initialized())"


def _sets_of(job: int, since: float) -> list[listing.EngineSet]:
    """The engine sets of this job: a dev cluster whose state was started afresh numbers its jobs from the first id
    again, and the cluster files of an earlier job with the same id may still be in root's profile."""
    return [s for s in listing.job_sets(str(job)) if s.file.stat().st_mtime >= since - 1]


@pytest.mark.slow
def test_engines_start_in_the_background_and_not_when_the_setting_is_off(devcluster, torch_env, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                         bench: list[str]) -> None:
    """Kernels in 2 x 2 jobs (alternating, twice each): the setting off; on, the engines started by the first
    kernel (a job without the script's starter); on, started by the job beside the kernel, as the hub's script
    does, and taken by the kernel. The same first cells, timed from the job's submission to the first rank's
    output. On: the extension came with the kernel, the engines run without %hpc start, a plain %hpc start uses
    them; off: nothing loaded, nothing started."""
    starter = _starter(torch_env)
    took: dict[str, list[float]] = {"off": [], "kernel": [], "job": []}
    for i, mode in enumerate(("off", "kernel", "job", "job", "kernel", "off")):
        work = tmp_path / str(i)
        submitted, since = time.monotonic(), time.time()
        with kernel_in_job(torch_env, work, environ=_job_env(work, "0" if mode == "off" else "1"),
                           beside=starter if mode == "job" else "") as kernel:
            loaded = kernel.run("import sys; 'jupyter_hpcai.magics' in sys.modules").result
            assert loaded == str(mode != "off"), (mode, loaded)  # off: nothing can have started them
            if mode == "off":
                assert _sets_of(kernel.job_id, since) == []
            kernel.run("%load_ext jupyter_hpcai")
            cell = kernel.run(FIRST_CELL)
            took[mode].append(time.monotonic() - submitted)
            assert cell.status == "ok", cell.error
            assert "of 4 True" in cell.stdout, cell.stdout
            started = kernel.run("import jupyter_hpcai.engines as e; e.current().started_in_background").result
            assert started == str(mode != "off"), (mode, started, cell.stdout)
            if mode != "off" and i < 3:
                said = kernel.run("%hpc start").stdout  # a plain start uses them: no second start
                assert "4 engines ready, started in the background" in said, said
            assert len(_sets_of(kernel.job_id, since)) == 1
        log = (work / "job.out").read_text()
        assert ("engines started with the job" in log) is (mode == "job"), log[-2000:]
    median = {mode: statistics.median(times) for mode, times in took.items()}
    bench.append(f"engines in the background (2 x 2 job, torch env; sbatch -> first %%torchrun output, the cell sent "
                 f"as soon as the kernel answers; medians of 2, alternating): started with the job {median['job']:.1f} s, "
                 f"by the kernel {median['kernel']:.1f} s, off {median['off']:.1f} s; with the job / off "
                 f"{median['job'] / median['off']:.2f}, by the kernel / off {median['kernel'] / median['off']:.2f}")


HOROVOD_CELL = "%%horovod_run --output collapse\nprint('rank', rank, 'sum', int(hvd.allreduce(tf.constant(1), op=hvd.Sum)))"
WORLD = ("w = E.current().running_set(); import time; time.sleep(5)\n"  # the engines taken, then 2 samples of 2 s
         "(w.resting, [round(s.cpu, 1) for s in E.current().samples()])")


def _runs_on_four(kernel: JobKernel) -> None:
    cell = kernel.run(HOROVOD_CELL)
    assert cell.status == "ok" and all(f"rank {r} sum 4" in cell.stdout for r in range(4)), (cell.error, cell.stdout)
    assert kernel.run("print(E.current().running_set().resting)").stdout.strip() == "None"  # awake for the cells


@pytest.mark.slow
def test_engines_started_with_the_job_wait_at_rest_and_the_kernel_that_took_them_reforms_them(  # type: ignore[no-untyped-def]
        devcluster, tf_env, tmp_path: Path) -> None:
    """Horovod over Gloo in 2 x 2 jobs, the engines started by the job. By default they wait at rest before any cell
    (each rank under the 5 % target while nobody used them yet) and the first cell wakes them. With
    HPCAI_REST_AFTER=0 they wait awake; the world then rests in the kernel that took them, and wakes at the next cell:
    that kernel serves the rendezvous of the world it re-forms (it sent the ranks an empty address, and they died)."""
    starter = _starter(tf_env)
    for mode, after in (("rest", {}), ("never", {"HPCAI_REST_AFTER": "0"})):
        work = tmp_path / mode
        with kernel_in_job(tf_env, work, environ={**_job_env(work, "1"), **after}, beside=starter) as kernel:
            kernel.run("%load_ext jupyter_hpcai")
            resting, cpu = ast.literal_eval(kernel.run(f"import jupyter_hpcai.engines as E\n{WORLD}").result)
            assert len(cpu) == 4, cpu
            if mode == "rest":
                assert resting == "horovod" and all(c < 5 for c in cpu), (resting, cpu)  # the target: 5 % of a core
                assert "horovod is at rest" in kernel.run("%hpc status").stdout
                _runs_on_four(kernel)
            else:
                assert resting is None, resting
                _runs_on_four(kernel)
                kernel.run("E.current().rest.after = 1; E.current().rest.used(); time.sleep(4)")  # 30 s by default
                said = kernel.run("from jupyter_hpcai.ranks import calls\nw = E.current().running_set()\n"
                                  "w.rested(), sorted({i['resting'] for i in w.view().apply_sync(calls.rank_info, [])})")
                assert said.result == "(True, ['horovod'])", said  # as the ranks themselves say
                _runs_on_four(kernel)
        assert "engines started with the job (horovod)" in (work / "job.out").read_text()
