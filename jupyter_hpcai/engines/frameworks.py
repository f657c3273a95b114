"""Framework layer: how each rank initialises a distributed framework (once per engine).

A backend is a name, the distributions the preflight compares across ranks, and an ``init``
that runs on the engine and puts its handles (``hvd``, ``rank``, ...) in the cell namespace.
The magics only name a backend; adding one touches nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Framework:
    name: str
    distributions: tuple[str, ...]
    init: Callable[[dict[str, Any]], dict[str, Any]]


def _init_horovod(ns: dict[str, Any]) -> dict[str, Any]:
    import tensorflow as tf

    intra = int(os.environ.get("TF_NUM_INTRAOP_THREADS", "0"))
    if intra:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(int(os.environ.get("TF_NUM_INTEROP_THREADS", "1")))
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:  # the engine already sees only its own GPU (CUDA_VISIBLE_DEVICES)
        tf.config.experimental.set_memory_growth(gpu, True)
    import horovod.tensorflow as hvd

    hvd.init()
    ns.update(hvd=hvd, tf=tf, rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank())
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "gpus": len(gpus),
            "controller": "mpi" if hvd.mpi_enabled() else "gloo"}


FRAMEWORKS: dict[str, Framework] = {
    "horovod": Framework("horovod", ("tensorflow", "tensorflow-cpu", "horovod", "mpi4py"), _init_horovod),
}
