"""`hpcai bench overhead`: what each layer costs, against its baselines, measured in one job.

- kernel start-to-ready through the hpcai-env provisioner / a plain ipykernel kernelspec of the same env;
- time to N Horovod-ready engines, alternating, each at least 3 times: a bare ``srun ... hvd.init()`` (the
  floor), ipyparallel's own MPI launcher through srun plus ``hvd.init()`` on every engine (what a user would
  pick instead of us), and ours (``%hpc start`` + the first ``%%horovod_run``), with where our time goes;
- empty-cell dispatch on the same engines: the ``%%horovod_run`` magic / ipyparallel's ``%%px --block`` magic,
  both run by one IPython shell in this process, alternating.
The hub's spawn-to-ready against sbatch-to-RUNNING needs a hub: the spawner tests print it.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..engines import Engines, Layout, current, plan
from ..engines.running_set import controller_ip
from ..proc import run
from ..scheduler import chosen
from ..scheduler.allocation import Allocation

scheduler = chosen()


def _median(action: Callable[[], object], times: int) -> float:
    samples = []
    for _ in range(times):
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def kernel_start(env_name: str, env_root: str, times: int = 3) -> tuple[float, float]:
    """(provisioner, plain) median start-to-ready seconds."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    from .. import kernelspec
    from ..envs import EnvStore

    env = EnvStore.at(Path(env_root)).get(env_name)
    with tempfile.TemporaryDirectory() as tmp:
        for name, spec in (("provisioned", kernelspec.render(env)),
                           ("plain", {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                                      "display_name": "plain", "language": "python"})):
            (Path(tmp) / name).mkdir()
            (Path(tmp) / name / "kernel.json").write_text(json.dumps(spec))
        ksm = KernelSpecManager(kernel_dirs=[tmp])

        def start(name: str) -> None:
            km = KernelManager(kernel_name=name, kernel_spec_manager=ksm)
            km.start_kernel()
            client = km.client()
            client.start_channels()
            client.wait_for_ready(timeout=120)
            client.stop_channels()
            km.shutdown_kernel(now=True)

        return _median(lambda: start("provisioned"), times), _median(lambda: start("plain"), times)


def _hvd_init() -> int:
    import horovod.tensorflow as hvd

    hvd.init()
    return int(hvd.rank())


def bare_srun(layout: Layout) -> float:
    """Seconds for a bare srun step whose ranks import Horovod and initialise it: the floor."""
    start = time.perf_counter()
    step = scheduler.step(nodes=layout.nodes, tasks=layout.n, per_node=layout.per_node, mpi=True)
    run([*step, sys.executable, "-c", "import horovod.tensorflow as hvd; hvd.init()"], timeout=600)
    return time.perf_counter() - start


def ipyparallel_mpi(allocation: Allocation, layout: Layout) -> float:
    """Seconds to N Horovod-ready engines with ipyparallel's own MPI launcher (through srun, its engines with
    ``--mpi``), then ``hvd.init()`` on every engine."""
    import ipyparallel as ipp
    from traitlets.config import Config

    config = Config()
    config.MPIEngineSetLauncher.mpi_cmd = scheduler.step(nodes=layout.nodes, per_node=layout.per_node, mpi=True)
    start = time.perf_counter()
    cluster = ipp.Cluster(n=layout.n, engines="mpi", controller_ip=controller_ip(allocation), config=config,
                          log_level=40, cluster_id=f"hpcai-bench-ipp-{time.monotonic_ns()}")
    try:
        client = cluster.start_and_connect_sync()
        client[:].apply_sync(_hvd_init)
        took = time.perf_counter() - start
        client.close()
    finally:
        cluster.stop_cluster_sync()
    return took


def ours(layout: Layout) -> tuple[float, Engines, dict[str, float]]:
    """Seconds to N Horovod-ready engines as a user gets them (``%hpc start``, the first ``%%horovod_run``);
    the engines, still running, and where the time went."""
    engines = current()  # the process's engines, which the magics act on
    start = time.perf_counter()
    engines.start(n=layout.n, nodes=layout.nodes, gpus_per_node=layout.per_node)
    engines.run("pass", framework="horovod", write=lambda text: None)
    took = time.perf_counter() - start
    timeline = engines.running_set().timeline
    assert timeline is not None
    timeline.mark("first %%horovod_run done (Horovod ready)")
    timeline.ranks_reached(engines.running_set().boot_timelines())
    return took, engines, dict(sorted(timeline.phases.items(), key=lambda item: item[1]))


def magic_dispatch(engines: Engines, times: int) -> dict[str, list[float]]:
    """Seconds per empty cell through each magic as a notebook runs it (an IPython shell here, its output
    swallowed): ``%%horovod_run`` on this process's engines (``engines``) and ``%%px --block`` on the same
    engines, alternating in swapped order."""
    import contextlib
    import io

    from IPython.core.interactiveshell import InteractiveShell

    from .. import magics

    shell = InteractiveShell.instance()
    magics.load(shell)
    engines.view().activate()  # registers %%px on the shell
    samples: dict[str, list[float]] = {"ours": [], "px": []}
    with contextlib.redirect_stdout(io.StringIO()):
        for i in range(times):
            pair = [("ours", ("horovod_run", "", "pass")), ("px", ("px", "--block", "pass"))]
            for name, args in pair if i % 2 else pair[::-1]:  # each first in half the rounds
                start = time.perf_counter()
                shell.run_cell_magic(*args)
                samples[name].append(time.perf_counter() - start)
    return samples


def _nothing() -> None:
    """The empty cell of BroadcastView (its coalescing apply; its execute does not coalesce)."""


def cell_costs(engines: Engines, times: int = 7) -> dict[str, dict[str, float]]:
    """Wall and kernel (this process's) CPU seconds per empty cell, medians of ``times`` alternating: ours
    (Engines.run, framework none), %%px --block (DirectView.execute, what it runs) and ipyparallel's coalescing
    BroadcastView, on the same engines."""
    world = engines.running_set()
    ids = [r.engine_id for r in world.ranks]
    ways: dict[str, Callable[[], object]] = {
        "ours": lambda: engines.run("pass", framework=None, write=lambda _: None),
        "px": lambda: world.connected[ids].execute("pass", block=True),
        "broadcast": lambda: world.connected.broadcast_view(targets=ids, is_coalescing=True).apply_sync(_nothing)}
    samples: dict[str, tuple[list[float], list[float]]] = {way: ([], []) for way in ways}
    for i in range(times + 1):  # the first round warms each way up, and is dropped
        for way, action in (list(ways.items()) if i % 2 else list(ways.items())[::-1]):
            wall, cpu = time.perf_counter(), time.process_time()
            action()
            if i:
                samples[way][0].append(time.perf_counter() - wall)
                samples[way][1].append(time.process_time() - cpu)
    return {way: {"wall": statistics.median(w), "cpu": statistics.median(c)} for way, (w, c) in samples.items()}


def engines_overhead(allocation: Allocation, n: int | None = None, times: int = 3,
                     dispatches: int = 20) -> dict[str, Any]:
    """The three ways to Horovod-ready engines, alternating, ``times`` each; then dispatch on ours, alternating
    with %%px, ``dispatches`` each. Medians; every sample is kept."""
    layout = plan(allocation, n=n)
    samples: dict[str, list[float]] = {"bare_srun": [], "ipyparallel_mpi": [], "ours": []}
    breakdowns = []
    engines = None
    for i in range(times):
        samples["bare_srun"].append(bare_srun(layout))
        samples["ipyparallel_mpi"].append(ipyparallel_mpi(allocation, layout))
        took, engines, breakdown = ours(layout)
        samples["ours"].append(took)
        breakdowns.append(breakdown)
        if i < times - 1:
            engines.stop()
    assert engines is not None
    try:
        dispatch = magic_dispatch(engines, dispatches)
    finally:
        engines.stop()
    median_run = sorted(range(times), key=lambda k: samples["ours"][k])[times // 2]
    return {"ranks": layout.n, "nodes": layout.nodes, "samples": samples, "dispatch_samples": dispatch,
            "engines_ready_s": statistics.median(samples["ours"]),
            "ipyparallel_mpi_s": statistics.median(samples["ipyparallel_mpi"]),
            "raw_srun_hvd_init_s": statistics.median(samples["bare_srun"]),
            "dispatch_s": statistics.median(dispatch["ours"]), "px_s": statistics.median(dispatch["px"]),
            "breakdown": breakdowns[median_run]}


def main(argv: list[str] | None = None) -> None:
    """Inside a job: ``python -m jupyter_hpcai.bench.overhead RESULTS ENV_NAME ENV_ROOT [TIMES]``."""
    args = argv or sys.argv[1:]
    results, env_name, env_root = args[:3]
    times = int(args[3]) if len(args) > 3 else 3
    allocation = Allocation.current()
    if allocation is None:
        raise SystemExit("run this inside a Slurm job (hpcai bench overhead submits one)")
    provisioned, plain = kernel_start(env_name, env_root)
    found = {"kernel_provisioned_s": provisioned, "kernel_plain_s": plain, **engines_overhead(allocation, times=times)}
    Path(results).mkdir(parents=True, exist_ok=True)
    (Path(results) / "overhead.json").write_text(json.dumps(found, indent=2))


def report(found: dict[str, Any], breakdown: bool = False) -> str:
    """The ratios as a markdown table (medians; the samples are in overhead.json); with ``breakdown``, where
    the time to Horovod-ready engines went, in the median run."""
    n, times = found["ranks"], len(found["samples"]["ours"])
    rows = [("kernel start-to-ready: provisioner / plain ipykernel", found["kernel_provisioned_s"], found["kernel_plain_s"]),
            (f"empty-cell dispatch on {n} engines: %%horovod_run / %%px --block "
             f"({len(found['dispatch_samples']['ours'])} alternating)", found["dispatch_s"], found["px_s"]),
            (f"{n} Horovod-ready engines: ours (%hpc start + first %%horovod_run) / bare srun hvd.init() over MPI "
             f"({times} alternating)", found["engines_ready_s"], found["raw_srun_hvd_init_s"]),
            (f"{n} Horovod-ready engines: ipyparallel's MPI launcher via srun + hvd.init() / "
             "bare srun hvd.init() over MPI",
             found["ipyparallel_mpi_s"], found["raw_srun_hvd_init_s"])]
    lines = ["| layer | ours (s) | baseline (s) | ratio |", "|---|---|---|---|"]
    lines += [f"| {name} | {ours:.3f} | {base:.3f} | {ours / base:.2f} |" for name, ours, base in rows]
    if breakdown:
        lines += ["", f"Where the {found['engines_ready_s']:.2f} s to Horovod-ready engines go (median run; phases "
                  "overlap, each at the moment its last rank finished it):", "", "| phase | done at (s) |", "|---|---|"]
        lines += [f"| {phase} | {at:.2f} |" for phase, at in found["breakdown"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
