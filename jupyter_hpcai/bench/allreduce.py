"""Horovod allreduce of a 16 MiB float32 tensor between ranks started by srun, over MPI or Gloo.

Run where srun works (a login node, or inside an allocation), with an env that has Horovod:
``python -m jupyter_hpcai.bench.allreduce --nodes 2 --ranks 2 --transport gloo [--mib 16] [--repeat 30]``.
It prints ``allreduce median_ms <ms> ranks <n> nodes <m> transport <t>`` (rank 0's median). The ranks start as
horovodrun would start them over that transport (horovodrun.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from ..scheduler import chosen
from .horovodrun import TRANSPORTS, launch

environment = chosen().environment


def rank(mib: int, repeat: int) -> None:
    """One rank, started by horovodrun.py: join, time the allreduce."""
    node = environment.node_name(os.environ)
    import horovod.tensorflow as hvd
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    hvd.init()
    tensor = tf.ones(mib * 2**20 // 4, dtype=tf.float32)
    for i in range(3):  # the first collectives set up the connections
        hvd.allreduce(tensor, op=hvd.Sum, name=f"warm{i}")
    times = []
    for i in range(repeat):
        start = time.perf_counter()
        hvd.allreduce(tensor, op=hvd.Sum, name=f"t{i}").numpy()
        times.append(time.perf_counter() - start)
    nodes = len(set(hvd.allgather_object(node)))
    if hvd.rank() == 0:
        print(f"allreduce median_ms {statistics.median(times) * 1e3:.2f} ranks {hvd.size()} nodes {nodes} "
              f"transport {'mpi' if hvd.mpi_enabled() else 'gloo'}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--transport", choices=TRANSPORTS, default="mpi")
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)  # what srun runs on each rank
    args = parser.parse_args(argv)
    if args.rank:
        rank(args.mib, args.repeat)
        return 0
    return launch(args.nodes, args.ranks, args.transport, __spec__.name,
                  ["--rank", "--mib", str(args.mib), "--repeat", str(args.repeat)]).returncode


if __name__ == "__main__":
    sys.exit(main())
