#!/usr/bin/env bash
# Install what the tests need, then run the whole suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the documentation's builders: the docs build in the test run (test_docs) then needs no network
.venv/bin/uv pip install -q --python .venv/bin/python -r docs/requirements.txt
exec .venv/bin/python -m pytest --durations=15 "$@"  # the slowest 15 tests, printed at the end
