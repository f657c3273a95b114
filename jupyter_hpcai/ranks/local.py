"""The ``local`` launcher's helper: N ranks as processes of this machine, without MPI (a workstation, or a GPU
machine without Slurm). The kernel's engine set runs it as its launcher command::

    python -m jupyter_hpcai.ranks.local -n N PROGRAM [ARG ...]

Each rank gets its place as a launcher gives it (HPCAI_RANK, HPCAI_SIZE, HPCAI_LOCAL_RANK, HPCAI_LOCAL_SIZE) and
this process's environment otherwise. Each line a rank writes comes out with its rank in front, as ``srun --label``
writes it (``3: ...``), which is how engines/report.py tells the ranks apart. A rank that dies leaves the others
running (the kernel stops the world, or goes on without it); SIGTERM or SIGINT here goes to every rank, and a rank
gets SIGTERM if this process dies. It exits once every rank has: with the first rank's failing status, else 0.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import IO

PLACE = ("HPCAI_RANK", "HPCAI_SIZE", "HPCAI_LOCAL_RANK", "HPCAI_LOCAL_SIZE")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In each rank, before it runs: SIGTERM when this helper dies, however it dies."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _label(rank: int, source: IO[bytes], sink: IO[bytes], lock: threading.Lock) -> None:
    for line in iter(source.readline, b""):
        with lock:
            sink.write(f"{rank}: ".encode() + line + (b"" if line.endswith(b"\n") else b"\n"))
            sink.flush()


def run(n: int, program: Sequence[str]) -> int:
    """Start ``n`` ranks of ``program``; wait for all of them; the exit status."""
    lock = threading.Lock()
    ranks, readers = [], []
    for rank in range(n):
        env = {**os.environ, **dict(zip(PLACE, map(str, (rank, n, rank, n))))}
        proc = subprocess.Popen(program, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=_die_with_parent)
        ranks.append(proc)
        readers += [threading.Thread(target=_label, args=(rank, stream, sink, lock), daemon=True)
                    for stream, sink in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer))]
    for reader in readers:
        reader.start()

    def forward(signum: int, _frame: object) -> None:
        for proc in ranks:
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [proc.wait() for proc in ranks]
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
    return run(args.n, args.program)


if __name__ == "__main__":
    sys.exit(main())
