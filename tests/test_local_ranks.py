"""The local launcher without MPI (ranks/local.py): each rank's place, its lines labelled as srun labels them,
the exit status, and no rank left behind when the helper is stopped or killed. The engines it starts, with
Horovod across them, are test_engines' local launcher test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_hpcai.engines.launch import LAUNCHERS, Layout
from jupyter_hpcai.engines.startup import TASK_ENDED
from jupyter_hpcai.errors import HPCAIError
from jupyter_hpcai.proc import wait_until

HELPER = [sys.executable, "-m", "jupyter_hpcai.ranks.local"]
# a rank blocked where SIGTERM does not reach it (as in a collective, in C)
SLEEPER = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           "print('up', os.getpid(), flush=True); time.sleep(300)")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"


def test_each_rank_knows_its_place_and_its_lines_say_whose_they_are() -> None:
    """As the ranks read it (identity.py, world.py), even in a kernel inside an sbatch script, whose SLURM_PROCID
    and friends come first there; a failing rank is said as srun says it, which a start watches for."""
    code = ("import os, sys\nfrom jupyter_hpcai.ranks.identity import RANK_VARS, LOCAL_RANK_VARS, LOCAL_SIZE_VARS, "
            "first_int\nfrom jupyter_hpcai.ranks.world import world_size\nrank = first_int(os.environ, RANK_VARS, -1)\n"
            "print(rank, world_size(), first_int(os.environ, LOCAL_RANK_VARS, -1), "
            "first_int(os.environ, LOCAL_SIZE_VARS, -1))\nif rank == 1:\n    sys.exit('rank 1 fails')")
    slurm = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1", "HPCAI_WORLD_RANK": "0"}
    done = subprocess.run([*HELPER, "-n", "3", sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **slurm})
    assert sorted(done.stdout.splitlines()) == ["0: 0 3 0 3", "1: 1 3 1 3", "2: 2 3 2 3"], done
    assert done.stderr.splitlines() == ["1: rank 1 fails", "hpcai-local: error: rank 1: Exited with exit code 1"]
    assert done.returncode == 1 and TASK_ENDED.search(done.stderr), done


def test_a_stop_reaches_every_rank_even_one_that_ignores_it() -> None:
    helper = subprocess.Popen([*HELPER, "-n", "2", sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True)
    assert helper.stdout is not None
    pids = [int(helper.stdout.readline().split()[-1]) for _ in range(2)]
    helper.send_signal(signal.SIGTERM)  # the ranks ignore it: SIGKILL follows, before ipyparallel's own
    assert helper.wait(timeout=30) == 128 + signal.SIGKILL
    assert not any(_alive(pid) for pid in pids)


def test_a_killed_helper_takes_its_ranks_with_it() -> None:
    helper = subprocess.Popen([*HELPER, "-n", "2", sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True)
    assert helper.stdout is not None
    pids = [int(helper.stdout.readline().split()[-1]) for _ in range(2)]
    helper.kill()
    helper.wait(timeout=30)
    wait_until(lambda: not any(_alive(pid) for pid in pids), timeout=30, what="the ranks of a killed helper to end")


def test_the_local_launcher_needs_no_mpi_and_says_when_horovod_would(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPCAI_HOROVOD_CONTROLLER", raising=False)
    monkeypatch.delenv("HPCAI_CONTAINER", raising=False)
    command = LAUNCHERS["local"].command(Layout(2, 1, 2, "local"))
    assert command[:5] == [*HELPER, "-n", "2"] and "mpirun" not in command
    assert LAUNCHERS["local-mpi"].command(Layout(2, 1, 2, "local-mpi"))[0] == "mpirun"
    monkeypatch.setenv("HPCAI_HOROVOD_CONTROLLER", "mpi")
    with pytest.raises(HPCAIError, match="Horovod over MPI needs its ranks started by MPI") as refused:
        LAUNCHERS["local"].command(Layout(2, 1, 2, "local"))
    assert "--launcher local-mpi" in refused.value.hint
    monkeypatch.delenv("HPCAI_HOROVOD_CONTROLLER")
    container = {"name": "deb", "run": ["udocker", "run"], "python": "python3", "mpi": None, "host_mpi": None}
    monkeypatch.setenv("HPCAI_CONTAINER", json.dumps(container))  # a container env's kernel: its refusal first
    with pytest.raises(HPCAIError, match="start with srun"):
        LAUNCHERS["local"].command(Layout(2, 1, 2, "local"))
