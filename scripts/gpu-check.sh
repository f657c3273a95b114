#!/usr/bin/env bash
# The GPU path in one run, on one machine without Slurm (jupyter_hpcai/bench/gpu_check.py says what it checks):
# engines with the local launcher, %%torchrun DDP over NCCL, ResNet-50 through %%torchrun against bare torchrun,
# telemetry against nvidia-smi, the preflight's CUDA/NCCL checks, %hpc stacks on a blocked rank. Everything it
# finds goes into one folder: gpu-check.md (the stamped tables) and gpu-check.log.
#   scripts/gpu-check.sh [--cpu-only] [--python PYTHON] [--results DIR]
# --cpu-only: two ranks over Gloo and a small convnet (the test command runs this). PYTHON (default python3)
# must have torch; on a machine without a package index where it lacks jupyter_hpcai, a venv over its packages
# gets the wheels scripts/gpu-wheels.sh downloaded beforehand (build/gpu-wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
cpu_only="" python=python3 results="build/gpu-check-$(date -u +%Y%m%d-%H%M%S)"
while (($#)); do
    case "$1" in
        --cpu-only) cpu_only=--cpu-only ;;
        --python) python=$2; shift ;;
        --results) results=$2; shift ;;
        *) echo "usage: $0 [--cpu-only] [--python PYTHON] [--results DIR]" >&2; exit 2 ;;
    esac
    shift
done
if ! "$python" -c "import jupyter_hpcai" 2>/dev/null; then
    wheels=build/gpu-wheels
    if [[ ! -f $wheels/requirements.txt ]]; then
        echo "gpu-check: $python lacks jupyter_hpcai and $wheels is missing: run scripts/gpu-wheels.sh first" >&2
        exit 1
    fi
    "$python" -m venv --system-site-packages build/gpu-venv  # its torch, nvidia-ml-py and mpi4py, plus ours
    build/gpu-venv/bin/python -m pip install --quiet --no-index --find-links "$wheels" -r "$wheels/requirements.txt"
    build/gpu-venv/bin/python -m pip install --quiet --no-index --no-deps "$wheels"/jupyter_hpcai-*.whl
    python=build/gpu-venv/bin/python
fi
mkdir -p "$results"
export PATH="$(dirname "$python"):$PATH"  # py-spy beside the python, for %hpc stacks
env -u SLURM_JOB_ID -u SLURM_JOBID timeout 480 "$python" -m jupyter_hpcai.bench.gpu_check "$results" $cpu_only \
    2>&1 | tee "$results/gpu-check.log"
