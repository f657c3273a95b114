#!/usr/bin/env bash
# Build the documentation site as HTML, offline, with every warning an error: an unresolved reference or link
# (nitpicky mode, MyST's checked heading anchors), a setting without help, a broken include all fail the build.
# Usage: bash scripts/docs.sh [OUT_DIR [SOURCE_DIR]]   (default: build/docs from docs/; open OUT_DIR/index.html)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="$(realpath -m "${1:-$repo/build/docs}")"
src="$(realpath "${2:-$repo/docs}")"
cd "$repo"
# the builders (the test command installs them first; with them in place this needs no network)
.venv/bin/uv pip install -q --offline --python .venv/bin/python -r docs/requirements.txt 2>/dev/null \
    || .venv/bin/uv pip install -q --python .venv/bin/python -r docs/requirements.txt
# a fresh build each time (-E), so every page's warnings show; the doctrees stay beside the HTML, out of docs/
export DOCS_REPO="$repo" PYTHONDONTWRITEBYTECODE=1
exec .venv/bin/python -m sphinx -b html -E -n -W --keep-going -q -d "$out/.doctrees" "$src" "$out"
