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


SELF_CELL = """import sys, time
from pathlib import Path
from jupyter_hpcai.ranks.selfstacks import Watcher
Watcher(Path(sys.argv[2]), sys.argv[3]).start()
def wait_here():
    time.sleep(120)
if sys.argv[1] == "odd":
    time.sleep(120)
wait_here()
"""
# what a node where ptrace is forbidden answers for every process (stacks.dump's words after py-spy's error)
NO_PTRACE = ("import json, sys; print(json.dumps({p.rpartition('=')[2]: 'Permission denied (os error 13); "
             "kernel.yama.ptrace_scope is 1 on this node' for p in sys.argv[-1].split(',')}))")


def test_where_py_spy_cannot_attach_each_rank_takes_its_own_stack(tmp_path: Path) -> None:
    """Ranks with a selfstacks.Watcher, on a node where py-spy is refused: auto falls back to the ranks' own
    threads, self asks them at once, py-spy reports the refusal; the report says which read the stacks."""
    folder = tmp_path / "set"
    folder.mkdir()
    here = host_name(os.environ)
    procs = []
    for rank, role in enumerate(("same", "odd", "same")):
        cell = tmp_path / f"ipykernel_{4340 + rank}" / "7654321.py"
        cell.parent.mkdir()
        cell.write_text(SELF_CELL)
        procs.append(subprocess.Popen([sys.executable, str(cell), role, str(folder), here]))
    ranks = [(rank, here, p.pid) for rank, p in enumerate(procs)]
    refused = lambda hosts: [sys.executable, "-c", NO_PTRACE, "--"]  # noqa: E731
    try:
        time.sleep(1.5)
        auto = stacks.collect(ranks, refused, folder, source="auto")
        own = stacks.collect(ranks, refused, folder, source="self")
        spied = stacks.collect(ranks, refused, folder, source="py-spy")
    finally:
        for p in procs:
            p.kill()
    for groups in (auto, own):
        assert [(g.ranks, g.own) for g in groups] == [((0, 2), (0, 2)), ((1,), (1,))], groups
        assert groups[0].headline(3) == "ranks 0,2 (2 of 3): in wait_here, from cell line 9"
        assert groups[1].headline(3) == "rank 1 (1 of 3): at cell line 8"
        assert stacks.render(groups).endswith("(stacks taken by each rank's own thread)")
    assert spied[0].headline(3).startswith("ranks 0,1,2 (3 of 3): no stack: Permission denied")
    assert stacks.render(spied).endswith("(stacks read by py-spy from outside the ranks)")


def test_a_rank_that_does_not_answer_is_named_and_a_bad_source_is_refused(tmp_path: Path) -> None:
    import pytest

    from jupyter_hpcai.errors import HPCAIError
    from jupyter_hpcai.ranks import selfstacks

    silent = selfstacks.ask(tmp_path, [(0, "n1", 1)], timeout=0.5)
    assert silent[0].startswith("no answer within 0.5 s")  # type: ignore[union-attr]
    assert list(tmp_path.iterdir()) == []  # its request is removed
    with pytest.raises(HPCAIError, match="the engines stopped"):  # their folder is gone
        selfstacks.ask(tmp_path / "gone", [(0, "n1", 1)])
    with pytest.raises(HPCAIError, match="'gdb' is not a source of stacks"):
        stacks.source(False, "gdb")
    with pytest.raises(HPCAIError, match="in a container"):
        stacks.source(True, "py-spy")
    assert stacks.source(True) == "self" and stacks.source(False, environ={"HPCAI_STACKS": "self"}) == "self"
    with pytest.raises(HPCAIError, match="--native needs py-spy"):
        stacks.source(False, "self", native=True)


def test_the_set_folder_the_ranks_answer_in_is_this_users_alone(tmp_path: Path) -> None:
    """Where the ranks' answers (and telemetry) are read from: made mode 700, and refused when it is open to others
    (made beforehand by someone else where the profile is shared) or a link."""
    import pytest

    from jupyter_hpcai.engines.listing import create_set_folder
    from jupyter_hpcai.errors import HPCAIError

    folder = create_set_folder(tmp_path, "hpcai-1-2-0")
    assert folder.stat().st_mode & 0o777 == 0o700
    folder.chmod(0o777)
    with pytest.raises(HPCAIError, match="not a folder of this user's alone"):
        create_set_folder(tmp_path, "hpcai-1-2-0")
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (folder.parent / "hpcai-3-4-0").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(HPCAIError, match="a link"):
        create_set_folder(tmp_path, "hpcai-3-4-0")
