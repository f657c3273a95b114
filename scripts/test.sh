#!/usr/bin/env bash
# Install what the tests need, then run the whole suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the documentation's builders: the docs build in the test run (test_docs) then needs no network
.venv/bin/uv pip install -q --python .venv/bin/python -r docs/requirements.txt
# Two processes: the tests that use the dev cluster run one after another in one (they share its nodes), the
# others beside them (conftest.py groups them); the slowest 15 tests are printed at the end.
exec .venv/bin/python -m pytest -n 2 --dist loadgroup --durations=15 "$@"
