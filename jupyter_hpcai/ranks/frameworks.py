"""Framework layer: how each rank initialises a distributed framework (once per engine, and again when its world
re-forms, rests or wakes).

A framework is a name, the distributions the preflight compares across ranks, the modules a rank imports
while it starts, and an ``init`` that runs on every rank and returns the handles for the cell namespace.
``params``, when a framework needs any, is computed once on the kernel's side for the whole world (e.g. the
rendezvous address); a framework without it is initialised by each rank as it boots, while it registers
(boot.py), so the first cell finds it ready. The magics only name a framework.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from . import continuity
from ..contract import RENDEZVOUS_KEY
from ..errors import HPCAIError
from ..network import LOOPBACK
from ..paths import write_private
from .identity import LOCAL_RANK_VARS, RANK_VARS, first_int
from .calls import held_port, rank_info, take_held
from .framework import Framework, Handles, World
from .telemetry import FOLDER_VAR


# Horovod over Gloo (the default): the kernel holds the rendezvous (horovod_rendezvous) for the world's life and
# tells the ranks where it is and how many ranks each node has; each rank takes its slot from that, as horovodrun's
# Gloo mode tells its workers. Such a world can change: after a re-forming (world.py) every rank shuts Horovod down
# and initialises it again with the new world's slots. Over MPI (HPCAI_HOROVOD_CONTROLLER=mpi) Horovod takes the
# launch's MPI world, which it cannot leave: such a world cannot grow, shrink or go on without lost ranks.
CONTROLLER_VAR = "HPCAI_HOROVOD_CONTROLLER"  # gloo (default) or mpi: read by the kernel
RENDEZVOUS_VAR = "HPCAI_HOROVOD_RENDEZVOUS"  # kernel -> rank: "addr:port" of the kernel's rendezvous; empty: MPI
# (its key is in the set's private folder: contract.RENDEZVOUS_KEY; a re-formed world's comes with its params)
PER_NODE_VAR = "HPCAI_HOROVOD_RANKS_PER_NODE"  # kernel -> rank: "2,2": ranks on each node, in rank order
LAUNCH_VARS = (RENDEZVOUS_VAR, PER_NODE_VAR)  # set for every launch, empty where unused (mpirun -x passes them)


def horovod_controller() -> str:
    """Horovod's controller for the worlds this kernel starts: gloo, or mpi. A container env's ranks take MPI
    unless told otherwise: inside udocker, Gloo did not find the node's interface ("Unable to find address")."""
    default = "mpi" if os.environ.get("HPCAI_CONTAINER") else "gloo"
    value = os.environ.get(CONTROLLER_VAR, default) or default
    if value not in ("gloo", "mpi"):
        raise HPCAIError(f"{CONTROLLER_VAR}={value!r} is not a Horovod controller", "use gloo (the default) or mpi")
    return value


def _horovod_launch_env(world: World, per_node: Sequence[int], addresses: Iterable[str]) -> dict[str, str]:
    """In the kernel, before the ranks start on nodes at ``addresses``: where they find the world's rendezvous
    (Gloo), or nothing (MPI)."""
    if horovod_controller() == "mpi":
        return {RENDEZVOUS_VAR: "", PER_NODE_VAR: ""}
    addr, port, key = horovod_rendezvous(world, launch_hosts(per_node), addresses)
    write_private(world.folder / RENDEZVOUS_KEY, key)  # the ranks read it there: never in an environment
    return {RENDEZVOUS_VAR: f"{addr}:{port}", PER_NODE_VAR: ",".join(map(str, per_node))}


def horovod_slots(hosts: Sequence[str]) -> list[dict[str, Any]]:
    """Each rank's Horovod slot (rank order) for ranks on ``hosts``: local and cross ranks as horovodrun counts them
    (cross: among the nodes' ranks with the same local rank)."""
    local, seen = [], {}  # type: ignore[var-annotated]
    for host in hosts:
        local.append(seen.get(host, 0))
        seen[host] = local[-1] + 1
    peers: dict[int, list[str]] = {}
    for host, lr in zip(hosts, local):
        if host not in peers.setdefault(lr, []):
            peers[lr].append(host)
    return [{"hostname": host, "rank": rank, "size": len(hosts), "local_rank": local[rank], "local_size": seen[host],
             "cross_rank": peers[local[rank]].index(host), "cross_size": len(peers[local[rank]])}
            for rank, host in enumerate(hosts)]


def launch_hosts(per_node: Sequence[int]) -> list[str]:
    """Stand-in host names for a launch's ranks, in rank order (block placement): what grouping needs."""
    return [f"node{i}" for i, count in enumerate(per_node) for _ in range(count)]


MAX_RENDEZVOUS_VALUE = 1 << 16  # bytes one PUT may carry: a rank's address and port, with room to spare
MAX_RENDEZVOUS_BYTES = 64 << 20  # bytes a world's rendezvous holds in all
MAX_RENDEZVOUS_CONNECTIONS = 256  # requests it serves at once (each a thread for up to 3 s, Horovod's own timeout)


def horovod_rendezvous(world: World, hosts: Sequence[str], addresses: Iterable[str]) -> tuple[str, int, str]:
    """In the kernel: Horovod's rendezvous for ranks on ``hosts`` (kept in the world's services for its life, bound
    to the controller's address only), set for them with a fresh key; its address, port and key. It answers only
    the ranks' nodes (``addresses``) and requests that carry the key: another user with a job on those nodes could
    otherwise rewrite where a rank listens, or fill the kernel's memory (Horovod's store has no key of its own)."""
    from horovod.runner.common.util.hosts import SlotInfo

    server = world.services.get("horovod")
    if server is None:
        server = world.services["horovod"] = rendezvous_server(world.listens)
        threading.Thread(target=server.serve_forever, name="hpcai-horovod-rendezvous", daemon=True).start()
    server.renew(len(hosts))  # the new world's key first, then the nodes that may ask with it
    server.allowed = {world.listens, LOOPBACK, *addresses}
    server.init([SlotInfo(**slot) for slot in horovod_slots(hosts)])
    return world.listens, int(server.server_address[1]), str(server.key)


def rendezvous_address(addr: str, port: int | str, key: str) -> str:
    """What a rank gives Horovod as HOROVOD_GLOO_RENDEZVOUS_ADDR: Horovod's client builds every URL as
    ``http://ADDR:PORT/scope/key``, so the world's key rides in the path, where the server checks it."""
    return f"{addr}:{port}/{key}"


class _Full(Exception):
    """A PUT the rendezvous has no room for (its world's bounds)."""


def rendezvous_server(listens: str) -> Any:
    """Horovod's rendezvous server for one world at a time: it answers only addresses in its ``allowed`` whose
    requests carry its ``key`` (``rendezvous_address``), and holds at most the scopes, keys and bytes its world
    needs (``renew``); each PUT at most MAX_RENDEZVOUS_VALUE bytes; it never holds up its own shutdown."""
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    class Handler(RendezvousHandler):  # type: ignore[misc]
        def _keyed(self) -> bool:
            """Whether the request carries the world's key (then its path is Horovod's own); else 403."""
            given, _, rest = self.path[1:].partition("/")
            if hmac.compare_digest(given.encode(), f"{self.server.key}:{self.server.server_address[1]}".encode()):
                self.path = f"/{rest}"
                return True
            self.send_status_code(403)
            return False

        def do_GET(self) -> None:
            if self._keyed():
                super().do_GET()

        def do_HEAD(self) -> None:  # Python's file server's own, which would stat files below the kernel's folder
            self.send_status_code(405)

        def do_DELETE(self) -> None:
            if self._keyed():
                super().do_DELETE()

        def do_PUT(self) -> None:
            length = self.headers.get("Content-Length", "")
            if not length.isdigit() or int(length) > MAX_RENDEZVOUS_VALUE:
                self.send_status_code(413)
            elif self._keyed():
                try:
                    super().do_PUT()
                except _Full:
                    self.send_status_code(507)

        def _put_value(self, scope: str, key: str, value: bytes) -> None:
            if not self.server.room(scope, key, value):
                raise _Full
            super()._put_value(scope, key, value)

    class Server(RendezvousHTTPServer):  # type: ignore[misc]
        daemon_threads, block_on_close = True, False
        allowed: set[str] = set()
        key = secrets.token_hex(16)  # each world's own from renew()
        limits = (0, 0)  # scopes, keys in all
        connections = threading.BoundedSemaphore(MAX_RENDEZVOUS_CONNECTIONS)  # at once: a thread each

        def verify_request(self, request: Any, client_address: Any) -> bool:
            return str(client_address[0]) in self.allowed and self.connections.acquire(blocking=False)

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                self.connections.release()

        def renew(self, size: int) -> None:
            """A fresh key, and bounds, for a world of ``size`` ranks: Horovod's scopes are the world, each node and
            each local rank (for each process set), and each holds a key or two for each of its ranks."""
            self.key, self.limits = secrets.token_hex(16), (4 * size + 64, 16 * size + 1024)

        def room(self, scope: str, key: str, value: bytes) -> bool:
            """Whether the store may take ``value`` at ``scope``/``key`` within the world's bounds."""
            with self.cache_lock:
                held = self.cache.get(scope, {})
                scopes = len(self.cache) + (scope not in self.cache)
                keys = sum(map(len, self.cache.values())) + (key not in held)
                size = sum(len(v) for s in self.cache.values() for v in s.values()) - len(held.get(key, b""))
                return scopes <= self.limits[0] and keys <= self.limits[1] and size + len(value) <= MAX_RENDEZVOUS_BYTES

    return Server((listens, 0), Handler, 0)


def _horovod_fixed() -> str | None:
    """Why this kernel's Horovod worlds cannot change, or None."""
    if horovod_controller() == "mpi":
        return (f"Horovod runs over MPI here ({CONTROLLER_VAR}=mpi): its world cannot grow, shrink or lose ranks "
                f"(unset {CONTROLLER_VAR}, then %hpc restart)")
    return None


def _horovod_reformed(world: World) -> dict[str, Any]:
    """In the kernel, for a re-formed world: the rendezvous set for it, and every rank's slot."""
    if why := _horovod_fixed():
        raise HPCAIError(why, "run the cell on the world as it started: %hpc restart")
    hosts = [r.host for r in world.ranks]  # the key goes to the ranks with the params, over the engines' channel
    return {"rendezvous": list(horovod_rendezvous(world, hosts, {r.addr for r in world.ranks})),
            "slots": horovod_slots(hosts)}


# Horovod's background thread coordinates the ranks every cycle (1 ms unless HOROVOD_CYCLE_TIME says otherwise), busy
# or not: 7-15 % of a core per idle rank over Gloo on the dev cluster (4 ranks, 2 nodes). A world at rest runs a 50 ms
# cycle: about 1 %, and each collective waits up to a cycle; the next cell wakes it (about 0.25 s on 4 ranks).
REST_CYCLE_MS = 50
_AWAKE_CYCLE = os.environ.get("HOROVOD_CYCLE_TIME")  # the rank's own (the user's, or unset), read at its boot


def _horovod_rest(world: World) -> dict[str, Any] | None:
    """In the kernel, for an idle world over Gloo: the re-formed world's params with the resting cycle. A world over
    MPI cannot initialise Horovod again, and one whose cycle Horovod's autotuner tunes would lose that: neither
    rests."""
    if _horovod_fixed() or _horovod_flag("HOROVOD_AUTOTUNE"):
        return None
    return {**_horovod_reformed(world), "resting": True}


def _horovod_flag(name: str) -> bool:
    """A Horovod switch as Horovod reads it (env_parser.cc): on when its value starts with an integer above 0."""
    digits = re.match(r"\s*[+-]?\d+", os.environ.get(name, ""))
    return digits is not None and int(digits.group()) > 0


def _set_cycle(resting: bool) -> None:
    """Horovod's cycle for the next ``hvd.init()``: the resting one, or the rank's own. Set either way: a cycle once
    set by the variable stays fixed in the process (Horovod's ParameterManager) until the variable sets another."""
    if resting:
        os.environ["HOROVOD_CYCLE_TIME"] = str(REST_CYCLE_MS)
    else:  # Horovod's own default where the rank has none: 1 ms, 0 with XLA ops
        os.environ["HOROVOD_CYCLE_TIME"] = _AWAKE_CYCLE or ("0" if _horovod_flag("HOROVOD_ENABLE_XLA_OPS") else "1")


def _join_gloo(rendezvous: Sequence[Any], slot: dict[str, Any]) -> None:
    """Horovod's own variables for a Gloo world: where the rendezvous is (address, port, the world's key), and this
    rank's slot."""
    addr, port, key = rendezvous
    os.environ.update({"HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_address(addr, port, key),
                       "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port), "HOROVOD_CONTROLLER": "gloo",
                       "HOROVOD_CPU_OPERATIONS": "gloo",
                       **{f"HOROVOD_{key.upper()}": str(value) for key, value in slot.items()}})


def _init_horovod(params: dict[str, Any]) -> Handles:
    import tensorflow as tf

    rank = first_int(os.environ, RANK_VARS, 0)
    gpus = _tensorflow_setup(tf)
    if params.get("slots"):  # a re-formed world, or one resting or waking: out of the last one, into this one
        import horovod.tensorflow as hvd

        if hvd.is_initialized():
            hvd.shutdown()
        _join_gloo(params["rendezvous"], params["slots"][rank])
        _set_cycle(bool(params.get("resting")))
        hvd.init()
        return _horovod_handles(tf, len(gpus))
    if rendezvous := os.environ.get(RENDEZVOUS_VAR):  # the launch's world, over Gloo
        per_node = [int(c) for c in os.environ[PER_NODE_VAR].split(",")]
        key = (Path(os.environ[FOLDER_VAR]) / RENDEZVOUS_KEY).read_text()
        _join_gloo([*rendezvous.rsplit(":", 1), key], horovod_slots(launch_hosts(per_node))[rank])
    import horovod.tensorflow as hvd  # after TensorFlow's threads are set

    hvd.init()
    return _horovod_handles(tf, len(gpus))


def _tensorflow_setup(tf: Any) -> list[Any]:
    """TensorFlow's thread counts and GPU memory growth, before its runtime starts (a rank that ran TensorFlow
    already, in a world before this one, keeps what it had); the GPUs it sees."""
    intra = int(os.environ.get("TF_NUM_INTRAOP_THREADS", "0"))
    gpus = tf.config.list_physical_devices("GPU")
    try:
        if intra:
            tf.config.threading.set_intra_op_parallelism_threads(intra)
            tf.config.threading.set_inter_op_parallelism_threads(int(os.environ.get("TF_NUM_INTEROP_THREADS", "1")))
        for gpu in gpus:  # the engine already sees only its own GPU (CUDA_VISIBLE_DEVICES)
            tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError:  # "cannot be modified after initialization"
        pass
    return gpus


def _horovod_handles(tf: Any, gpus: int) -> Handles:
    import horovod.tensorflow as hvd

    names = {"hvd": hvd, "tf": tf, "rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
             "hpc": continuity}
    return names, {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "gpus": gpus,
                   "controller": "mpi" if hvd.mpi_enabled() else "gloo"}


def _horovod_max(value: int) -> int:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    return int(hvd.allreduce(tf.constant(value, dtype=tf.int32), op=hvd.Max).numpy())


def _horovod_broadcast(value: Any) -> Any:
    import horovod.tensorflow as hvd

    return hvd.broadcast_object(value, root_rank=0)


def _torch_params(world: World) -> dict[str, Any]:
    """Rendezvous for torch.distributed: rank 0's node address and a port rank 0 holds there from now on (its store
    serves on it: no port chosen, let go, and taken first by another user's process)."""
    addr = world.ranks[0].addr
    return torch_rendezvous(addr, world.call(0, held_port, addr), [r.host for r in world.ranks])


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
    env = torchrun_environ(params, rank, first_int(os.environ, LOCAL_RANK_VARS, 0), me["host"], me["job"])
    os.environ.update(env)
    has_gpu = torch.cuda.is_available()
    backend = params["backend"] or ("nccl" if has_gpu else "gloo")
    if backend == "nccl" and not has_gpu:
        raise RuntimeError(f"backend nccl needs a GPU on every rank, and rank {rank} on {me['host']} has none "
                           f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}); use gloo on CPUs")
    if dist.is_initialized():
        dist.destroy_process_group()
    timeout = dt.timedelta(seconds=120)
    dist.init_process_group(backend, rank=rank, world_size=params["world_size"], timeout=timeout,
                            store=_torch_store(dist, params, rank, timeout))
    device = torch.device("cuda", 0) if has_gpu else torch.device("cpu")
    names = {"torch": torch, "dist": dist, "rank": rank, "world_size": params["world_size"],
             "local_rank": int(env["LOCAL_RANK"]), "device": device, "hpc": continuity}
    return names, {"rank": rank, "world_size": params["world_size"], "backend": backend, "device": str(device)}


def torchrun_environ(params: dict[str, Any], rank: int, local_rank: int, host: str, job: str) -> dict[str, str]:
    """What torchrun (its elastic agent) gives each worker of a multi-node run, for a rank of this world: scripts
    written for torchrun (DDP, HF Accelerate, Lightning) read these. A node is a torchrun "group" and the whole world
    one role ("default"); the world is not restarted by an agent, so the restart count and maximum are 0."""
    nodes = list(params["local_world_sizes"])  # in rank order
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(params["world_size"]),
            "LOCAL_WORLD_SIZE": str(params["local_world_sizes"][host]), "GROUP_RANK": str(nodes.index(host)),
            "GROUP_WORLD_SIZE": str(len(nodes)), "ROLE_RANK": str(rank), "ROLE_NAME": "default",
            "ROLE_WORLD_SIZE": str(params["world_size"]), "MASTER_ADDR": params["master_addr"],
            "MASTER_PORT": str(params["master_port"]), "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": f"hpcai-{job}",
            "TORCHELASTIC_USE_AGENT_STORE": "False",  # rank 0's store, made in the cell's init, not an agent's
            "TORCHELASTIC_SIGNALS_TO_HANDLE": os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE",
                                                             "SIGTERM,SIGINT,SIGHUP,SIGQUIT"),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")}


def _torch_store(dist: Any, params: dict[str, Any], rank: int, timeout: Any) -> Any:
    """The world's TCPStore: rank 0 serves it on the socket it has held since the kernel asked for its port
    (calls.held_port; an exported job's rank 0 binds the job's port as it starts), the others connect there."""
    held = take_held(int(params["master_port"])) if rank == 0 else None
    return dist.TCPStore(params["master_addr"], int(params["master_port"]), params["world_size"], rank == 0, timeout,
                         **({"master_listen_fd": held.detach(), "use_libuv": False} if held is not None else {}))


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
    "horovod": Framework("horovod", "horovod_run", "Horovod on TensorFlow", ("hvd", "tf", "rank", "size", "local_rank"),
                         ("tensorflow", "tensorflow-cpu", "horovod", "mpi4py"),
                         ("tensorflow", "horovod.tensorflow"), _init_horovod, _horovod_max, _horovod_broadcast,
                         reformed=_horovod_reformed, fixed=_horovod_fixed, launch_env=_horovod_launch_env,
                         rest=_horovod_rest),
    "torch": Framework("torch", "torchrun", "torch.distributed", ("dist", "rank", "world_size", "local_rank", "device"),
                       ("torch",), ("torch", "torch.distributed"), _init_torch, _torch_max, _torch_broadcast,
                       _torch_params),
}
DISTRIBUTIONS = tuple(dict.fromkeys(d for f in FRAMEWORKS.values() for d in f.distributions))


def default_framework() -> str | None:
    """The framework ranks initialise as they boot when the user names none: the env's (Horovod first)."""
    return next((name for name, framework in FRAMEWORKS.items() if framework.installed()), None)
