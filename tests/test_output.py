"""What a cell on many ranks shows (engines/output.py, cells.py): lines every rank prints once with the ranks'
ranges, failures grouped by identical traceback. The engines' own test (test_engines) runs them on real ranks; here
the kernel's side alone, on 128 ranks of 16 stand-in nodes (what a person reads does not depend on the transport)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from jupyter_hpcai.engines.cells import Cell, listed, who
from jupyter_hpcai.engines.output import COLLAPSE_ABOVE, HOLD, Streamer
from jupyter_hpcai.ranks.identity import rank_ranges

RANKS = [SimpleNamespace(rank=r, host=f"n{r // 8 + 1}") for r in range(128)]


def _stream(ranks: list[SimpleNamespace], texts: dict[int, str], mode: str = "auto") -> list[str]:
    out: list[str] = []
    Streamer(ranks, mode, out.append).feed({r: (t, "") for r, t in texts.items()}, final=True)
    return "".join(out).splitlines()


def test_rank_ranges_read_as_a_node_list() -> None:
    assert rank_ranges([7, 0, 1, 2, 3, 5, 8, 9]) == "0-3,5,7-9"
    assert rank_ranges([4]) == "4"


def test_a_large_world_collapses_identical_lines_and_groups_the_others_by_content() -> None:
    lines = _stream(RANKS, {r: f"epoch 1\nloss {0.31 if r < 64 else 0.42}\nrank {r} done\n" for r in range(128)})
    assert lines[:3] == ["[all 128 ranks] epoch 1", "[ranks 0-63] loss 0.31", "[ranks 64-127] loss 0.42"]
    assert lines[3:5] == ["[rank 0 n1] rank 0 done", "[rank 1 n1] rank 1 done"] and len(lines) == 3 + 128


def test_a_small_world_shows_every_ranks_lines_unless_asked() -> None:
    small = RANKS[:COLLAPSE_ABOVE]
    assert _stream(small, {r: "same\n" for r in range(len(small))}) == [f"[rank {r} n1] same" for r in range(8)]
    assert _stream(small, {r: "same\n" for r in range(len(small))}, "collapse") == ["[all 8 ranks] same"]
    assert _stream(RANKS, {r: "same\n" for r in range(128)}, "all")[:2] == ["[rank 0 n1] same", "[rank 1 n1] same"]


def test_a_line_only_rank_0_prints_is_held_back_no_longer_than_a_moment() -> None:
    """Collapse waits for the other ranks' next line; a line they never print (rank 0's progress) still shows."""
    out: list[str] = []
    streamer = Streamer(RANKS, "auto", out.append)
    streamer.feed({0: ("step 1 of 100\n", "")})
    assert out == []  # the others may be about to print it too
    time.sleep(HOLD + 0.1)
    streamer.feed({0: ("step 1 of 100\n", "")})
    assert out == ["[rank 0 n1] step 1 of 100\n"]


def _failure(name: str, message: str, where: str) -> dict[str, object]:
    return {"ok": False, "ename": name, "evalue": message,
            "traceback": f"Traceback (most recent call last):\n  File \"{where}\", line 1\n{name}: {message}\n"}


def test_failures_group_by_identical_traceback_with_the_first_shown_in_full() -> None:
    cell = Cell(SimpleNamespace(ranks=RANKS), lambda _: None, None, lambda: None)  # type: ignore[arg-type]
    failed = {r: _failure("NameError", "name 'x' is not defined", f"/tmp/ipykernel_{4000 + r}/1.py")
              for r in range(127)}  # each rank's kernel compiles its cells in a folder named by its pid
    failed[127] = _failure("ValueError", "bad rank 127", "/tmp/ipykernel_4127/1.py")
    text = cell.tracebacks(failed)
    assert text.count("Traceback (most recent call last)") == 2
    assert text.startswith("---- ranks 0-126 on 16 nodes: NameError ----\nTraceback")
    assert "ipykernel_4000/" in text  # the first of the group, in full
    assert "---- rank 127 on n16: ValueError ----" in text
    assert who([RANKS[r] for r in (0, 1, 8, 9)]) == "ranks 0-1,8-9 on n1, n2"


def test_top_sums_a_large_world_up_per_node_and_names_its_stragglers() -> None:
    from jupyter_hpcai.ranks.telemetry import NODE_COLUMNS, Sample, node_rows

    now = time.time()
    samples = [Sample(r, f"n{r // 8 + 1}", 1000 + r, now, 2.0, 50.0 + r % 8, 2**30, rate=10.0, rate_history=[10.0] * 5)
               for r in range(128)]
    samples[37].rate, samples[37].rate_history = 2.0, [2.0] * 5  # a straggler on n5
    samples[90].time = now - 60  # a silent rank on n12
    rows = {row[0]: dict(zip(NODE_COLUMNS, row)) for row in node_rows(samples)}
    assert len(rows) == 16 and rows["n1"]["ranks"] == "0-7" and rows["n1"]["CPU %"] == "50/54/57"
    assert rows["n1"]["RSS"] == "1.0 GiB" and rows["n1"]["note"] == ""
    assert rows["n5"]["rate /s"] == "2.0/10.0/10.0" and rows["n5"]["note"] == "straggler: ranks 37"
    assert rows["n12"]["note"] == "no sample: ranks 90"
    from jupyter_hpcai.ranks.telemetry import alarming
    assert alarming(rows["n5"]["note"]) and alarming(rows["n12"]["note"]) and not alarming(rows["n1"]["note"])
    assert not alarming("no GPU (CUDA_VISIBLE_DEVICES is empty)")  # a blank reading is no alarm


def test_the_panel_shows_a_large_world_by_node_with_its_dead_ranks_named() -> None:
    from jupyter_hpcai.engines.running_set import Rank
    from jupyter_hpcai.widgets import ClusterPanel

    ranks = [Rank(r.rank, r.host, str(r.rank % 8), 1000 + r.rank, r.rank, "10.0.0.1", job="7") for r in RANKS]
    panel = SimpleNamespace(engines=SimpleNamespace(samples=list), _alive={r: r != 9 for r in range(128)},
                            ranks=SimpleNamespace(value=""))
    ClusterPanel._show_nodes(panel, ranks)  # type: ignore[arg-type]
    table = panel.ranks.value
    assert table.count("<tr") == 1 + 16  # the head and one row per node, not 128
    assert "<td>n2</td><td>8-15</td><td>7/8</td>" in table and "dead: ranks 9" in table
    assert table.count("hpcai-straggler") == 1  # n2's row only: red is for dead, silent and straggling ranks


def test_a_flood_is_bounded_per_rank_and_says_how_to_read_the_rest() -> None:
    out: list[str] = []
    streamer = Streamer(RANKS[:4], "all", out.append, limit=5)
    streamer.feed({r: ("".join(f"step {i}\n" for i in range(r * 3 + 1)), "") for r in range(4)}, final=True)
    lines = "".join(out).splitlines()
    assert [ln for ln in lines if ln.startswith("[rank 3 n1] step")] == [f"[rank 3 n1] step {i}" for i in range(5)]
    assert lines[-2:] == ["[rank 2 n1] 2 more lines not shown (each rank shows 5 at most): %hpc output RANK prints "
                          "a rank's whole output",
                          "[rank 3 n1] 5 more lines not shown (each rank shows 5 at most): %hpc output RANK prints "
                          "a rank's whole output"]


def test_help_prints_once_and_is_no_error(capsys) -> None:  # type: ignore[no-untyped-def]
    """%hpc start --help printed the help, then the same text again as a red HPCAIError."""
    from IPython.core.interactiveshell import InteractiveShell

    from jupyter_hpcai.magics import FRAMEWORKS, HPCMagics, _rank_magic

    shell = InteractiveShell.instance()
    magics = HPCMagics(shell=shell)
    shell.register_magics(magics)
    for name, framework in FRAMEWORKS.items():  # as load() does, without its walltime guard and warm start
        shell.register_magic_function(_rank_magic(magics, name), "line_cell", framework.magic)
    for magic, line in (("hpc", "start --help"), ("hpc", "top --help"), ("hpc", "--help"),
                        ("horovod_run", "--help"), ("torchrun", "-h")):
        assert shell.run_line_magic(magic, line) is None
        shown = capsys.readouterr()
        assert shown.out.count("usage:") == 1 and shown.err == "", (magic, line, shown)


def test_a_line_only_rank_0_prints_does_not_throw_the_others_out_of_step() -> None:
    """Lines are matched by text, not by position: rank 0's extra progress line shows on its own, and the lines every
    rank prints still show once (they showed 16 times apart, from the first extra line on)."""
    texts = {r: "".join(("epoch %d start\n" % e if r == 0 else "") + f"loss {e}\n" for e in range(3)) for r in range(16)}
    assert _stream(RANKS[:16], texts) == [
        "[rank 0 n1] epoch 0 start", "[all 16 ranks] loss 0", "[rank 0 n1] epoch 1 start", "[all 16 ranks] loss 1",
        "[rank 0 n1] epoch 2 start", "[all 16 ranks] loss 2"]


def test_dead_or_stuck_ranks_of_a_large_world_are_named_by_node() -> None:
    assert listed([RANKS[r] for r in (0, 1, 10)]) == "rank 0 on n1, rank 1 on n1, rank 10 on n2"  # a few: each by rank and host
    assert listed([RANKS[r] for r in (*range(64), 70, 127)]) == ("ranks 0-7 on n1, ranks 8-15 on n2, ranks 16-23 on n3, ranks 24-31 on "
                                                  "n4, ranks 32-39 on n5, ranks 40-47 on n6, ranks 48-55 on n7, ranks "
                                                  "56-63 on n8, rank 70 on n9, rank 127 on n16")


def test_hpc_output_prints_a_ranks_whole_output_or_says_what_to_do(capsys) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from jupyter_hpcai.errors import HPCAIError
    from jupyter_hpcai.magics import _output

    engines = SimpleNamespace(last_output=({0: ("a\nb\n", ""), 1: ("c", "oops\n")}, ["n1", "n2"]))
    _output(engines, 1)  # type: ignore[arg-type]
    shown = capsys.readouterr()
    assert shown.out == "rank 1 on n2, the last cell: 0 lines on stdout, 1 on stderr\nc\n" and shown.err == "oops\n"
    with pytest.raises(HPCAIError, match="no output of rank 5") as err:
        _output(engines, 5)  # type: ignore[arg-type]
    assert err.value.hint == "name a rank of the last cell: 0-1"


def test_the_rank_table_of_a_large_world_is_a_row_per_node_unless_every_rank_is_asked_for(capsys) -> None:  # type: ignore[no-untyped-def]
    from jupyter_hpcai.engines.running_set import Rank
    from jupyter_hpcai.magic_args import hpc_parser, parse
    from jupyter_hpcai.magics import _print_ranks

    ranks = [Rank(r.rank, r.host, str(r.rank % 8), 1000 + r.rank, r.rank, alive=r.rank != 9, job="7") for r in RANKS]
    _print_ranks(ranks)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 16 + 1  # the head, a row per node, the line that says so
    assert lines[2].split() == ["n2", "8-15", "0-7", "7", "7/8", "(dead:", "ranks", "9)"]
    assert "%hpc status --ranks lists each rank" in lines[-1]
    _print_ranks(ranks[:8])  # up to 8 ranks: each
    assert len(capsys.readouterr().out.splitlines()) == 1 + 8
    assert parse(hpc_parser(), "status --ranks").ranks  # and %hpc status --ranks asks for each
    _print_ranks(ranks, every=True)
    assert len(capsys.readouterr().out.splitlines()) == 1 + 128
