"""The walltime guard, in the notebook kernel (started by ``%load_ext jupyter_hpcai``).

When Slurm's signal before the walltime reaches the notebook job (its batch shell writes the time down:
``allocation.walltime_signal``), the guard says so in the output of the cell that is running, or else of the
next one, and has the ranks run their walltime hooks (``hpc.on_walltime``) as soon as they are idle: at once
when no cell runs, else when the cell ends (a training loop that calls ``hpc.step()`` runs them at its next
steps, and the guard then finds them done). The hooks get the time left minus a margin.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from .engines import Engines
from .engines.output import grouped
from .errors import HPCAIError
from .ranks.continuity import describe
from .ranks.identity import rank_ranges
from .scheduler import allocation, chosen

environment = chosen().environment

POLL = 1.0  # seconds between looks for the signal's mark (one stat)
MARGIN = 15  # seconds the hooks' deadline keeps before the walltime


class WalltimeGuard:
    """Watches for the walltime signal from a thread; speaks through the kernel's cells."""

    def __init__(self, shell: Any, engines: Callable[[], Engines], environ: dict[str, str] | None = None) -> None:
        self.shell, self.engines = shell, engines
        self.environ = dict(os.environ if environ is None else environ)
        self.signal: float | None = None
        self._cell: dict[str, Any] | None = None  # the running cell's request, while one runs
        self._unsaid: list[str] = []  # for the next cell
        self._hooks_done = False
        self._said_none = False  # that no rank has hooks, for this signal
        self._lock = threading.Lock()

    def start(self) -> None:
        """Follow the cells, and watch for the signal when this kernel runs in a notebook job that asked for it."""
        self.shell.events.register("pre_run_cell", self._pre_run_cell)
        self.shell.events.register("post_run_cell", self._post_run_cell)
        if allocation.walltime_warning(self.environ) and self.environ.get(allocation.JOB_STATE_VAR):
            threading.Thread(target=self._watch, name="hpcai-walltime-guard", daemon=True).start()

    def _watch(self) -> None:
        """Each new signal (a job extended is signalled again before its new end) is said and hooked once."""
        while True:
            time.sleep(POLL)
            signal = allocation.walltime_signal(self.environ)
            if signal is None or signal == self.signal:
                continue
            self.signal, self._hooks_done, self._said_none = signal, False, False
            try:
                self._say(self._warning())
            except Exception:  # the warning is best effort; the hooks still run. To the kernel's log:
                traceback.print_exc(file=sys.__stderr__)
            with self._lock:
                idle = self._cell is None
            if idle:
                self._run_hooks()

    def _warning(self) -> str:
        job = environment.job_id(self.environ) or "?"
        end = allocation.walltime_end(self.signal or time.time(), self.environ)
        when = f" at {time.strftime('%H:%M:%S', time.localtime(end))} (in about {max(0.0, end - time.time()) / 60:.0f} min)"
        return (f"hpcai: Slurm job {job} reaches its walltime{when}. The ranks' walltime hooks (hpc.on_walltime) "
                "run as soon as they are idle; save anything else now.\n")

    def _pre_run_cell(self, info: Any) -> None:
        kernel = getattr(self.shell, "kernel", None)
        with self._lock:
            self._cell = kernel.get_parent() if kernel is not None else {}
            unsaid, self._unsaid = self._unsaid, []
        for text in unsaid:
            sys.stderr.write(text)

    def _post_run_cell(self, result: Any) -> None:
        with self._lock:
            self._cell = None
        if self.signal is not None and not self._hooks_done:
            self._run_hooks(write=sys.stderr.write)

    def _run_hooks(self, write: Callable[[str], Any] | None = None) -> None:
        """The ranks' pending hooks, under the deadline; one report line per group of ranks."""
        engines = self.engines()
        if not engines.running:
            return
        left = allocation.walltime_end(self.signal or time.time(), self.environ) - time.time()
        timeout = max(5.0, left - MARGIN)
        say = write or self._say
        try:
            reports = engines.checkpoint(pending_only=True, timeout=timeout, write=say)
        except HPCAIError as err:
            say(f"hpcai: the walltime hooks failed: {err.message}\n")
            return
        # hooks registered after the signal (a training cell that follows) still get their turn; "none
        # registered" is said once
        self._hooks_done = any(found["hooks"] for found in reports.values())
        if all(found.get("already") for found in reports.values()):
            return  # they ran in the cell's training loop, which printed it
        if self._hooks_done or not self._said_none:
            say(report(reports))
        self._said_none = self._said_none or not self._hooks_done

    def _say(self, text: str) -> None:
        """Into the running cell's output, else the next cell's."""
        kernel = getattr(self.shell, "kernel", None)
        with self._lock:
            cell = self._cell
            if cell is None or kernel is None:
                self._unsaid.append(text)
                return
        kernel.session.send(kernel.iopub_socket, "stream", {"name": "stderr", "text": text}, parent=cell,
                            ident=b"stream.stderr")


def report(reports: dict[int, dict[str, Any]]) -> str:
    """The ranks' walltime reports, ranks with the same words on one line (with the slowest rank's time)."""
    slowest = max((found["seconds"] for found in reports.values()), default=0.0)
    return hpcai_lines({rank: describe({**found, "seconds": slowest}) for rank, found in reports.items()})


def restored(reports: dict[int, dict[str, Any]]) -> str:
    """What ``Engines.restore`` loaded on each rank, ranks with the same outcome on one line."""
    return hpcai_lines({rank: f"resumed at step {found['step']} from {', '.join(found['restored'])}"
                        if found["restored"] else f"nothing restored: {found['missing']}"
                        for rank, found in reports.items()})


def hpcai_lines(words: dict[int, str]) -> str:
    """One ``hpcai: ranks 0-2: ...`` line per distinct text, in rank order."""
    return "".join(f"hpcai: rank{'s' if len(ranks) > 1 else ''} {rank_ranges(ranks)}: {text}\n"
                   for ranks, text in grouped(words))
