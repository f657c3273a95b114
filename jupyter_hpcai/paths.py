"""Every path the project uses by default, each overridable by an environment variable.

Nothing here points into the source checkout: run-time state lives outside it.
"""

from __future__ import annotations

import os
from pathlib import Path


def devcluster_dir() -> Path:
    """State of the local dev cluster (configs, spool, logs). ``HPCAI_DEVCLUSTER_DIR``."""
    return Path(os.environ.get("HPCAI_DEVCLUSTER_DIR", "/var/lib/hpcai/devcluster"))


def env_root() -> Path:
    """Where built environments live, one folder per name. ``HPCAI_ENV_ROOT``."""
    default = Path.home() / ".local" / "share" / "hpcai" / "envs"
    return Path(os.environ.get("HPCAI_ENV_ROOT", default))


def cache_dir() -> Path:
    """Download caches (conda packages). ``HPCAI_CACHE_DIR``; pip keeps its own cache."""
    return Path(os.environ.get("HPCAI_CACHE_DIR", Path.home() / ".cache" / "hpcai"))


def kernel_template() -> Path:
    """The kernel.json template: shipped inside the wheel, or the checkout's kernels/ folder."""
    package = Path(__file__).parent
    shipped = package / "kernels" / "kernel.json"
    return shipped if shipped.exists() else package.parent / "kernels" / "kernel.json"
