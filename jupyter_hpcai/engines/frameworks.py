"""Framework layer: how each rank initialises a distributed framework (once per engine).

A backend is a name, the distributions the preflight compares across ranks, ``params`` computed
once on the kernel's side for the whole world (e.g. the rendezvous address), and an ``init`` that
runs on every engine and puts its handles in the cell namespace. The magics only name a backend.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cluster import Engines


@dataclass(frozen=True)
class Framework:
    name: str
    distributions: tuple[str, ...]
    init: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]  # (namespace, params) -> info, on a rank
    params: Callable[[Engines], dict[str, Any]] = lambda engines: {}


def _init_horovod(ns: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
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


def _torch_params(engines: Engines) -> dict[str, Any]:
    """Rendezvous for torch.distributed: rank 0's node address and a port free there."""
    from . import rankside

    first = engines.ranks[0]
    port = engines.client[first.engine_id].apply_sync(rankside.free_port)  # type: ignore[index]
    addr = first.addr
    hosts = [r.host for r in engines.ranks]
    return {"master_addr": addr, "master_port": port, "world_size": len(engines.ranks),
            "local_world_sizes": {h: hosts.count(h) for h in hosts},
            "backend": os.environ.get("HPCAI_TORCH_BACKEND", "")}


def _init_torch(ns: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    import datetime as dt

    import torch
    import torch.distributed as dist

    from .engine import LOCAL_RANK_VARS, RANK_VARS, first_int
    from .rankside import rank_info

    me = rank_info()
    rank = first_int(os.environ, RANK_VARS, 0)
    env = {"RANK": rank, "WORLD_SIZE": params["world_size"], "LOCAL_RANK": first_int(os.environ, LOCAL_RANK_VARS, 0),
           "LOCAL_WORLD_SIZE": params["local_world_sizes"][me["host"]], "MASTER_ADDR": params["master_addr"],
           "MASTER_PORT": params["master_port"]}
    os.environ.update({k: str(v) for k, v in env.items()})
    has_gpu = torch.cuda.is_available()
    backend = params["backend"] or ("nccl" if has_gpu else "gloo")
    if backend == "nccl" and not has_gpu:
        raise RuntimeError(f"backend nccl needs a GPU on every rank, and rank {rank} on {me['host']} has none "
                           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}); use gloo on CPUs")
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group(backend, rank=rank, world_size=params["world_size"], timeout=dt.timedelta(seconds=120))
    device = torch.device("cuda", 0) if has_gpu else torch.device("cpu")
    ns.update(torch=torch, dist=dist, rank=rank, world_size=params["world_size"], local_rank=env["LOCAL_RANK"],
              device=device)
    return {"rank": rank, "world_size": params["world_size"], "backend": backend, "device": str(device)}


FRAMEWORKS: dict[str, Framework] = {
    "horovod": Framework("horovod", ("tensorflow", "tensorflow-cpu", "horovod", "mpi4py"), _init_horovod),
    "torch": Framework("torch", ("torch",), _init_torch, _torch_params),
}
