"""Horovod allreduce of a 16 MiB float32 tensor between ranks started by srun, over MPI or Gloo.

Run where srun works (a login node, or inside an allocation), with an env that has Horovod:
``python -m jupyter_hpcai.bench.allreduce --nodes 2 --ranks 2 --transport gloo [--mib 16] [--repeat 30]``.
It prints ``allreduce median_ms <ms> ranks <n> nodes <m> transport <t>`` (rank 0's median).

MPI: Horovod's MPI controller and MPI collectives (``srun --mpi=pmix``). Gloo: Horovod's Gloo controller,
as ``horovodrun --gloo`` runs it: a rendezvous server here, on the address the nodes reach this host at,
and each rank told its place from Slurm's variables. Either way, the ranks point their transports at the
interface of their node's Slurm address first, as the engines do (network.py).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

TRANSPORTS = ("mpi", "gloo")


def _address_towards(node_address: str) -> str:
    """This host's address on the way to ``node_address`` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((node_address, 9))
        return str(s.getsockname()[0])


def launch(nodes: int, ranks: int, transport: str, extra: list[str]) -> int:
    """Run the ranks under srun; for Gloo, serve Horovod's rendezvous from here for as long as they run."""
    from .. import network, slurm

    addresses = slurm.node_addresses([n.name for n in slurm.nodes()])  # once, for every rank (network.py)
    env = {**os.environ, "OMP_NUM_THREADS": "1", network.NODE_ADDRS: network.encode_addresses(addresses)}
    server = None
    srun = ["srun", "--mpi=pmix", f"--nodes={nodes}", f"--ntasks={ranks}", "--distribution=block", "--time=00:10:00"]
    if transport == "gloo":
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.http.http_server import RendezvousServer

        hostnames = _step_hosts(srun, env)
        slots = ",".join(f"{h}:{hostnames.count(h)}" for h in dict.fromkeys(hostnames))
        plan = get_host_assignments(parse_hosts(slots), ranks)
        server = RendezvousServer()
        port = server.start()
        server.init(plan)
        env.update(HOROVOD_GLOO_RENDEZVOUS_ADDR=_address_towards(addresses[hostnames[0]]),
                   HOROVOD_GLOO_RENDEZVOUS_PORT=str(port),
                   HOROVOD_CONTROLLER="gloo", HOROVOD_CPU_OPERATIONS="gloo")
        srun += [f"--nodelist={','.join(dict.fromkeys(hostnames))}"]
    else:
        env.update(HOROVOD_CONTROLLER="mpi", HOROVOD_CPU_OPERATIONS="mpi")
    try:
        return subprocess.run([*srun, sys.executable, "-m", __spec__.name, "--rank", "--transport", transport, *extra],
                              env=env, timeout=600).returncode
    finally:
        if server:
            server.stop()


def _step_hosts(srun: list[str], env: dict[str, str]) -> list[str]:
    """Which node each rank of this layout lands on (the rendezvous plan must name them)."""
    out = subprocess.run([*srun, "printenv", "SLURMD_NODENAME"], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return sorted(out.split())


def rank(transport: str, mib: int, repeat: int) -> None:
    """One rank: point the transports at this node's interface, join, time the allreduce."""
    from .. import network

    node = os.environ["SLURMD_NODENAME"]
    network.join_node_network(os.environ)
    if transport == "gloo":  # what horovodrun --gloo tells each rank, from Slurm's variables
        ntasks, nnodes = int(os.environ["SLURM_NTASKS"]), int(os.environ["SLURM_NNODES"])
        os.environ.update(HOROVOD_HOSTNAME=node, HOROVOD_RANK=os.environ["SLURM_PROCID"], HOROVOD_SIZE=str(ntasks),
                          HOROVOD_LOCAL_RANK=os.environ["SLURM_LOCALID"], HOROVOD_LOCAL_SIZE=str(ntasks // nnodes),
                          HOROVOD_CROSS_RANK=os.environ["SLURM_NODEID"], HOROVOD_CROSS_SIZE=str(nnodes))
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
        rank(args.transport, args.mib, args.repeat)
        return 0
    return launch(args.nodes, args.ranks, args.transport, ["--mib", str(args.mib), "--repeat", str(args.repeat)])


if __name__ == "__main__":
    sys.exit(main())
