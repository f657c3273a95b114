#!/usr/bin/env bash
# Install what the tests need, then run the whole suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest --durations=15 "$@"  # the slowest 15 tests, printed at the end
