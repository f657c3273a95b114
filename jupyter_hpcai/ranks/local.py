"""The ``local`` launcher's helper: N ranks as processes of this machine, without MPI (a workstation, or a GPU
machine without Slurm). The kernel's engine set runs it as its launcher command::

    python -m jupyter_hpcai.ranks.local -n N PROGRAM [ARG ...]

Each rank gets its place as a launcher gives it (HPCAI_RANK, HPCAI_SIZE, HPCAI_LOCAL_RANK, HPCAI_LOCAL_SIZE) and
this process's environment otherwise, less any other launcher's rank variables (a kernel inside an sbatch script has
SLURM_PROCID, which ranks read first). Each line a rank writes comes out with its rank in front, as ``srun --label``
writes it (``3: ...``), which is how engines/report.py tells the ranks apart; a rank that fails says so as srun does
(``hpcai-local: error: rank 3: Exited with exit code 1``), so that a start fails at once. A rank that dies leaves
the others running (the kernel stops the world, or goes on without it). SIGTERM or SIGINT here goes to every rank,
and SIGKILL follows ``KILL_AFTER`` seconds after a SIGTERM (a rank blocked in C never runs its handler); a rank gets
SIGKILL if this process dies. It exits once every rank has: with the first failing rank's status, else 0.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import IO

from ..scheduler import chosen
from .identity import LOCAL_RANK_VARS, LOCAL_SIZE_VARS, RANK_VARS, SIZE_VARS

environment = chosen().environment

PLACE = ("HPCAI_RANK", "HPCAI_SIZE", "HPCAI_LOCAL_RANK", "HPCAI_LOCAL_SIZE")
# every other way a rank could read its place (identity.py and world.py read these before PLACE), and the
# scheduler's step places: none of them is this launcher's
OTHER_PLACES = {*RANK_VARS, *SIZE_VARS, *LOCAL_RANK_VARS, *LOCAL_SIZE_VARS, *environment.STEP_PLACES} - set(PLACE)
KILL_AFTER = 3.0  # seconds from SIGTERM to SIGKILL (ipyparallel kills this helper after 5)
LINE = 1 << 16  # the most of a line read at once (a rank writing binary without newlines stays bounded)
_PR_SET_PDEATHSIG = 1
STOPS = {signal.SIGTERM, signal.SIGINT}  # passed on to every rank


def rank_environ(environ: dict[str, str], rank: int, n: int) -> dict[str, str]:
    """Rank ``rank`` of ``n``'s environment: this process's, less other launchers' places, with its own."""
    own = dict(zip(PLACE, map(str, (rank, n, rank, n))))
    return {**{k: v for k, v in environ.items() if k not in OTHER_PLACES}, **own}


def _dies_with(parent: int) -> Callable[[], None]:
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, before any fork

    def in_child() -> None:
        """Before the rank runs: SIGKILL when this helper dies, however it dies (or already did); the stops that
        the helper holds back while it starts the ranks, as they would be without it."""
        if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) != 0 or os.getppid() != parent:
            os._exit(1)
        for stop in STOPS:
            signal.signal(stop, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)

    return in_child


def _label(rank: int, source: IO[bytes], fd: int, lock: threading.Lock) -> None:
    for line in iter(lambda: source.readline(LINE), b""):
        with lock:
            os.write(fd, f"{rank}: ".encode() + line + (b"" if line.endswith(b"\n") else b"\n"))


def run(n: int, program: Sequence[str]) -> int:
    """Start ``n`` ranks of ``program``; wait for all of them; the exit status."""
    lock = threading.Lock()
    in_child = _dies_with(os.getpid())
    ranks: list[subprocess.Popen[bytes]] = []

    def send(signum: int) -> None:
        """To every rank not reaped yet (os.kill: Popen's own methods would reap ranks the loop below waits for)."""
        for proc in ranks:
            if proc.returncode is None:
                try:
                    os.kill(proc.pid, signum)
                except ProcessLookupError:
                    pass

    def forward(signum: int, _frame: object) -> None:
        send(signum)
        if signum == signal.SIGTERM:
            threading.Timer(KILL_AFTER, send, args=(signal.SIGKILL,)).start()

    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)  # a stop that comes while the ranks start reaches all of them
    for stop in STOPS:
        signal.signal(stop, forward)
    try:
        ranks += [subprocess.Popen(program, env=rank_environ(dict(os.environ), rank, n), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, preexec_fn=in_child) for rank in range(n)]
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    readers = [threading.Thread(target=_label, args=(rank, stream, fd, lock), daemon=True)
               for rank, proc in enumerate(ranks) for stream, fd in ((proc.stdout, 1), (proc.stderr, 2))]
    for reader in readers:  # threads only once every rank is forked (preexec_fn runs between fork and exec)
        reader.start()
    codes = [0] * n
    waiting = set(range(n))
    while waiting:
        try:
            pid, status = os.wait()
        except ChildProcessError:  # none left to wait for
            break
        rank = next((r for r in waiting if ranks[r].pid == pid), None)
        if rank is None:
            continue
        waiting.discard(rank)
        codes[rank] = os.waitstatus_to_exitcode(status)
        ranks[rank].returncode = codes[rank]
        if codes[rank]:
            how = f"Exited with exit code {codes[rank]}" if codes[rank] > 0 else f"Killed by signal {-codes[rank]}"
            with lock:
                os.write(2, f"hpcai-local: error: rank {rank}: {how}\n".encode())
    for reader in readers:
        reader.join(timeout=5)
    return next((code if code > 0 else 128 - code for code in codes if code), 0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, required=True, help="how many ranks")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="what each rank runs, with its arguments")
    args = parser.parse_args(argv)
    if args.n < 1 or not args.program:
        parser.error("give -n 1 or more, then the program each rank runs")
    code = run(args.n, args.program)
    os._exit(code)  # no interpreter shutdown while a reader may still hold the output (a rank's child keeps its pipe)


if __name__ == "__main__":
    main()
