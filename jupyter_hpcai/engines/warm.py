"""Engines that start with the first kernel of a multi-GPU job, in the background, so that the first distributed
cell finds them ready (the profile's ``start_engines``: the job exports HPCAI_START_ENGINES=1, the provisioner
loads the extension with the kernel, and the extension calls ``start_with_kernel``).

One kernel per notebook job starts them: the first to claim it in the job's private folder (HPCAI_JOB_STATE,
which the hub's batch script makes; listing.claim_kernel_start). Another kernel of the job starts nothing
(``%hpc attach`` uses the running engines); a kernel restarted later neither, as the engines of the one before
outlive it in the job.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..allocation import JOB_STATE_VAR
from ..contract import START_ENGINES
from .engines import Engines
from .listing import claim_kernel_start


def wanted(engines: Engines, environ: Mapping[str, str] = os.environ) -> bool:
    """The notebook job asked for it, and it has two GPUs or more."""
    allocation = engines.allocation
    return (environ.get(START_ENGINES) == "1" and bool(environ.get(JOB_STATE_VAR)) and allocation is not None
            and len(allocation.nodes) * allocation.gpus_per_node >= 2)


def start_with_kernel(engines: Engines) -> bool:
    """Start one engine per GPU of the job in the background, the env's framework initialised on each, if this is
    the job's first kernel and the job asked for it. Whether it started them."""
    if not wanted(engines) or not claim_kernel_start():
        return False
    engines.start_in_background(framework="auto")
    return True
