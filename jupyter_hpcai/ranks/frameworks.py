"""Framework layer: how each rank initialises a distributed framework (once per engine).

A framework is a name, the distributions the preflight compares across ranks, the modules a rank imports
while it starts, and an ``init`` that runs on every rank and returns the handles for the cell namespace.
``params``, when a framework needs any, is computed once on the kernel's side for the whole world (e.g. the
rendezvous address); a framework without it is initialised by each rank as it boots, while it registers
(boot.py), so the first cell finds it ready. The magics only name a framework.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import import_module
from importlib.util import find_spec
from typing import Any, Protocol

from . import continuity
from .identity import LOCAL_RANK_VARS, RANK_VARS, first_int
from .calls import Handles, free_port, rank_info


class World(Protocol):
    """What ``params`` sees of the engines: their ranks, and a call on one rank."""

    @property
    def ranks(self) -> Sequence[Any]: ...

    def call(self, rank: int, function: Callable[..., Any], *args: Any) -> Any: ...


@dataclass(frozen=True)
class Framework:
    name: str
    distributions: tuple[str, ...]
    imports: tuple[str, ...]
    init: Callable[[dict[str, Any]], Handles]  # params -> handles, on a rank
    max_over_ranks: Callable[[int], int]  # a collective every rank calls: the largest of their values
    broadcast_object: Callable[[Any], Any]  # a collective every rank calls: rank 0's (picklable) value
    params: Callable[[World], dict[str, Any]] | None = None

    def boot(self) -> Handles | None:
        """On a rank while it starts: import the framework, and initialise it when that needs no params."""
        for module in self.imports:
            import_module(module)
        return self.init({}) if self.params is None else None

    def installed(self) -> bool:
        """Whether this python has the framework's packages (the ranks run the same python)."""
        return all(find_spec(module.partition(".")[0]) is not None for module in self.imports)


def _init_horovod(params: dict[str, Any]) -> Handles:
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
    names = {"hvd": hvd, "tf": tf, "rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
             "hpc": continuity}
    return names, {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "gpus": len(gpus),
                   "controller": "mpi" if hvd.mpi_enabled() else "gloo"}


def _horovod_max(value: int) -> int:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    return int(hvd.allreduce(tf.constant(value, dtype=tf.int32), op=hvd.Max).numpy())


def _horovod_broadcast(value: Any) -> Any:
    import horovod.tensorflow as hvd

    return hvd.broadcast_object(value, root_rank=0)


def _torch_params(world: World) -> dict[str, Any]:
    """Rendezvous for torch.distributed: rank 0's node address and a port free there."""
    return torch_rendezvous(world.ranks[0].addr, world.call(0, free_port), [r.host for r in world.ranks])


def torch_rendezvous(master_addr: str, master_port: int, hosts: Sequence[str]) -> dict[str, Any]:
    """torch.distributed's params for ranks on ``hosts`` (each rank's host, in rank order)."""
    return {"master_addr": master_addr, "master_port": master_port, "world_size": len(hosts),
            "local_world_sizes": {h: hosts.count(h) for h in hosts},
            "backend": os.environ.get("HPCAI_TORCH_BACKEND", "")}


def _init_torch(params: dict[str, Any]) -> Handles:
    import datetime as dt

    import torch
    import torch.distributed as dist

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
    names = {"torch": torch, "dist": dist, "rank": rank, "world_size": params["world_size"],
             "local_rank": env["LOCAL_RANK"], "device": device, "hpc": continuity}
    return names, {"rank": rank, "world_size": params["world_size"], "backend": backend, "device": str(device)}


def _torch_max(value: int) -> int:
    import torch
    import torch.distributed as dist

    found = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(found, op=dist.ReduceOp.MAX)
    return int(found.item())


def _torch_broadcast(value: Any) -> Any:
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


FRAMEWORKS: dict[str, Framework] = {
    "horovod": Framework("horovod", ("tensorflow", "tensorflow-cpu", "horovod", "mpi4py"),
                         ("tensorflow", "horovod.tensorflow"), _init_horovod, _horovod_max, _horovod_broadcast),
    "torch": Framework("torch", ("torch",), ("torch", "torch.distributed"), _init_torch, _torch_max, _torch_broadcast,
                       _torch_params),
}
DISTRIBUTIONS = tuple(dict.fromkeys(d for f in FRAMEWORKS.values() for d in f.distributions))


def default_framework() -> str | None:
    """The framework ranks initialise as they boot when the user names none: the env's (Horovod first)."""
    return next((name for name, framework in FRAMEWORKS.items() if framework.installed()), None)
