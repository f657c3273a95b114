"""Run a Python module on ranks started by srun, with Horovod set up as its own launcher would: the baseline the
benchmarks hold the engines against (no kernel, no engines).

    python -m jupyter_hpcai.bench.horovodrun --nodes 2 --ranks 4 --transport gloo MODULE [ARGS ...]

MPI: Horovod's MPI controller and collectives (``srun --mpi=pmix``). Gloo: Horovod's Gloo controller, as
``horovodrun --gloo`` runs it: a rendezvous server here, on the address the nodes reach this host at, and each
rank told its place from Slurm's variables. Either way, every rank points its transports at the interface of its
node's Slurm address first, as the engines do (network.py), then runs MODULE as ``python -m`` would.
Run it where srun works (a login node, or inside an allocation), with an env that has Horovod.
"""

from __future__ import annotations

import argparse
import os
import runpy
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

TRANSPORTS = ("mpi", "gloo")
_RANK_FLAG = "--as-rank"  # what srun runs on each rank: this module again, with the flag first


def _address_towards(node_address: str) -> str:
    """This host's address on the way to ``node_address`` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((node_address, 9))
        return str(s.getsockname()[0])


def _step_hosts(srun: list[str], env: dict[str, str]) -> list[str]:
    """Which node each rank of this layout lands on (the rendezvous plan must name them)."""
    out = subprocess.run([*srun, "printenv", "SLURMD_NODENAME"], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return sorted(out.split())


@contextmanager
def prepared(nodes: int, ranks: int, transport: str, module: str, args: list[str],
             env: dict[str, str] | None = None, per_node: int | None = None) -> Iterator[tuple[list[str], dict[str, str]]]:
    """The srun command and its environment that run ``module`` with ``args`` on ``ranks`` ranks over ``nodes``
    nodes (``per_node`` on each, if given); for Gloo, Horovod's rendezvous is served from here while the block runs."""
    from .. import network, slurm

    if transport not in TRANSPORTS:
        raise ValueError(f"transport {transport!r}: use one of {', '.join(TRANSPORTS)}")
    addresses = slurm.node_addresses([n.name for n in slurm.nodes()])  # once, for every rank (network.py)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {}),
           network.NODE_ADDRS: network.encode_addresses(addresses)}
    srun = ["srun", "--mpi=pmix", "--overlap", f"--nodes={nodes}", f"--ntasks={ranks}", "--distribution=block",
            *([f"--ntasks-per-node={per_node}"] if per_node else [])]
    server = None
    if transport == "gloo":
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.http.http_server import RendezvousServer

        hostnames = _step_hosts(srun, env)
        slots = ",".join(f"{h}:{hostnames.count(h)}" for h in dict.fromkeys(hostnames))
        server = RendezvousServer()
        port = server.start()
        server.init(get_host_assignments(parse_hosts(slots), ranks))
        env.update(HOROVOD_GLOO_RENDEZVOUS_ADDR=_address_towards(addresses[hostnames[0]]),
                   HOROVOD_GLOO_RENDEZVOUS_PORT=str(port), HOROVOD_CONTROLLER="gloo", HOROVOD_CPU_OPERATIONS="gloo")
        srun += [f"--nodelist={','.join(dict.fromkeys(hostnames))}"]
    else:
        env.update(HOROVOD_CONTROLLER="mpi", HOROVOD_CPU_OPERATIONS="mpi")
    try:
        yield [*srun, sys.executable, "-m", __spec__.name, _RANK_FLAG, module, *args], env
    finally:
        if server:
            server.stop()


def launch(nodes: int, ranks: int, transport: str, module: str, args: list[str],
           env: dict[str, str] | None = None, **run: Any) -> subprocess.CompletedProcess[str]:
    """Run ``module`` on the ranks (see ``prepared``) and wait for them; ``run`` goes to subprocess.run."""
    run.setdefault("timeout", 600)
    with prepared(nodes, ranks, transport, module, args, env) as (argv, full_env):
        return subprocess.run(argv, env=full_env, text=True, **run)


def _as_rank(module: str, args: list[str]) -> None:
    """On one rank: join the node's network, take this rank's Gloo slot from Slurm's variables (what horovodrun
    --gloo tells its workers), then run ``module``."""
    from .. import network

    network.join_node_network(os.environ)
    if os.environ.get("HOROVOD_CONTROLLER") == "gloo":
        ntasks, nnodes = int(os.environ["SLURM_NTASKS"]), int(os.environ["SLURM_NNODES"])
        os.environ.update(HOROVOD_HOSTNAME=os.environ["SLURMD_NODENAME"], HOROVOD_RANK=os.environ["SLURM_PROCID"],
                          HOROVOD_SIZE=str(ntasks), HOROVOD_LOCAL_RANK=os.environ["SLURM_LOCALID"],
                          HOROVOD_LOCAL_SIZE=str(ntasks // nnodes), HOROVOD_CROSS_RANK=os.environ["SLURM_NODEID"],
                          HOROVOD_CROSS_SIZE=str(nnodes))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [_RANK_FLAG]:
        _as_rank(argv[1], argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--transport", choices=TRANSPORTS, default="mpi")
    parser.add_argument("module")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    return launch(opts.nodes, opts.ranks, opts.transport, opts.module, opts.args).returncode


if __name__ == "__main__":
    sys.exit(main())
