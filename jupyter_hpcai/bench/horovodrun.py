"""Run a Python module on srun's ranks with Horovod set up as its own launcher would set it up.

    python -m jupyter_hpcai.bench.horovodrun --nodes 2 --ranks 4 --transport gloo MODULE [ARGS ...]

The baseline the benchmarks hold the engines against: no kernel, no engines. MPI: Horovod's MPI controller and
collectives (``srun --mpi=pmix``). Gloo: Horovod's Gloo controller, as ``horovodrun --gloo`` runs it: a rendezvous
here, on the address the nodes reach this host at, and each rank told its slot. Either way, every rank points its
transports at the interface of its node's Slurm address first, as the engines do (network.py), then runs MODULE as
``python -m`` would. Run it where srun works (a login node, or inside an allocation), with an env that has Horovod.
"""

from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

TRANSPORTS = ("mpi", "gloo")
_RANK_FLAG = "--as-rank"  # what srun runs on each rank: this module again, with the flag first
_HOSTS_VAR = "HPCAI_HOROVODRUN_HOSTS"  # launcher -> rank: each rank's node, in rank order (Gloo)


def _step_hosts(srun: list[str], env: dict[str, str]) -> list[str]:
    """Each rank's node, in rank order, for this layout (the rendezvous's slots must name them)."""
    from ..scheduler import chosen

    environment = chosen().environment
    say = f'echo "${environment.RANK} ${environment.NODE_NAME}"'
    out = subprocess.run([*srun, "sh", "-c", say], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    return [host for _, host in sorted((int(rank), host) for rank, host in (line.split() for line in out.splitlines()))]


@contextmanager
def prepared(nodes: int, ranks: int, transport: str, module: str, args: list[str], env: dict[str, str] | None = None,
             per_node: int | None = None) -> Iterator[tuple[list[str], dict[str, str]]]:
    """The srun command and its environment (this process's, OMP_NUM_THREADS=1, then ``env``) that run ``module``
    with ``args`` on ``ranks`` ranks over ``nodes`` nodes, at most ``per_node`` on each if given; for Gloo,
    Horovod's rendezvous is served from here, to the ranks' nodes only, while the block runs."""
    from .. import network
    from ..scheduler import chosen

    scheduler = chosen()
    if transport not in TRANSPORTS:
        raise ValueError(f"transport {transport!r}: use one of {', '.join(TRANSPORTS)}")
    addresses = scheduler.node_addresses([n.name for n in scheduler.nodes()])  # once, for every rank (network.py)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {}),
           network.NODE_ADDRS: network.encode_addresses(addresses)}
    in_job = scheduler.environment.job_id(os.environ)  # else a job of its own: not the partition's limit
    srun = scheduler.step(nodes=nodes, tasks=ranks, per_node=per_node, mpi=True, time=None if in_job else "00:10:00")
    if transport == "mpi":
        env.update(HOROVOD_CONTROLLER="mpi", HOROVOD_CPU_OPERATIONS="mpi")
        yield [*srun, sys.executable, "-m", __spec__.name, _RANK_FLAG, module, *args], env
        return
    from horovod.runner.common.util.hosts import SlotInfo

    from ..ranks.frameworks import horovod_slots, rendezvous_address, rendezvous_server

    hosts = _step_hosts(srun, env)
    server = rendezvous_server(network.source_address(addresses[hosts[0]]))
    server.renew(len(hosts))
    server.allowed = {server.server_address[0], network.LOOPBACK, *(addresses[h] for h in set(hosts))}
    server.init([SlotInfo(**slot) for slot in horovod_slots(hosts)])
    threading.Thread(target=server.serve_forever, name="horovodrun-rendezvous", daemon=True).start()
    addr, port = server.server_address[:2]
    try:  # the key in the ranks' environment: this benchmark's own ranks, started here
        env.update(HOROVOD_GLOO_RENDEZVOUS_ADDR=rendezvous_address(addr, port, server.key),
                   HOROVOD_GLOO_RENDEZVOUS_PORT=str(port), HOROVOD_CONTROLLER="gloo",
                   HOROVOD_CPU_OPERATIONS="gloo", **{_HOSTS_VAR: ",".join(hosts)})
        yield [*srun, f"--nodelist={','.join(dict.fromkeys(hosts))}", sys.executable, "-m", __spec__.name,
               _RANK_FLAG, module, *args], env
    finally:
        server.shutdown()
        server.server_close()


def launch(nodes: int, ranks: int, transport: str, module: str, args: list[str], env: dict[str, str] | None = None,
           per_node: int | None = None, **run: Any) -> subprocess.CompletedProcess[str]:
    """Run ``module`` on the ranks (see ``prepared``) and wait for them; ``run`` goes to subprocess.run."""
    run.setdefault("timeout", 600)
    with prepared(nodes, ranks, transport, module, args, env, per_node) as (argv, full_env):
        return subprocess.run(argv, env=full_env, text=True, **run)


def _as_rank(module: str, args: list[str]) -> None:
    """On one rank: join the node's network, take this rank's Gloo slot (what horovodrun --gloo tells its
    workers), then run ``module``."""
    from .. import network
    from ..ranks.frameworks import horovod_slots
    from ..scheduler import chosen

    environment = chosen().environment
    network.join_node_network(os.environ)
    if os.environ.get("HOROVOD_CONTROLLER") == "gloo":
        slot = horovod_slots(os.environ[_HOSTS_VAR].split(","))[int(os.environ[environment.RANK])]
        os.environ.update({f"HOROVOD_{key.upper()}": str(value) for key, value in slot.items()})
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [_RANK_FLAG]:
        _as_rank(argv[1], argv[2:])
        return 0
    parser = argparse.ArgumentParser(description="Run a Python module on srun's ranks as horovodrun would.")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--per-node", type=int, help="at most this many ranks on a node")
    parser.add_argument("--transport", choices=TRANSPORTS, default="mpi")
    parser.add_argument("module")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    return launch(opts.nodes, opts.ranks, opts.transport, opts.module, opts.args, per_node=opts.per_node).returncode


if __name__ == "__main__":
    sys.exit(main())
