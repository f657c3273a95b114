"""`hpcai bench overhead`: what each layer costs, against its baseline, measured in one job.

- kernel start-to-ready through the hpcai-env provisioner / a plain ipykernel kernelspec of the same env;
- empty-cell dispatch on the engines, ``run_on_ranks`` (what %%horovod_run does) / ``%%px --block``;
- time to Horovod-ready engines (start + hvd.init on every rank) / a raw ``srun ... hvd.init()``.
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

from ..allocation import Allocation
from ..engines import Engines, plan, run_on_ranks
from ..proc import run


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


def engines_overhead(allocation: Allocation, n: int | None = None, times: int = 20) -> dict[str, float]:
    layout = plan(allocation, n=n)
    raw = _median(lambda: run(["srun", "--mpi=pmix", "--overlap", f"-n{layout.n}", f"--nodes={layout.nodes}",
                               f"--ntasks-per-node={layout.per_node}", sys.executable, "-c",
                               "import horovod.tensorflow as hvd; hvd.init()"], timeout=600), 1)
    engines = Engines(allocation)
    start = time.perf_counter()
    engines.start(n=layout.n)
    try:
        run_on_ranks(engines, "pass", write=lambda text: None)  # horovod initialised on every rank
        ready = time.perf_counter() - start
        ours = _median(lambda: run_on_ranks(engines, "pass", write=lambda text: None), times)
        view = engines.view()
        px = _median(lambda: view.execute("pass", block=True), times)
    finally:
        engines.stop()
    return {"ranks": layout.n, "engines_ready_s": ready, "raw_srun_hvd_init_s": raw, "dispatch_s": ours, "px_s": px}


def main(argv: list[str] | None = None) -> None:
    """Inside a job: ``python -m jupyter_hpcai.bench.overhead RESULTS ENV_NAME ENV_ROOT``."""
    results, env_name, env_root = (argv or sys.argv[1:])[:3]
    allocation = Allocation.current()
    if allocation is None:
        raise SystemExit("run this inside a Slurm job (hpcai bench overhead submits one)")
    provisioned, plain = kernel_start(env_name, env_root)
    found = {"kernel_provisioned_s": provisioned, "kernel_plain_s": plain, **engines_overhead(allocation)}
    Path(results).mkdir(parents=True, exist_ok=True)
    (Path(results) / "overhead.json").write_text(json.dumps(found, indent=2))


def report(found: dict[str, Any]) -> str:
    """The ratios as a markdown table."""
    rows = [("kernel start-to-ready: provisioner / plain ipykernel", found["kernel_provisioned_s"], found["kernel_plain_s"]),
            (f"empty-cell dispatch on {found['ranks']} engines: %%horovod_run / %%px --block", found["dispatch_s"],
             found["px_s"]),
            (f"{found['ranks']} Horovod-ready engines: start + init / raw srun hvd.init()", found["engines_ready_s"],
             found["raw_srun_hvd_init_s"])]
    lines = ["| layer | ours (s) | baseline (s) | ratio |", "|---|---|---|---|"]
    lines += [f"| {name} | {ours:.3f} | {base:.3f} | {ours / base:.2f} |" for name, ours, base in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
