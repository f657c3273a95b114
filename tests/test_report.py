"""What a launcher said when ranks died: the part that names the cause, whole, once for every rank that said it."""

from __future__ import annotations

from itertools import zip_longest

from jupyter_hpcai.engines.report import launcher_said

RULE = "-" * 74


def _open_mpi_abort(host: str, pid: int) -> list[str]:
    """What each rank of Open MPI 4.1 prints when MPI_Init cannot find its pml (OMPI_MCA_pml=no_such_pml)."""
    return [RULE, "A requested component was not found, or was unable to be opened.  This",
            "means that this component is either not installed or is unable to be", "used on your system.", "",
            f"Host:      {host}", "Framework: pml", "Component: no_such_pml", RULE, RULE,
            "It looks like MPI_INIT failed for some reason; your parallel process is",
            "likely to abort.  There are many reasons that a parallel process can", "fail during MPI_INIT.", "",
            "  mca_pml_base_open() failed", RULE,
            "*** An error occurred in MPI_Init_thread", "*** on a NULL communicator",
            f"[{host}:{pid}] Local abort before MPI_INIT completed completed successfully"]


def _interleaved(ranks: dict[int, list[str]]) -> list[str]:
    """srun --label output: every rank's lines, interleaved one by one as the tasks write them."""
    lines = []
    for row in zip_longest(*ranks.values()):
        lines += [f"{rank}: {line}" for rank, line in zip(ranks, row) if line is not None]
    return lines


def test_open_mpi_blocks_are_whole_and_shown_once_for_the_ranks_that_printed_them() -> None:
    ranks = {0: _open_mpi_abort("n1", 11), 1: _open_mpi_abort("n1", 12), 2: _open_mpi_abort("n2", 21)}
    noise = [f"{r}: [IPEngine.{r}] Loading connection file" for r in ranks] + ["0: 2026-12-01 06:21:21.000000: I tensorflow/core/platform/cpu_feature_guard.cc:182] AVX2"]
    srun = ["srun: error: n1: task 0: Exited with exit code 1", "srun: error: n2: task 2: Exited with exit code 1"]
    said = launcher_said("\n".join(noise + _interleaved(ranks) + srun))
    cause = "\n".join(_open_mpi_abort("n1", 0)[:9])  # the block that names the component, rules and all
    assert f"[ranks 0,1]\n{cause}" in said
    assert f"[rank 2]\n{cause.replace('n1', 'n2')}" in said
    assert said.count("It looks like MPI_INIT failed") == 1 and "[ranks 0,1,2]\n" + RULE in said
    assert "[ranks 0,1,2]\n*** An error occurred in MPI_Init_thread\n*** on a NULL communicator" in said
    assert said.endswith("\n".join(srun)) and "IPEngine" not in said and "tensorflow" not in said


def test_a_long_report_drops_repeats_before_the_cause_or_srun() -> None:
    ranks = {r: _open_mpi_abort(f"n{r}", r) for r in range(8)}  # eight hosts: eight cause blocks
    srun = "srun: error: n7: task 7: Exited with exit code 1"
    said = launcher_said("\n".join([*_interleaved(ranks), srun]), limit=40)
    assert len(said.splitlines()) <= 40
    assert "[rank 0]\n" + "\n".join(_open_mpi_abort("n0", 0)[:9]) in said  # the first cause, whole
    assert said.endswith(srun)


def test_python_tracebacks_and_unlabelled_output_stay_whole() -> None:
    text = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n    import horovod\n"
            "ModuleNotFoundError: No module named 'horovod'\nsrun: error: n1: task 0: Exited with exit code 1")
    assert launcher_said(text + "\n" + text) == text  # no labels (mpirun without --tag-output): one stream
    tagged = "\n".join(f"[1,{r}]<stderr>:{line}" for r in (0, 1) for line in text.splitlines()[:4])
    assert launcher_said(tagged) == "[ranks 0,1]\n" + "\n".join(text.splitlines()[:4])
