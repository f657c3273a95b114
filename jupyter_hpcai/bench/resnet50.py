"""`hpcai bench resnet50`: ResNet-50 at 1, 2, 4, ... ranks, through plain srun and through the engines, in one job.

``hpcai bench resnet50`` submits a job (bench/submit.py) that runs ``main`` here in the env: it measures
and writes rows.json; then ``report`` (on the submitting side) writes results.json, results.md (a table)
and scaling.png (images/sec against ranks, with ideal scaling from 1 rank) in the results folder.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from ..engines import Engines, Layout, plan
from ..errors import HPCAIError
from ..proc import run
from ..ranks.frameworks import horovod_controller
from ..scheduler import chosen
from ..scheduler.allocation import Allocation
from . import horovodrun
from .stamp import stamp

scheduler = chosen()


def rank_counts(allocation: Allocation, wanted: list[int] | None) -> list[int]:
    """1, 2, 4, ... up to the allocation's GPUs (or tasks), unless given."""
    most = allocation.total_gpus or allocation.tasks
    if wanted:
        too_many = [n for n in wanted if n > most]
        if too_many:
            raise HPCAIError(f"ranks {too_many} exceed the {most} the job has", "ask for a bigger job or fewer ranks")
        return wanted
    counts, n = [], 1
    while n <= most:
        counts.append(n)
        n *= 2
    return counts


def _parse(output: str) -> dict[str, Any]:
    match = re.search(r"HPCAI_BENCH (\{.*\})", output)
    if not match:
        raise HPCAIError(f"the benchmark printed no result:\n{output[-2000:]}", "see the output above")
    return json.loads(match.group(1))


# framework -> (training module, the magic's framework and its mode label)
FRAMEWORKS = {
    "horovod": ("jupyter_hpcai.bench.resnet50_train", "horovod", "horovod_run"),
    "torch": ("jupyter_hpcai.bench.resnet50_torch", "torch", "torchrun"),
}


def _plain(framework: str, module: str, layout: Layout,
           args: list[str]) -> AbstractContextManager[tuple[list[str], dict[str, str]]]:
    """The plain srun command and environment for ``module``: Horovod started as horovodrun would start it, over
    the controller the engines use (so that the ratio compares launchers, not transports); torch as it starts."""
    threads = {"TF_NUM_INTRAOP_THREADS": os.environ.get("TF_NUM_INTRAOP_THREADS", "1"),
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if framework == "horovod":
        return horovodrun.prepared(layout.nodes, layout.n, horovod_controller(), module, args, env=threads,
                                   per_node=layout.per_node)
    step = scheduler.step(nodes=layout.nodes, tasks=layout.n, per_node=layout.per_node)
    return nullcontext(([*step, sys.executable, "-m", module, *args], {**os.environ, **threads}))


def measure(allocation: Allocation, counts: list[int], train_args: list[str], framework: str = "horovod",
            out: Any = print) -> list[dict[str, Any]]:
    """For each rank count: plain srun first (no engines alive), then the same script through the engines."""
    module, backend, label = FRAMEWORKS[framework]
    rows = []
    for n in counts:
        layout = plan(allocation, n=n)
        start = time.monotonic()
        with _plain(framework, module, layout, train_args) as (argv, env):
            plain = _parse(run(argv, env=env, timeout=3600).stdout)
        out(f"{n} ranks, srun: {plain['images_per_sec']:.2f} img/s ({time.monotonic() - start:.0f} s)")
        engines = Engines(allocation)
        try:
            engines.start(n=n, framework=backend)
            code = f"from {module} import main\nmain({train_args!r})"
            magic = engines.run(code, framework=backend, output="rank0", write=lambda text: None)[0]
        finally:
            engines.stop()
        out(f"{n} ranks, %%{label}: {magic['images_per_sec']:.2f} img/s")
        rows += [{"mode": "srun", **plain}, {"mode": label, **magic}]
    return rows


def report(rows: list[dict[str, Any]], results: Path, machine: str, settings: dict[str, Any]) -> dict[str, Path]:
    """Write results.json, results.md and scaling.png; return their paths."""
    results.mkdir(parents=True, exist_ok=True)
    modes = sorted({r["mode"] for r in rows})
    base = {m: next((r["images_per_sec"] for r in rows if r["mode"] == m and r["ranks"] == 1), None) for m in modes}
    srun_by_n = {r["ranks"]: r["images_per_sec"] for r in rows if r["mode"] == "srun"}
    for r in rows:
        one = base[r["mode"]]
        r["efficiency"] = r["images_per_sec"] / (one * r["ranks"]) if one else None
        if r["mode"] != "srun":
            r["magic_over_srun"] = r["images_per_sec"] / srun_by_n[r["ranks"]]
    (results / "results.json").write_text(json.dumps({"machine": machine, "settings": settings, "rows": rows}, indent=2))
    lines = [f"ResNet-50 ({settings.get('framework', 'horovod')}), synthetic data, batch {settings['batch']} per rank, "
             f"{settings['steps']} timed steps, {settings.get('image_size', 224)} px; {machine}", "",
             "| launch | ranks | images/sec total | per rank | scaling efficiency | magic / srun |",
             "|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["mode"] != "srun", r["ranks"])):
        eff = f"{r['efficiency']:.2f}" if r["efficiency"] is not None else "-"
        ratio = f"{r['magic_over_srun']:.3f}" if "magic_over_srun" in r else "-"
        lines.append(f"| {r['mode']} | {r['ranks']} | {r['images_per_sec']:.2f} | {r['per_rank']:.2f} | {eff} | {ratio} |")
    (results / "results.md").write_text("\n".join(lines) + "\n")
    _plot(rows, results / "scaling.png", machine)
    return {"json": results / "results.json", "markdown": results / "results.md", "plot": results / "scaling.png"}


def _plot(rows: list[dict[str, Any]], path: Path, machine: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, marker in zip(sorted({r["mode"] for r in rows}), "osd"):
        points = sorted((r["ranks"], r["images_per_sec"]) for r in rows if r["mode"] == mode)
        ax.plot(*zip(*points), marker=marker, label=f"{mode}")
    one = next((r["images_per_sec"] for r in rows if r["mode"] == "srun" and r["ranks"] == 1), None)
    if one:
        ranks = sorted({r["ranks"] for r in rows})
        ax.plot(ranks, [one * n for n in ranks], "k--", label="ideal (from 1 rank)")
    ax.set_xlabel("ranks")
    ax.set_ylabel("images/sec (total)")
    ax.set_title(f"ResNet-50 synthetic\n{machine}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine_description() -> str:
    """When, at which commit and where: the stamp, and the job's layout."""
    alloc = Allocation.current(query_end=False)
    where = f"job {alloc.job_id}: {len(alloc.nodes)} nodes x {alloc.gpus_per_node} GPUs" if alloc else "no job"
    return f"{stamp()}, {where}"


def main(argv: list[str] | None = None) -> None:
    """Inside a job: ``python -m jupyter_hpcai.bench.resnet50 RESULTS [--framework F] [--ranks 1,2] -- TRAIN_ARGS``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    results = Path(argv.pop(0))
    ranks, framework = None, "horovod"
    while argv and argv[0] in ("--ranks", "--framework"):
        if argv[0] == "--ranks":
            ranks = [int(n) for n in argv[1].split(",")]
        else:
            framework = argv[1]
        argv = argv[2:]
    train_args = argv[1:] if argv and argv[0] == "--" else argv
    allocation = Allocation.current()
    if allocation is None:
        raise SystemExit("run this inside a Slurm job (hpcai bench resnet50 submits one)")
    from .resnet50_train import parse

    rows = measure(allocation, rank_counts(allocation, ranks), train_args, framework)
    raw = {"machine": machine_description(), "settings": {**vars(parse(train_args)), "framework": framework},
           "rows": rows}
    (results / "rows.json").write_text(json.dumps(raw, indent=2))


if __name__ == "__main__":
    main()
