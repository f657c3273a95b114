"""The local launcher without MPI (ranks/local.py): each rank's place, its lines labelled as srun labels them,
the exit status, and no rank left behind when the helper is stopped or killed. The engines it starts, with
Horovod across them, are test_engines' local launcher test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_hpcai.engines.launch import LAUNCHERS, Layout
from jupyter_hpcai.errors import HPCAIError
from jupyter_hpcai.proc import wait_until

HELPER = [sys.executable, "-m", "jupyter_hpcai.ranks.local"]
SLEEPER = "import os, time; print('up', os.getpid(), flush=True); time.sleep(300)"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"


def test_each_rank_knows_its_place_and_its_lines_say_whose_they_are() -> None:
    code = ("import os, sys\nprint(*(os.environ[v] for v in ('HPCAI_RANK', 'HPCAI_SIZE', 'HPCAI_LOCAL_RANK', "
            "'HPCAI_LOCAL_SIZE')))\nif os.environ['HPCAI_RANK'] == '1':\n    sys.exit('rank 1 fails')")
    done = subprocess.run([*HELPER, "-n", "3", sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert sorted(done.stdout.splitlines()) == ["0: 0 3 0 3", "1: 1 3 1 3", "2: 2 3 2 3"], done
    assert done.stderr.splitlines() == ["1: rank 1 fails"] and done.returncode == 1, done


def test_a_signal_to_the_helper_reaches_every_rank() -> None:
    helper = subprocess.Popen([*HELPER, "-n", "2", sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True)
    assert helper.stdout is not None
    pids = [int(helper.stdout.readline().split()[-1]) for _ in range(2)]
    helper.send_signal(signal.SIGTERM)
    assert helper.wait(timeout=30) == 128 + signal.SIGTERM
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
