"""Idle worlds rest (in the kernel): once no cell has run on the engines for ``HPCAI_REST_AFTER`` seconds (30 by
default; 0: never), a thread initialises the world's framework again in the form that costs less while idle
(frameworks.Framework.rest: Horovod with a long cycle), and the next cell that names the framework wakes it
(cells.framework_setup). Only between cells: the thread takes the cell lock without waiting for it, so it never
comes between a cell's requests, and each rank runs the rest before any request sent after it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

from ..contract import REST_AFTER
from ..errors import HPCAIError
from .running_set import RunningSet

DEFAULT_AFTER = 30.0  # seconds without a cell


def rest_after(environ: dict[str, str] | os._Environ[str] = os.environ) -> float:
    """The seconds without a cell after which a world rests (0: never), from HPCAI_REST_AFTER."""
    value = environ.get(REST_AFTER, "")
    try:
        after = float(value) if value else DEFAULT_AFTER
    except ValueError:
        after = -1
    if not after >= 0:
        raise HPCAIError(f"{REST_AFTER}={value!r} is not a number of seconds",
                         f"set it to the seconds idle engines wait before they rest (0: never), or unset it for "
                         f"{DEFAULT_AFTER:g}")
    return after


class Rest:
    """The thread that rests the world ``after`` seconds after the last cell (``used()`` marks one)."""

    def __init__(self, cell_lock: threading.RLock, world: Callable[[], RunningSet | None], after: float) -> None:
        self.cell_lock, self.world, self.after = cell_lock, world, after
        self._due: float | None = None  # when the world rests, unless a cell comes first
        self._changed = threading.Event()
        self._thread: threading.Thread | None = None

    def used(self) -> None:
        """A cell ran (or the world started): the idle time counts from now; the thread starts once."""
        if self.after <= 0:
            return
        self._due = time.monotonic() + self.after
        self._changed.set()
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="hpcai-rest", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        while True:
            due = self._due
            wait = None if due is None else due - time.monotonic()
            if wait is None or wait > 0:
                self._changed.wait(wait)
                self._changed.clear()
            elif not self.cell_lock.acquire(blocking=False):  # a cell, or a grow or shrink: look again later
                self._changed.wait(self.after)
                self._changed.clear()
            else:
                try:
                    if self._due == due:  # no cell came meanwhile
                        self._due = None
                        self._rest()
                finally:
                    self.cell_lock.release()

    def _rest(self) -> None:
        """Rest the world if one runs; a failure goes to the kernel's log (no cell to show it)."""
        world = self.world()
        if world is None:
            return
        try:
            world.rest()
        except Exception as err:
            print(f"hpcai: the idle world could not rest: {err}", file=sys.__stderr__, flush=True)
