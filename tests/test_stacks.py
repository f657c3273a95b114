"""Grouped stacks from real processes read by real py-spy: two "ranks" waiting in the same function, one
elsewhere. The files are named as ipykernel names its cells, so their frames count as cell lines."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from jupyter_hpcai.ranks import stacks
from jupyter_hpcai.ranks.identity import host_name

CELL = """import time
def wait_here():
    time.sleep(120)
import sys
if sys.argv[1] == "odd":
    time.sleep(120)
wait_here()
"""


def test_identical_stacks_are_grouped_and_the_odd_rank_stands_apart(tmp_path: Path) -> None:
    procs = []
    for rank, role in enumerate(("same", "same", "odd", "same")):  # each rank's kernel has its own cell file
        cell = tmp_path / f"ipykernel_{4240 + rank}" / "1234567.py"
        cell.parent.mkdir()
        cell.write_text(CELL)
        procs.append(subprocess.Popen([sys.executable, str(cell), role]))
    try:
        time.sleep(1.5)  # past the imports, into the sleeps
        here = host_name(os.environ)
        done = subprocess.run([sys.executable, "-m", "jupyter_hpcai.ranks.stacks",
                               ",".join(f"{here}={p.pid}" for p in procs) + ",elsewhere=1"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        found = stacks.parse(done.stdout)
        assert 1 not in found  # another host's process is that host's to read
        groups = stacks.group({rank: found[p.pid] for rank, p in enumerate(procs)})
    finally:
        for p in procs:
            p.kill()
    text = stacks.render(groups)
    assert [g.ranks for g in groups] == [(0, 1, 3), (2,)], text
    assert groups[0].headline(4) == "ranks 0,1,3 (3 of 4): in wait_here, from cell line 7"
    assert groups[1].headline(4) == "rank 2 (1 of 4): at cell line 6"
    assert "    wait_here (cell line 3)\n    <module> (cell line 7)" in text


def test_a_process_that_cannot_be_read_says_why() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    reason = stacks.dump(gone.pid)
    assert isinstance(reason, str) and reason
    groups = stacks.group({0: reason, 1: reason})
    assert groups[0].headline(2).startswith("ranks 0,1 (2 of 2): no stack: ")
