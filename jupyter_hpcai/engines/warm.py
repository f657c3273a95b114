"""Engines that start in the background when a notebook job starts, so that the first distributed cell finds them
ready (the profile's ``start_engines``: the job exports HPCAI_START_ENGINES=1).

Two processes of the job take part, agreeing through files made exclusively in the job's private folder
(HPCAI_JOB_STATE, which the hub's batch script makes and removes):

- the job script runs ``python -m jupyter_hpcai.engines.warm`` beside the server: it claims ``engines-started``
  (its pid in it), starts one engine per GPU in the env of the job's kernel, waits until the env's framework is
  initialised on each (the world's rendezvous lives in this process until then) and then at rest (rest.py: no
  cell may come for minutes; the first cell wakes it), writes the set's id to ``engines-ready`` and leaves the
  engines running; if it fails, it stops what it started and drops its claim;
- the provisioner loads the extension with each kernel; the first kernel to claim ``engines-taken`` uses them:
  it attaches to the set ``engines-ready`` names, or, if nothing claimed ``engines-started`` yet (a job without
  that script line), starts them itself. Either way in a thread: the kernel answers meanwhile, and cells wait.
  While it waits it watches the starter: a claim dropped, or its process gone, ends the wait at once.

Another kernel of the job starts nothing (``%hpc attach`` uses the running engines); a kernel restarted later
neither, as the engines of the one before outlive it in the job.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ..contract import START_ENGINES
from ..errors import HPCAIError
from ..proc import wait_until
from ..scheduler.allocation import JOB_STATE_VAR, Allocation
from .engines import Engines
from .listing import claim, process_alive

STARTED, TAKEN, READY = "engines-started", "engines-taken", "engines-ready"  # in the job's private folder


def wanted(engines: Engines, environ: Mapping[str, str] = os.environ) -> bool:
    """The notebook job asked for it, and it has two GPUs or more."""
    allocation = engines.allocation
    return (environ.get(START_ENGINES) == "1" and bool(environ.get(JOB_STATE_VAR)) and allocation is not None
            and len(allocation.nodes) * allocation.gpus_per_node >= 2)


def start_with_kernel(engines: Engines) -> bool:
    """In the job's first kernel: take the engines the job started (attach once they are ready), or start them.
    Whether this kernel took them."""
    if not wanted(engines) or not claim(TAKEN):
        return False
    if claim(STARTED, str(os.getpid())):
        engines.background.start(lambda: engines.start(framework="auto"), done=engines.announce)
    else:
        engines.background.start(lambda: engines.attach(_ready_set()), done=engines.announce)
    return True


def _ready_set(timeout: float = 300) -> str:
    """The id of the set the job's starter made, once it is ready; an error as soon as the starter is gone."""
    folder = Path(os.environ[JOB_STATE_VAR])

    def ready() -> str | None:
        if (folder / READY).exists():
            return (folder / READY).read_text().strip()
        try:
            pid = int((folder / STARTED).read_text() or 0)  # empty until the starter writes its pid in its claim
        except FileNotFoundError:
            pid = -1  # the claim dropped: the start failed
        except (OSError, ValueError):
            pid = 0
        if pid < 0 or pid and not process_alive(pid):
            raise HPCAIError("the engines that start with the job failed (the job's log says why)")
        return None

    return wait_until(ready, timeout=timeout, what="the engines that start with the job")


def _kernel_env() -> tuple[list[str], dict[str, str]]:
    """The argv that runs this module with --in-env in the env of the job's kernel (its kernelspec, as the
    provisioner resolves it), and that env's environment."""
    from jupyter_client.kernelspec import KernelSpecManager

    from ..envs import EnvStore

    spec = KernelSpecManager().get_kernel_spec(f"hpcai-{os.environ['HPCAI_ENV'].lower()}")
    config = spec.metadata["kernel_provisioner"]["config"]
    store = EnvStore.at(Path(config["env_root"])) if config.get("env_root") else EnvStore()
    env = store.get(config["env"])
    return env.argv([env.python, "-m", "jupyter_hpcai.engines.warm", "--in-env"]), env.environ()


def start_with_job() -> None:
    """``python -m jupyter_hpcai.engines.warm`` (the job script): in the env of the job's kernel, start the engines
    and leave them to the first kernel; from the server's python, the same again inside that env."""
    if "--in-env" not in sys.argv:
        argv, environ = _kernel_env()
        os.execve(argv[0], argv, environ)
    engines = Engines(Allocation.current())
    if not wanted(engines) or not claim(STARTED, str(os.getpid())):
        return
    folder = Path(os.environ[JOB_STATE_VAR])
    try:
        ranks = engines.start(framework="auto")
        if engines.warm:  # ready on every rank before this process, which holds its rendezvous (Horovod's), ends
            engines.run("None", framework=engines.warm, output="rank0", write=lambda _: None)
            _rest(engines)
        (folder / f".{READY}").write_text(engines.running_set().cluster.cluster_id)
        os.replace(folder / f".{READY}", folder / READY)
    except BaseException as err:
        engines.stop()
        (folder / STARTED).unlink(missing_ok=True)  # the kernel stops waiting, and says so
        said = f"{err.message} ({err.hint})" if isinstance(err, HPCAIError) else f"{type(err).__name__}: {err}"
        print(f"hpcai: the engines that start with the job failed: {said}", flush=True)
        raise SystemExit(1) from None
    print(f"hpcai: {len(ranks)} engines started with the job ({engines.warm or 'no framework'}), "
          "for its first kernel", flush=True)


def _rest(engines: Engines) -> None:
    """Until the first kernel's first cell the world is idle: at rest, if its framework has a form that costs less
    (Horovod over Gloo: awake, its 1 ms cycle took 7-18 % of a core per rank while the server, JupyterLab and the
    kernel started beside it), unless idle worlds never rest here (HPCAI_REST_AFTER=0)."""
    world = engines.running_set()
    if engines.rest.after > 0 and world.rest() and not world.rested():
        raise HPCAIError(f"{world.resting} could not rest on every rank (the job's log says why)")


if __name__ == "__main__":
    start_with_job()
