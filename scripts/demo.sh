#!/usr/bin/env bash
# The main job: install, then bring up the dev cluster and show it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/hpcai demo "$@"
echo "[demo.sh, from its start: $SECONDS s]"
