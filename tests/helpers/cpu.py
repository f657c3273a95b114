"""CPU time as /proc counts it, for benchmarks and the run's summary that say where the CPU went: the whole machine's
busy seconds, and the seconds of the processes in named groups (by command line)."""

from __future__ import annotations

import os
import re
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1

# the processes of a notebook's start on the dev cluster, by command line; the first pattern that matches wins
GROUPS = (("ranks", r"jupyter_hpcai\.ranks\.boot|ipyparallel\.engine"),
          ("controller", r"ipyparallel\.controller"),
          ("kernel", r"ipykernel"),
          ("server", r"singleuser|jupyter-lab|jupyter_hpcai\.server"),
          ("browser", r"chrom"),
          ("hub and proxy", r"jupyterhub|configurable-http-proxy"),
          ("Slurm and munge", r"slurm|srun|munge"))


def machine() -> tuple[float, float]:
    """The machine's busy and total CPU seconds since boot, all cores together (/proc/stat's first line)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields) - idle) / TICK, sum(fields) / TICK


def processes() -> dict[int, tuple[str, float]]:
    """Every live process's group (``GROUPS``, else "other") and CPU seconds: its own, and those of the children
    it has reaped."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile
            continue
        times = stat.rsplit(")", 1)[1].split()[11:15]  # utime, stime, cutime, cstime
        group = next((name for name, pattern in GROUPS if re.search(pattern, command)), "other")
        found[int(entry.name)] = (group, sum(int(t) for t in times) / TICK)
    return found


def spent(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds each group spent between two ``processes()`` snapshots (processes that ended in between, and
    were not reaped by one still running, are not counted)."""
    groups: dict[str, float] = {}
    for pid, (group, seconds) in after.items():
        earlier = before.get(pid)
        used = seconds - (earlier[1] if earlier and earlier[0] == group else 0.0)
        groups[group] = groups.get(group, 0.0) + max(used, 0.0)
    return groups
