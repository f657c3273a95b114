"""Engines that start in the background when a notebook job starts, so that the first distributed cell finds them
ready (the profile's ``start_engines``: the job exports HPCAI_START_ENGINES=1).

Two processes of the job take part, agreeing through files made exclusively in the job's private folder
(HPCAI_JOB_STATE, which the hub's batch script makes and removes):

- the job script runs ``python -m jupyter_hpcai.engines.warm`` beside the server: it claims ``engines-started``,
  starts one engine per GPU in the job's env, waits until the env's framework is initialised on each (the world's
  rendezvous lives in this process until then), and leaves them running;
- the provisioner loads the extension with each kernel; the first kernel to claim ``engines-taken`` uses them:
  it attaches once they registered, or, if nothing claimed ``engines-started`` yet (a job without that script
  line), starts them itself. Either way in a thread: the kernel answers meanwhile, and cells wait for it.

Another kernel of the job starts nothing (``%hpc attach`` uses the running engines); a kernel restarted later
neither, as the engines of the one before outlive it in the job.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ..allocation import JOB_STATE_VAR, Allocation
from ..contract import START_ENGINES
from ..errors import HPCAIError
from ..proc import wait_until
from .engines import Engines
from .listing import claim, job_sets

STARTED, TAKEN = "engines-started", "engines-taken"  # the claims, in the job's private folder


def wanted(engines: Engines, environ: Mapping[str, str] = os.environ) -> bool:
    """The notebook job asked for it, and it has two GPUs or more."""
    allocation = engines.allocation
    return (environ.get(START_ENGINES) == "1" and bool(environ.get(JOB_STATE_VAR)) and allocation is not None
            and len(allocation.nodes) * allocation.gpus_per_node >= 2)


def start_with_kernel(engines: Engines) -> bool:
    """In the job's first kernel: take the engines the job started (attach once they registered), or start them.
    Whether this kernel took them."""
    if not wanted(engines) or not claim(TAKEN):
        return False
    if claim(STARTED):
        engines.in_background(lambda: engines.start(framework="auto"))
    else:
        engines.in_background(lambda: _attach_when_registered(engines))
    return True


def _attach_when_registered(engines: Engines, timeout: float = 300) -> None:
    """Attach to the set the job's script starts, once every rank registered; an error if it gave up."""
    claimed = Path(os.environ[JOB_STATE_VAR]) / STARTED

    def registered() -> bool:
        if not claimed.exists():
            raise HPCAIError("the engines that started with the job failed (its log says why)")
        return any(s.running and s.table.get("ranks") for s in job_sets(engines.job))

    wait_until(registered, timeout=timeout, what="the engines that started with the job")
    engines.attach()


def start_with_job() -> None:
    """``python -m jupyter_hpcai.engines.warm`` (the job script): in the job's env, start the engines and leave
    them to the first kernel; from the server's python, the same again inside the env (HPCAI_ENV)."""
    if "--in-env" not in sys.argv:
        from ..envs import EnvStore

        env = EnvStore().get(os.environ["HPCAI_ENV"])
        argv = env.argv([env.python, "-m", "jupyter_hpcai.engines.warm", "--in-env"])
        os.execve(argv[0], argv, env.environ())
    engines = Engines(Allocation.current())
    if not wanted(engines) or not claim(STARTED):
        return
    try:
        ranks = engines.start(framework="auto")
        if engines.warm:  # ready on every rank before this process, which holds its rendezvous (Horovod's), ends
            engines.run("None", framework=engines.warm, output="rank0", write=lambda _: None)
    except HPCAIError as err:
        Path(os.environ[JOB_STATE_VAR], STARTED).unlink(missing_ok=True)  # the kernel stops waiting, and says so
        print(f"hpcai: the engines that start with the job failed: {err.message} ({err.hint})", flush=True)
        raise SystemExit(1) from None
    print(f"hpcai: {len(ranks)} engines started with the job ({engines.warm or 'no framework'}), "
          "for its first kernel", flush=True)


if __name__ == "__main__":
    start_with_job()
