"""Every path the project uses by default, each overridable by an environment variable.

Nothing here points into the source checkout: run-time state lives outside it.
"""

from __future__ import annotations

import os
from pathlib import Path


def devcluster_dir() -> Path:
    """State of the local dev cluster (configs, spool, logs). ``HPCAI_DEVCLUSTER_DIR``."""
    return Path(os.environ.get("HPCAI_DEVCLUSTER_DIR", "/var/lib/hpcai/devcluster"))
