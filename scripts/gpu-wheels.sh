#!/usr/bin/env bash
# Where PyPI is reachable: the wheels scripts/gpu-check.sh needs on a GPU machine without a package index, into
# build/gpu-wheels (gitignored): our own wheel, and cp312 manylinux wheels of what the GPU path imports that the
# machine lacks (it has torch, numpy, nvidia-ml-py, mpi4py and pytest). At most 64 MiB travel: the script says
# the total and fails above it.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/gpu-wheels
rm -rf "$out" && mkdir -p "$out"
# the GPU path: engines (ipyparallel, ipykernel), the magics (IPython), telemetry (psutil), stacks (py-spy),
# recipes and the CLI's imports (pydantic, pyyaml, rich, click); not the env builder's py-rattler and uv
cat > "$out/requirements.txt" <<'LIST'
click>=8.1
rich>=13
pyyaml>=6
pydantic>=2.5
jupyter_client>=8.6
ipython>=8
ipyparallel>=9.2
py-spy>=0.4
psutil>=5.9
ipywidgets>=8.1
LIST
.venv/bin/python -m pip download --quiet --only-binary=:all: --dest "$out" --python-version 3.12 --implementation cp \
    --abi cp312 --abi abi3 --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -r "$out/requirements.txt"
.venv/bin/uv build --wheel --out-dir "$out" --quiet .
size=$(du -sm "$out" | cut -f1)
echo "gpu-wheels: $(ls "$out"/*.whl | wc -l) wheels, ${size} MiB in $out"
if ((size > 64)); then
    echo "gpu-wheels: over the 64 MiB that may travel" >&2
    exit 1
fi
