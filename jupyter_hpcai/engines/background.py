"""A start of the engines in a thread (in the kernel): the job's first kernel takes the engines that start with the
job (warm.py) while it answers. Cells and other starts wait for it; its failure is told by the first of them that
can say it, as the kernel has no cell to show it in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..errors import HPCAIError
from .output import Write


class Background:
    """The start in a thread that ``Engines`` owns: whether it is under way, why it failed, whether the running
    engines are its."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.error: HPCAIError | None = None  # why it failed, told to the next cell that can say it
        self.started = False  # the running engines are the background start's (until a stop)
        self._telling = threading.Lock()  # one thread tells that failure

    @property
    def busy(self) -> bool:
        """Under way, seen from another thread (the set's client is the start's thread's meanwhile)."""
        thread = self.thread
        return thread is not None and thread.is_alive() and thread is not threading.current_thread()

    @property
    def here(self) -> bool:
        """Whether this is the background start's own thread."""
        return self.thread is not None and self.thread is threading.current_thread()

    def start(self, start: Callable[[], object], done: Callable[[], object] = lambda: None) -> None:
        """``start()`` (a start, or an attach) in a thread, the kernel going on meanwhile; a failure is kept in
        ``error`` for the next cell to tell. ``done()`` last, in the thread: what another thread read of the engines
        while it ended (not running yet: this thread still held them) is out of date by then."""
        def starting() -> None:
            try:
                start()
            except HPCAIError as err:
                self.error = err
            except Exception as err:  # any other: a thread's exception would only reach the kernel's log
                self.error = HPCAIError(f"{type(err).__name__}: {err}")
            done()

        self.error, self.started = None, True
        self.thread = threading.Thread(target=starting, name="hpcai-background-start", daemon=True)
        self.thread.start()

    def wait(self, write: Write | None = None) -> None:
        """Wait for it (``write`` says so first). Its failure is said by the first caller with a ``write`` (then
        forgotten), or forgotten at the next start that works."""
        thread = self.thread
        if thread is None or thread is threading.current_thread():
            return
        if thread.is_alive() and write:
            write("hpcai: waiting for the engines that are starting in the background\n")
        thread.join()
        self.thread = None
        with self._telling:
            err, self.error = (self.error, None) if write else (None, self.error)
        if err is not None and write:
            write(f"hpcai: the engines that started in the background failed: {err.message}\n")
