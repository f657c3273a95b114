#!/usr/bin/env bash
# Install what the tests need, then run the whole suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the documentation's builders: the docs build in the test run (test_docs) then needs no network
.venv/bin/uv pip install -q --python .venv/bin/python -r docs/requirements.txt
# Slurm 24.11 (Debian 13's source, built once into a cached prefix): the whole suite runs on it, accounting on
SLURM_2411=/var/cache/hpcai/slurm-24.11
bash scripts/build-slurm.sh "$SLURM_2411"
# A demo's hub and dev cluster (the system's Slurm, in the first worker's state folder), or a killed run's, would stand
# in the way of the suite's: stopped first
.venv/bin/hpcai demo --stop >/dev/null
# Two processes, each with a dev cluster of its own (jupyter_hpcai/devcluster/pytest_plugin.py), take whole files as
# they free up, the longest first (conftest.py orders them); the slowest 15 tests are printed at the end.
status=0
env HPCAI_SLURM="$SLURM_2411" .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder \
  --durations=15 "$@" || status=$?
# Then, for the whole suite (no arguments), the oldest Slurm supported, Debian 12's 22.05: the tests marked
# oldest_slurm (pyproject.toml says which), on the same clusters' state folders (`up` clears what 24.11 left, its
# nodes' cgroups included); its artifacts go to test-artifacts/oldest-slurm/, the whole suite's stay in test-artifacts/
if [ $# -eq 0 ]; then
  rm -rf test-artifacts.whole && mv test-artifacts test-artifacts.whole 2>/dev/null || mkdir test-artifacts.whole
  HPCAI_SLURM= .venv/bin/python -m pytest -n 2 --dist loadfile -m oldest_slurm --durations=15 || status=$?
  rm -rf test-artifacts.whole/oldest-slurm
  mv test-artifacts test-artifacts.whole/oldest-slurm 2>/dev/null || true
  mv test-artifacts.whole test-artifacts
fi
exit "$status"
