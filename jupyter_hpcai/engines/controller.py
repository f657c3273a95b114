"""The engines' controller tied to its kernel (runs beside the kernel, as the controller's process): ipyparallel's
controller, stopped as ipyparallel stops it (SIGTERM) once the kernel that started it is gone.

Outside a job (local engines, or the kernel's own allocation) the engines go with the kernel: ipyparallel stops
them at the kernel's exit, but a killed kernel runs no exit handler, and its controller would stay on the login
node for good. Inside a job the controller is not tied: it outlives its kernel so that another kernel can attach.

    python -m jupyter_hpcai.engines.controller KERNEL_PID [ipyparallel.controller's arguments]
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading

CHECK_EVERY = 2.0  # seconds between looks at the parent


def command(kernel_pid: int) -> list[str]:
    """The controller command (ipyparallel's ``controller_cmd``) tied to ``kernel_pid``."""
    return [sys.executable, "-m", __name__, str(kernel_pid)]


def _watch(kernel_pid: int) -> None:
    """SIGTERM this process once its parent is no longer the kernel (killed, so this process was reparented)."""
    stop = threading.Event()
    while not stop.wait(CHECK_EVERY):
        if os.getppid() != kernel_pid:
            os.kill(os.getpid(), signal.SIGTERM)
            return


def main() -> None:
    kernel_pid = int(sys.argv.pop(1))
    threading.Thread(target=_watch, args=(kernel_pid,), name="hpcai-kernel-watch", daemon=True).start()
    runpy.run_module("ipyparallel.controller", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
