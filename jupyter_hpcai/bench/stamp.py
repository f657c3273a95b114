"""Where a figure comes from: the date, the commit and the machine it was measured on, written with every result."""

from __future__ import annotations

import os
import platform
import shutil
import time
from pathlib import Path

from ..proc import run


def commit() -> str:
    """The checkout's commit (with ``+changes`` when its tracked files differ), or the package version outside one."""
    import jupyter_hpcai

    checkout = Path(jupyter_hpcai.__file__).resolve().parents[1]
    head = run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], check=False, timeout=30) \
        if shutil.which("git") and (checkout / ".git").exists() else None
    if head is None or head.returncode != 0:
        return f"jupyter-hpcai {jupyter_hpcai.__version__}"
    dirty = run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"], check=False, timeout=30)
    return f"commit {head.stdout.strip()}" + ("+changes" if dirty.stdout.strip() else "")


def gpus() -> str:
    """The real GPUs here, as nvidia-smi lists them ("no GPU" without one: the dev cluster's fake GPUs do not count)."""
    if not shutil.which("nvidia-smi"):
        return "no GPU"
    listed = run(["nvidia-smi", "-L"], check=False, timeout=30).stdout.splitlines()
    names = sorted({line.split(":", 1)[1].split("(")[0].strip() for line in listed if ":" in line})
    return f"{len(listed)} GPU ({', '.join(names)})" if listed else "no GPU"


def stamp() -> str:
    """e.g. ``2026-12-01 06:40 UTC, commit 1f2ce03, vm (2 cores, no GPU)``."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return f"{when}, {commit()}, {platform.node()} ({os.cpu_count()} cores, {gpus()})"
