"""Submit a benchmark as one Slurm job in the env's activated environment, and follow its output."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path

from ..envs import Env
from ..scheduler.jobscript import JobScript, ranks_per_node
from .resnet50 import report


def _run_job(env: Env, results: Path, module: str, args: list[str], *, name: str, partition: str | None, nodes: int,
             gpus_per_node: int, tasks_per_node: int, time_limit: str, on_line: Callable[[str], None]) -> int:
    """``python -m module args`` of the env's build as one job; stream its output; return its exit code."""
    environ = env.environ()
    results.mkdir(parents=True, exist_ok=True)
    log = results / f"{name}-job-%j.out"
    job = JobScript(name=f"hpcai-{name}", nodes=nodes, tasks_per_node=tasks_per_node, gpus_per_node=gpus_per_node,
                    time=time_limit, partition=partition, output=str(log),
                    body=f"exec {shlex.join(env.argv(['python', '-m', module, *args]))}\n").submit(env=environ)
    on_line(f"{name} job {job.job_id}; output: {job.output}")
    return job.follow(on_line)


def submit_resnet50(env: Env, results: Path, train_args: list[str], *, partition: str | None, nodes: int,
                    gpus_per_node: int, tasks_per_node: int, ranks: str | None, time_limit: str,
                    on_line: Callable[[str], None], framework: str = "horovod") -> int:
    """Run bench/resnet50.py in one job; write results.json, results.md and scaling.png in ``results``."""
    args = [str(results), "--framework", framework, *(["--ranks", ranks] if ranks else []), "--", *train_args]
    code = _run_job(env, results, "jupyter_hpcai.bench.resnet50", args, name="bench", partition=partition, nodes=nodes,
                    gpus_per_node=gpus_per_node, tasks_per_node=tasks_per_node, time_limit=time_limit, on_line=on_line)
    if code == 0:
        raw = json.loads((results / "rows.json").read_text())
        paths = report(raw["rows"], results, raw["machine"], raw["settings"])
        on_line((results / "results.md").read_text())
        on_line(f"results: {', '.join(str(p) for p in paths.values())}")
    return code


def submit_overhead(env: Env, results: Path, *, partition: str | None, nodes: int, gpus_per_node: int,
                    time_limit: str, on_line: Callable[[str], None], times: int = 3, breakdown: bool = False) -> int:
    """Run bench/overhead.py in one job; write overhead.json and overhead.md in ``results``."""
    from .overhead import report as overhead_report

    code = _run_job(env, results, "jupyter_hpcai.bench.overhead",
                    [str(results), env.name, str(env.env_dir.root.path), str(times)],
                    name="overhead", partition=partition, nodes=nodes, gpus_per_node=gpus_per_node,
                    tasks_per_node=ranks_per_node(gpus_per_node), time_limit=time_limit, on_line=on_line)
    if code == 0:
        table = overhead_report(json.loads((results / "overhead.json").read_text()), breakdown=breakdown)
        (results / "overhead.md").write_text(table)
        on_line(table)
    return code
