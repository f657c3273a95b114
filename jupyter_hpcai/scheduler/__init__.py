"""The scheduler behind one seam. What the project asks of a scheduler is ``interface.Scheduler``; an implementation
is one module of this package (``slurm``), registered by one line of ``SCHEDULERS``, and chosen by ``HPCAI_SCHEDULER``
(default: slurm). Beside them, what any scheduler's jobs share: the batch script (jobscript.py), a job seen from
inside it (allocation.py), and the formats of durations and times (durations.py). Outside this package no module runs
a scheduler command or reads a scheduler's variable (test_architecture.py). Standard library only, where a rank
imports it.
"""

from __future__ import annotations

import importlib
import os
from functools import cache
from typing import cast

from ..errors import HPCAIError
from .interface import Scheduler

SCHEDULERS = {"slurm": "jupyter_hpcai.scheduler.slurm"}  # each scheduler's module
SCHEDULER_VAR = "HPCAI_SCHEDULER"  # which one a site runs; the same in the hub, the jobs and the ranks


@cache
def _load(name: str) -> Scheduler:
    if name not in SCHEDULERS:
        raise HPCAIError(f"{SCHEDULER_VAR}={name!r} names no scheduler this version knows",
                         f"set it to one of: {', '.join(sorted(SCHEDULERS))} (or leave it unset: slurm)")
    return cast(Scheduler, importlib.import_module(SCHEDULERS[name]))


def chosen() -> Scheduler:
    """The scheduler this site runs (``HPCAI_SCHEDULER``)."""
    return _load(os.environ.get(SCHEDULER_VAR) or "slurm")
