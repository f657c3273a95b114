"""The GPU path in one run on one machine without Slurm (scripts/gpu-check.sh runs it): writes ``RESULTS/gpu-check.md``.

Sections, in order: the stamp (date, commit, GPU, driver, CUDA, torch, NCCL); the env preflight's CUDA/NCCL
checks; engines started with the ``local`` launcher, one per GPU, and a ``%%torchrun`` DDP all_reduce (NCCL on
GPUs); ResNet-50 on synthetic data, AMP and FP32, batch 256 per GPU, through ``%%torchrun`` against the same
script run bare with ``torchrun --standalone``, alternating, medians of 3; the ranks' telemetry read during
training against ``nvidia-smi`` at the same moments; ``%hpc stacks`` on a rank blocked in a collective.
``--cpu-only``: two ranks over Gloo and a small convnet instead, so the same path runs on any machine.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import HPCAIError
from .stamp import commit

SECTIONS = ("Stamp", "Preflight: CUDA and NCCL", "DDP through %%torchrun",
            "Throughput: %%torchrun against bare torchrun", "Telemetry against nvidia-smi",
            "%hpc stacks on a rank blocked in a collective")
PUBLISHED = ("Published single-GPU references (NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5): A100-80GB "
             "938 img/s TF32 and 2,470 AMP; V100 367 FP32 and 1,200 AMP.")


class Shell:
    """An IPython shell in this process with our magics loaded: cells run as a notebook runs them."""

    def __init__(self) -> None:
        from IPython.core.interactiveshell import InteractiveShell

        from .. import magics

        self.ip = InteractiveShell.instance()
        magics.load(self.ip)

    def line(self, line: str) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.ip.run_line_magic("hpc", line)
        return out.getvalue()

    def cell(self, line: str, cell: str) -> tuple[str, Any]:
        """The cell's output and its ``-o`` variable (``line`` names it first)."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.ip.run_cell_magic("torchrun", line, cell)
        return out.getvalue(), self.ip.user_ns.get(line.split()[1]) if line.startswith("-o ") else None


def _smi(fields: str) -> list[list[str]]:
    """``nvidia-smi --query-gpu=FIELDS`` rows ([] without nvidia-smi)."""
    if not shutil.which("nvidia-smi"):
        return []
    done = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=60, check=False)
    return [[v.strip() for v in row.split(",")] for row in done.stdout.splitlines()] if done.returncode == 0 else []


def stamp_table(gpus: int) -> list[str]:
    import torch

    names = _smi("name,driver_version") if gpus else []  # --cpu-only: the GPUs here take no part
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if gpus else "none"  # type: ignore[no-untyped-call]
    row = (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), commit(),
           f"{gpus} x {names[0][0]}" if names else "no GPU", names[0][1] if names else "none",
           torch.version.cuda or "none", torch.__version__, nccl)
    return ["| date | commit | GPU | driver | CUDA | torch | NCCL |", "|---|---|---|---|---|---|---|",
            "| " + " | ".join(row) + " |"]


def preflight_lines() -> list[str]:
    """The env preflight's NCCL checks against this machine, with NCCL from torch's own nvidia wheels."""
    from ..envs.preflight import preflight
    from ..envs.recipe import parse_recipe

    headers = [h for entry in sys.path if (Path(entry) / "nvidia").is_dir()
               for h in (Path(entry) / "nvidia").glob("**/include/nccl.h")]
    home = str(headers[0].parent.parent) if headers else "/no-nccl-found"
    recipe = parse_recipe(f"name: nccl-check\npython: {sys.executable}\npip: [torch]\n"
                          f"build_env: {{HOROVOD_GPU_OPERATIONS: NCCL, HOROVOD_NCCL_HOME: {home}}}\n")
    checked = preflight(recipe)
    lines = [f"- NCCL home (from torch's wheels): `{home}`", f"- CUDA (nvcc): {checked.facts['cuda'] or 'none'}",
             f"- GPUs seen: {', '.join(checked.facts['gpus']) or 'none'}"]
    lines += [f"- problem: {what} (fix: {fix})" for what, fix in checked.problems]
    lines += [f"- warning: {w}" for w in checked.warnings]
    return lines + [f"- verdict: {'passes' if not checked.problems else f'{len(checked.problems)} problem(s)'}"]


DDP = """t = torch.ones(1, device=device) * (rank + 1)
dist.all_reduce(t)
(dist.get_backend(), str(device), t.item(), world_size)
"""


def timed_bench(shell: Shell, module: str, args: list[str], ranks: int, times: int) -> dict[str, list[float]]:
    """images/s of ``module`` through %%torchrun and bare ``torchrun --standalone``, alternating, ``times`` each."""
    samples: dict[str, list[float]] = {"torchrun_magic": [], "bare_torchrun": []}
    for i in range(times):
        for kind in (("torchrun_magic", "bare_torchrun") if i % 2 == 0 else ("bare_torchrun", "torchrun_magic")):
            if kind == "torchrun_magic":
                _, results = shell.cell("-o bench_result", f"from {module} import main\nmain({args!r})")
                samples[kind].append(_rate(results[0]))
            else:
                samples[kind].append(_rate(bare_torchrun(module, args, ranks)))
    return samples


def bare_torchrun(module: str, args: list[str], ranks: int) -> str:
    """``module`` run bare with ``torchrun --standalone``: its output, or an error with its last lines."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={ranks}", "-m", module, *args],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise HPCAIError(f"torchrun --standalone -m {module} exited with {done.returncode}",
                         (done.stdout + done.stderr)[-3000:])
    return done.stdout


def _rate(result: Any) -> float:
    """images/s in total from a script's return value or from its printed line."""
    if isinstance(result, dict):
        return float(result["images_per_sec"])
    if isinstance(result, float):
        return result
    for line in str(result).splitlines():
        if line.startswith("HPCAI_BENCH "):
            return float(json.loads(line.split(" ", 1)[1])["images_per_sec"])
        if line.startswith("images/sec total "):
            return float(line.split()[2])
    raise ValueError(f"no images/s in {str(result)[-500:]!r}")


def telemetry_during(shell: Shell, train: Callable[[], object], every: float = 2.0) -> list[str]:
    """Our samples of every rank's GPU against nvidia-smi's at the same moments, while ``train`` runs."""
    from ..engines import current

    rows = ["| s | rank | our GPU % | nvidia-smi % | our mem MiB | nvidia-smi MiB | note |",
            "|---|---|---|---|---|---|---|"]
    worker = threading.Thread(target=train)
    start = time.monotonic()
    worker.start()
    while worker.is_alive():
        worker.join(every)
        smi = {row[0]: row for row in _smi("index,utilization.gpu,memory.used")}
        for s in current().samples():
            theirs = smi.get(str(s.rank))  # rank r is pinned to GPU r here (main)
            mib = "-" if s.gpu_mem is None else f"{s.gpu_mem / 2**20:.0f}"
            rows.append(f"| {time.monotonic() - start:.0f} | {s.rank} | {_blank(s.gpu_util)} | "
                        f"{theirs[1] if theirs else '-'} | {mib} | {theirs[2] if theirs else '-'} | {s.gpu_note} |")
    return rows


def _blank(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


BLOCKED = "import time\nif rank == 0:\n    time.sleep(25)\ndist.all_reduce(torch.ones(1, device=device))\n"


def stacks_while_blocked(shell: Shell) -> str:
    """``%hpc stacks`` while rank 0 sleeps and the others wait for it inside all_reduce."""
    worker = threading.Thread(target=lambda: shell.cell("--timeout 60", BLOCKED))
    worker.start()
    time.sleep(8)
    shown = shell.line("stacks")
    worker.join(60)
    return shown


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(prog="gpu_check")
    parser.add_argument("results", type=Path)
    parser.add_argument("--cpu-only", action="store_true", help="two ranks over Gloo and a small convnet")
    parser.add_argument("--times", type=int, default=3)
    args = parser.parse_args(argv)
    import torch

    gpus = 0 if args.cpu_only else torch.cuda.device_count()
    if not args.cpu_only and not gpus:
        raise SystemExit("no GPU visible to torch here: run with --cpu-only, or on a GPU machine")
    ranks = gpus or 2
    # CPU only: the ranks and the bare runs see no GPU; else every GPU, which pin gives one per rank in order
    if args.cpu_only:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(gpus))))
    os.environ["OMP_NUM_THREADS"] = "1" if args.cpu_only else os.environ.get("OMP_NUM_THREADS", "4")
    args.results.mkdir(parents=True, exist_ok=True)
    report = [f"# GPU check ({'CPU only: Gloo, small convnet' if args.cpu_only else 'GPU: NCCL, ResNet-50'})", ""]

    def section(title: str, lines: list[str]) -> None:
        report.extend([f"## {title}", "", *lines, ""])
        (args.results / "gpu-check.md").write_text("\n".join(report))
        print(f"gpu-check: {title} done", flush=True)

    section(SECTIONS[0], stamp_table(gpus))
    section(SECTIONS[1], preflight_lines())
    shell = Shell()
    started = time.perf_counter()
    said = shell.line(f"start -n {ranks} --launcher local --framework torch")
    _, seen = shell.cell("-o seen", DDP)
    ready = next((line for line in said.splitlines() if "ready" in line), said.strip())
    section(SECTIONS[2], [f"- `%hpc start -n {ranks} --launcher local`: {ready.strip()} "
                          f"({time.perf_counter() - started:.1f} s)", f"- each rank's (backend, device, sum, world): "
                          f"`{seen}` (expected sum {ranks * (ranks + 1) / 2:g})"])
    if args.cpu_only:
        module = "jupyter_hpcai.bench.train_torch"
        runs = [("FP32", ["--batch", "16", "--warmup", "20", "--steps", "60"])]
    else:
        module, base = "jupyter_hpcai.bench.resnet50_torch", ["--batch", "256", "--warmup", "10", "--steps", "20"]
        runs = [("AMP", [*base, "--mixed-precision"]), ("FP32", base)]
    rows = ["| precision | %%torchrun img/s | bare torchrun img/s | ratio (target >= 0.99) | samples (ours / bare) |",
            "|---|---|---|---|---|"]
    for precision, bench_args in runs:
        got = timed_bench(shell, module, bench_args, ranks, args.times)
        ours, bare = statistics.median(got["torchrun_magic"]), statistics.median(got["bare_torchrun"])
        rows.append(f"| {precision} | {ours:.1f} | {bare:.1f} | {ours / bare:.3f} | "
                    f"{', '.join(f'{v:.0f}' for v in got['torchrun_magic'])} / "
                    f"{', '.join(f'{v:.0f}' for v in got['bare_torchrun'])} |")
    section(SECTIONS[3], [f"Model `{module}`, {ranks} ranks, args `{' '.join(runs[-1][1])}`; medians of "
                          f"{args.times}, alternating.", "", *rows, "", PUBLISHED])
    shell.line("telemetry 1")
    longer = [*runs[-1][1][:-1], "1200" if args.cpu_only else "100"]  # several samples' worth of training
    section(SECTIONS[4], telemetry_during(shell, lambda: shell.cell(
        "-o bench_result", f"from {module} import main\nmain({longer!r})")))
    if gpus == 1:
        shell.line("stop")
        os.environ["HPCAI_TORCH_BACKEND"] = "gloo"  # NCCL needs a GPU per rank: the blocked collective is Gloo's
        shell.line("start -n 2 --launcher local --framework torch")
    section(SECTIONS[5], ["```", stacks_while_blocked(shell).rstrip(), "```"])
    shell.line("stop")
    return args.results / "gpu-check.md"


if __name__ == "__main__":
    print(main())
