"""The MPI on this node, and whether another MPI (an image's) can run ranks beside it."""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping

from .proc import run


def host_version(env: Mapping[str, str] | None = None) -> str | None:
    """The first line of ``mpirun --version`` on this node, with ``env``'s PATH (None without a working mpirun)."""
    exe = shutil.which("mpirun", path=env.get("PATH") if env is not None else None)
    if exe is None:
        return None
    done = run([exe, "--version"], env=env, check=False, timeout=60)
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def mismatch(inside: str | None, host: str | None) -> str | None:
    """Why an image's MPI differs from the host's (vendor or major.minor), or None when they match or one is unknown."""
    if not inside or not host:
        return None
    v_in, v_host = re.findall(r"\d+\.\d+", inside), re.findall(r"\d+\.\d+", host)
    if v_in[:1] == v_host[:1] and ("Open MPI" in inside) == ("Open MPI" in host):
        return None
    return f"the image has '{inside}' but the host has '{host}'"
