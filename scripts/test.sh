#!/usr/bin/env bash
# Install what the tests need, then run the whole suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the documentation's builders: the docs build in the test run (test_docs) then needs no network
.venv/bin/uv pip install -q --python .venv/bin/python -r docs/requirements.txt
# Two processes, each with a dev cluster of its own (jupyter_hpcai/devcluster/pytest_plugin.py), take whole files as
# they free up, the longest first (conftest.py orders them); the slowest 15 tests are printed at the end.
exec .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=15 "$@"
