"""Submit a benchmark as one Slurm job in the env's activated environment, and follow its output."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path

from .. import slurm
from ..envs import activated
from ..envs.store import Env
from .resnet50 import report


def submit_resnet50(env: Env, results: Path, train_args: list[str], *, partition: str | None, nodes: int,
                    gpus_per_node: int, tasks_per_node: int, ranks: str | None, time_limit: str,
                    on_line: Callable[[str], None], framework: str = "horovod") -> int:
    build, environ = activated(env)
    results.mkdir(parents=True, exist_ok=True)
    log = results / "job-%j.out"
    args = [f"--nodes={nodes}", f"--ntasks-per-node={tasks_per_node}", f"--time={time_limit}", f"--output={log}",
            "--job-name=hpcai-bench"]
    args += [f"--gpus-per-node={gpus_per_node}"] * bool(gpus_per_node) + [f"--partition={partition}"] * bool(partition)
    cmd = [str(build.python), "-m", "jupyter_hpcai.bench.resnet50", str(results), "--framework", framework]
    cmd += ["--ranks", ranks] if ranks else []
    job = slurm.sbatch([*args, "--wrap", f"exec {shlex.join([*cmd, '--', *train_args])}"], env=environ)
    on_line(f"benchmark job {job}; output: {str(log).replace('%j', str(job))}")
    code = slurm.follow_output(job, Path(str(log).replace("%j", str(job))), on_line)
    if code == 0:
        raw = json.loads((results / "rows.json").read_text())
        paths = report(raw["rows"], results, raw["machine"], raw["settings"])
        on_line((results / "results.md").read_text())
        on_line(f"results: {', '.join(str(p) for p in paths.values())}")
    return code


def submit_overhead(env: Env, results: Path, *, partition: str | None, nodes: int, gpus_per_node: int,
                    time_limit: str, on_line: Callable[[str], None]) -> int:
    """Run bench/overhead.py in one job; write overhead.json and overhead.md in ``results``."""
    from .overhead import report as overhead_report

    build, environ = activated(env)
    results.mkdir(parents=True, exist_ok=True)
    log = results / "overhead-job-%j.out"
    args = [f"--nodes={nodes}", f"--ntasks-per-node={max(gpus_per_node, 1)}", f"--time={time_limit}",
            f"--output={log}", "--job-name=hpcai-overhead"]
    args += [f"--gpus-per-node={gpus_per_node}"] * bool(gpus_per_node) + [f"--partition={partition}"] * bool(partition)
    cmd = [str(build.python), "-m", "jupyter_hpcai.bench.overhead", str(results), env.name, str(env.root)]
    job = slurm.sbatch([*args, "--wrap", f"exec {shlex.join(cmd)}"], env=environ)
    output = Path(str(log).replace("%j", str(job)))
    on_line(f"overhead job {job}; output: {output}")
    code = slurm.follow_output(job, output, on_line)
    if code == 0:
        table = overhead_report(json.loads((results / "overhead.json").read_text()))
        (results / "overhead.md").write_text(table)
        on_line(table)
    return code
