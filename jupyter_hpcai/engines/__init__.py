"""Engines: ipyparallel engines on the allocation's ranks, frameworks initialised on them, cells run on them.

Where each module runs:
- in the kernel: ``cluster`` (``Engines``: the engine set, cells run on it, what it is doing), ``launch`` (layouts
  and launchers), ``own_job`` (an allocation of the kernel's own), ``output`` and ``report`` (what a cell and a
  dead launcher show), ``listing`` (the job's engine sets; the server extension reads them too);
- beside the kernel, as its own process: ``controller`` (ipyparallel's controller, tied to the kernel outside a job);
- on each rank: ``boot`` (what a rank runs), ``engine`` (a rank's identity and GPU), ``rankside`` (what the kernel
  calls there), ``continuity`` (walltime hooks, checkpoints), ``batch`` (an exported job's ranks);
- on both sides: ``frameworks`` (a rank's init; the kernel's parameters), ``telemetry`` (sampled on a rank, read by
  the kernel and the server), ``stacks`` (collected by the kernel, read by a helper on each node).
"""

from .cluster import Engines, Rank, current
from .launch import LAUNCHERS, Layout, plan
from .output import OUTPUT_MODES, RankFailure

__all__ = ["LAUNCHERS", "OUTPUT_MODES", "Engines", "Layout", "Rank", "RankFailure", "current", "plan"]
