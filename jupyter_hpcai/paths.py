"""Every path the project uses by default, each overridable by an environment variable; private files and folders.

Nothing here points into the source checkout: run-time state lives outside it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO


def devcluster_dir() -> Path:
    """State of the local dev cluster (configs, spool, logs). ``HPCAI_DEVCLUSTER_DIR``."""
    return Path(os.environ.get("HPCAI_DEVCLUSTER_DIR", "/var/lib/hpcai/devcluster"))


def hub_dir() -> Path:
    """The demo hub's state (database, secrets, pid files, log). ``HPCAI_HUB_DIR``."""
    return Path(os.environ.get("HPCAI_HUB_DIR", "/var/lib/hpcai/hub"))


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


def private_dir(path: Path) -> Path:
    """A folder only its owner can enter: created 0700 (never readable by others, not even for an instant)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def open_private(path: Path, mode: str = "w") -> IO[str]:
    """Open a file for writing (``w``) or appending (``a``) that is 0600 from its first byte; never through a link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)  # a file that existed keeps its mode under O_CREAT
    return os.fdopen(fd, mode)


def write_private(path: Path, text: str) -> None:
    """Write a secret (a password, a token) into a file only its owner can read."""
    with open_private(path) as out:
        out.write(text)
