"""What every rank runs (``python -m jupyter_hpcai.ranks.boot``, whichever launcher started it).

In order: pin the rank to one GPU and its thread counts (identity.pin), point the transports at its node's
interface (network.py), start its telemetry sampler (telemetry.py), make logging's set-up safe beside a thread
that makes handlers (tolerate_half_built_handlers), import the ipyparallel engine, start
initialising the framework the kernel named (``HPCAI_WARM``) in a thread, then run the engine: waiting for the
controller's connection file (the kernel starts the controller and the ranks side by side) and registering
overlap the framework's import and init.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

from .. import network
from . import calls, selfstacks, telemetry, world
from .identity import pin
from .frameworks import FRAMEWORKS


def started_at() -> float:
    """When this process was created (wall clock, from its age in /proc): the end of the launcher's part."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def wait_for_connection_file(path: Path, timeout: float) -> None:
    """Until the controller has written its engine connection file whole (it writes it in place)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if "key" in json.loads(path.read_text()):
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise SystemExit(f"hpcai: the controller's connection file {path} did not appear within {timeout:g} s")


def tolerate_half_built_handlers() -> None:
    """Let the engine's logging set-up pass over a handler another thread is still constructing.

    The engine configures logging (traitlets' ``dictConfig``), which first shuts down every handler in
    ``logging._handlerList``, while the framework's thread imports torch or TensorFlow, which make handlers. A
    handler is listed before its ``__init__`` has made its lock (or, for a StreamHandler, its stream): met in that
    window, the shutdown raised AttributeError and the rank died in ``IPEngine.initialize`` (2 of 429 tests in a
    run under load). Such a handler is left as it is: its thread finishes building it, and it works."""
    shutdown_all = logging.shutdown

    def shutdown(handlerList: list = logging._handlerList) -> None:  # type: ignore[type-arg]  # noqa: N803 - logging's
        for ref in reversed(handlerList[:]):
            try:
                shutdown_all([ref])
            except AttributeError:  # half built in another thread
                pass

    logging.shutdown = shutdown


def main() -> None:
    calls.timeline["process"] = started_at()
    calls.mark("python")
    world.shift(os.environ)
    pin(os.environ, len(os.sched_getaffinity(0)))
    network.join_node_network(os.environ)
    telemetry.start_sampling(os.environ)
    selfstacks.start_watching(os.environ, telemetry.FOLDER_VAR)
    tolerate_half_built_handlers()
    # ipyparallel's engine is imported before the framework's thread starts importing: the two imports share
    # modules, and importing them in two threads at once left about one rank start in six hanging silently
    from ipyparallel.engine.app import main as engine_main

    if warm := os.environ.get("HPCAI_WARM"):
        calls.start_booting(FRAMEWORKS[warm])
    calls.mark("imported")
    if connection := os.environ.get("HPCAI_CONNECTION_FILE"):
        wait_for_connection_file(Path(connection), float(os.environ.get("HPCAI_CONTROLLER_TIMEOUT", "60")))
    calls.mark("controller")
    sys.exit(engine_main())


if __name__ == "__main__":
    main()
