"""scripts/gpu-check.sh --cpu-only: the GPU check's whole path (engines with the local launcher, %%torchrun DDP,
the throughput comparison, telemetry, the preflight's NCCL checks, %hpc stacks) on this machine, over Gloo, so that
the script a GPU machine runs never rots."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers.gpus import real_gpus
from jupyter_hpcai.bench.gpu_check import SECTIONS

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_check_runs_cpu_only_and_writes_every_section(torch_env, tmp_path: Path) -> None:  # type: ignore

    results = tmp_path / "results"
    done = subprocess.run([str(REPO / "scripts" / "gpu-check.sh"), "--cpu-only", "--python",
                           str(torch_env.current_link / "bin" / "python"), "--results", str(results)],
                          capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report = (results / "gpu-check.md").read_text()
    assert [line[3:] for line in report.splitlines() if line.startswith("## ")] == list(SECTIONS), report
    assert "| no GPU | none | none | " in report  # the stamp: no GPU, driver or CUDA runtime in a CPU torch
    assert "[('gloo', 'cpu', 3.0, 2), ('gloo', 'cpu', 3.0, 2)]" in report  # both ranks' all_reduce
    ratio = next(line for line in report.splitlines() if line.startswith("| FP32 | "))
    assert float(ratio.split("|")[4]) > 0.3, ratio  # a figure, not a blank: 2 cores for 2 ranks are noisy
    assert "NCCL home not found" in report  # the preflight's NCCL checks ran (a CPU torch has no NCCL)
    assert ("no GPU visible" in report) is not bool(real_gpus()), report  # its GPU check: what this machine has
    telemetry = [line for line in report.split("## Telemetry")[1].splitlines() if line.startswith("| ") and "-" in line]
    assert len(telemetry) >= 4 and all("| - | - | - | - | no GPU" in line for line in telemetry[1:]), telemetry
    stacks = report.split("## %hpc stacks")[1]
    assert "rank 1 (1 of 2): in all_reduce" in stacks and "rank 0 (1 of 2)" in stacks, stacks
    assert (results / "gpu-check.log").read_text().count("done") == len(SECTIONS)
