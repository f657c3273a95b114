"""helpers/machine.py: a test marked ``alone`` runs while the run's other process runs none (two real processes)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import machine

# Another process of the run: takes its turn (alone or not), says so, holds it until the file named by argv[3] exists.
OTHER = """
import sys, time
from pathlib import Path
from helpers import machine
machine.MAIN, machine.TURN = Path(sys.argv[1]), Path(sys.argv[2])
with machine.share(alone=sys.argv[4] == "alone"):
    print("running", flush=True)
    while not Path(sys.argv[3]).exists():
        time.sleep(0.05)
"""


def _other(tmp_path: Path, release: Path, how: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", OTHER, str(tmp_path / "main"), str(tmp_path / "turn"), str(release),
                             how], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent)


def _started(proc: subprocess.Popen[str], within: float) -> bool:
    """Whether ``proc`` said it runs within ``within`` seconds (it is left running either way)."""
    from selectors import EVENT_READ, DefaultSelector

    with DefaultSelector() as sel:
        sel.register(proc.stdout, EVENT_READ)  # type: ignore[arg-type]
        return bool(sel.select(within)) and proc.stdout.readline().strip() == "running"  # type: ignore[union-attr]


def test_an_alone_test_waits_for_the_other_and_holds_off_its_next(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "MAIN", tmp_path / "main")
    monkeypatch.setattr(machine, "TURN", tmp_path / "turn")
    with machine.share(alone=False):  # this process's test runs
        beside = _other(tmp_path, tmp_path / "beside-done", "shared")
        assert _started(beside, 10), "a test that is not alone runs beside another"
        (tmp_path / "beside-done").touch()
        beside.wait(timeout=10)
        alone = _other(tmp_path, tmp_path / "alone-done", "alone")
        assert not _started(alone, 1.0), "an alone test waits for the test that runs"
    assert _started(alone, 10), "and runs once it ended"
    started = time.monotonic()
    (tmp_path / "next-done").touch()  # the other process's next test: runs, then ends at once
    waiting = _other(tmp_path, tmp_path / "next-done", "shared")
    assert not _started(waiting, 1.0), "while it runs, the other process starts no test"
    (tmp_path / "alone-done").touch()
    alone.wait(timeout=10)
    assert _started(waiting, 10) and time.monotonic() - started >= 1.0
    waiting.wait(timeout=10)
