"""This kernel's engines: ipyparallel engines on the allocation's ranks, frameworks initialised on them, cells run
on them. ``Engines`` is the kernel's one handle (magics, the panel, the walltime guard): its state, the allocation
(or the job the kernel asked for itself: own_job.py), and the set that runs (running_set.py, started or attached by
startup.py, perhaps in a thread: background.py), on which cells run (cells.py) and whose world grows and shrinks
(elastic.py).

One controller runs beside the kernel, bound to the address Slurm uses for this node (never all interfaces).
Cluster files live where ipyparallel keeps them (the IPython profile's security/ folder, private to the user),
so the server extension can list them without a registry of its own.

Inside a job the engines outlive their kernel (a restart, a crash): another kernel of the job attaches to them
with their state (``attach``), the side panel lists and stops them, ``start`` stops the ones no kernel uses any
more, and the job's end stops them all (listing.record_processes). Outside a job they stop with the kernel.
"""

from __future__ import annotations

import atexit
import sys
import threading
from collections.abc import Callable
from typing import Any, Literal

import ipyparallel as ipp

from ..errors import HPCAIError
from ..ranks import stacks as rank_stacks
from ..ranks import telemetry
from ..ranks.frameworks import FRAMEWORKS, default_framework
from ..scheduler.allocation import Allocation
from . import listing, membership, own_job, startup
from .background import Background
from .cells import CONTINUITY, Cell, Outcomes
from .elastic import Elastic
from .launch import Layout, plan
from .output import Streams, Write, to_stdout
from .rest import DEFAULT_AFTER, Rest, rest_after
from .running_set import Rank, RunningSet
from .startup import Progress

State = Literal["stopped", "pending", "starting", "running", "restarting", "stopping"]


class Engines(Elastic):
    """Start, stop, restart and inspect this kernel's engines (one per rank), and run cells on them; their world
    grows and shrinks (elastic.py)."""

    def __init__(self, allocation: Allocation | None = None) -> None:
        self.allocation = allocation
        self.set: RunningSet | None = None  # the engines while they start and run
        self.layout: Layout | None = None  # the last start's, which restart starts again
        self.warm: str | None = None  # the framework the running set's ranks initialised at boot
        self.telemetry_interval = telemetry.DEFAULT_INTERVAL
        self.replaced: list[listing.EngineSet] = []  # sets no kernel used, stopped by the last start
        self.own_job: own_job.OwnJob | None = None  # the allocation this kernel asked for itself (own_job.py)
        self.pending: dict[str, str] | None = None  # its Slurm record while it waits to run
        self.state: State = "stopped"
        self._listeners: list[Callable[[Engines], None]] = []
        self._starting = threading.Lock()  # one start at a time (the panel's waits in a thread)
        self._running_cell = threading.RLock()  # shrink and grow wait for the cell; joins never
        self.background = Background()  # a start in a thread: the one with the kernel (warm.py)
        self.last_output: tuple[Streams, list[str]] = ({}, [])  # the last cell's whole output by rank; their hosts
        self.rest = Rest(self._running_cell, lambda: self.set if self.running else None, _rest_after())
        if allocation is None:  # outside a job nothing would stop them: they go with the kernel (ipyparallel's atexit)
            atexit.register(lambda: self.set.remove_folder() if self.set else None)

    # --- state, for the panel and the magics --------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Engines are up (never while a start in the background is under way: its client is that thread's)."""
        return self.set is not None and self.set.client is not None and not self.background.busy

    @property
    def started_in_background(self) -> bool:
        """The engines that run (or start) are the background start's, until a stop."""
        return self.background.started

    @property
    def ranks(self) -> list[Rank]:
        return self.set.ranks if self.set else []

    def subscribe(self, listener: Callable[[Engines], None]) -> Callable[[], None]:
        """Call ``listener(engines)`` on every change of state (start, stop, restart); returns the unsubscribe."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def announce(self) -> None:
        """Tell the listeners the state again (a panel drawn from another thread while a start in the background
        ended saw its state, but not yet its ranks: panels told so drew "running" over "no engines running")."""
        for listener in list(self._listeners):
            listener(self)

    def _set_state(self, state: State) -> None:
        self.state = state
        if state == "running":
            self.rest.used()
        self.announce()

    @property
    def goes_with_kernel(self) -> bool:
        """Outside a job, and in the kernel's own job, the engines stop with the kernel; in a job they outlive it."""
        return self.allocation is None or self.own_job is not None

    @property
    def job(self) -> str:
        """The Slurm job the engines run in, "local" outside one (the first part of their cluster ids)."""
        return self.allocation.job_id if self.allocation else "local"

    # --- start and stop -----------------------------------------------------------------------------------
    def command(self, layout: Layout) -> list[str]:
        """The command that starts the ranks for ``layout`` (printable before anything starts)."""
        return startup.command(layout, self.allocation)

    def start(self, *, n: int | None = None, nodes: int | None = None, gpus_per_node: int | None = None,
              launcher: str | None = None, framework: str | None = "auto", timeout: float = 180,
              telemetry_interval: float = telemetry.DEFAULT_INTERVAL, progress: Progress | None = None,
              ask: own_job.Request | None = None, pending: own_job.Pending | None = None) -> list[Rank]:
        """Start the engines (stopping any running ones first) and return the ranks, in rank order.

        ``framework``: initialised by every rank as it boots, so that the first cell finds it ready: a name in
        FRAMEWORKS, "auto" (the env's: Horovod, else torch) or None (only on first use).
        ``telemetry_interval``: seconds between the ranks' telemetry samples (0: off).
        ``ask``: outside any job, the allocation to submit and start in (own_job.py), kept until ``stop``;
        ``pending`` hears its record while Slurm has not started it.
        """
        self.await_background()
        if not self._starting.acquire(blocking=False):
            raise HPCAIError("a start of these engines is under way (in the panel, or another thread)",
                             "wait for it, or %hpc stop (which also releases a job that waits)")
        try:
            return self._start_or_ask(n, nodes, gpus_per_node, launcher, framework, timeout, telemetry_interval,
                                      progress, ask, pending)
        finally:
            self._starting.release()

    def _start_or_ask(self, n: int | None, nodes: int | None, gpus_per_node: int | None, launcher: str | None,
                      framework: str | None, timeout: float, telemetry_interval: float, progress: Progress | None,
                      ask: own_job.Request | None, pending: own_job.Pending | None) -> list[Rank]:
        self.telemetry_interval = telemetry.checked_interval(telemetry_interval)
        if ask is not None:
            self.check_request(ask, launcher)
        new_job = ask is not None and self.own_job is None
        # bad arguments leave running engines be; a new job's layout is checked against the request before it is
        # submitted, and planned on the real allocation once it runs
        layout = None if new_job else plan(self.allocation, n=n, nodes=nodes, gpus_per_node=gpus_per_node,
                                           launcher=launcher)
        if new_job:
            plan(ask.as_allocation(), n=n, nodes=nodes, gpus_per_node=gpus_per_node, launcher=launcher)  # type: ignore[union-attr]
        warm = default_framework() if framework == "auto" else framework
        if warm is not None and warm not in FRAMEWORKS:
            raise HPCAIError(f"unknown framework '{warm}'", f"use one of: {', '.join(FRAMEWORKS)}, or none")
        restarting = self.state == "restarting"
        self.stop(notify=False, release=False)
        self._set_state("restarting" if restarting else "starting")
        try:
            if new_job:
                self._enter_own_job(ask, pending)  # type: ignore[arg-type]
            elif self.own_job is not None and (gone := self.own_job.gone()) is not None:
                self.stop(notify=False)  # out of it: the kernel may ask for a new one
                raise gone
            layout = layout or plan(self.allocation, n=n, nodes=nodes, gpus_per_node=gpus_per_node, launcher=launcher)
            self.replaced = listing.stop_detached(self.job)  # a restarted kernel's engines: GPUs nobody uses
            self.layout, self.warm = layout, warm
            self.set = startup.prepare(self.allocation, self.job, layout, warm, timeout, self.telemetry_interval,
                                       self.goes_with_kernel)
            startup.launch(self.set, self.allocation, timeout, progress)
        except BaseException:
            # a job that never ran (an interrupt while it waited, Slurm's refusal) is cancelled; one the kernel is
            # in stays for the next start (%hpc stop releases it), as the engines' failure is no reason to lose it
            self.stop(release=self.own_job is not None and not self.own_job.entered)
            raise
        if not self.background.here:
            self.background.error = None  # a start of the user's worked: the background's failure is old news
        self._set_state("running")
        return self.ranks

    def await_background(self, write: Write | None = None) -> None:
        """Wait for a start in the background (``write`` says so first, and says its failure: background.py)."""
        self.background.wait(write)

    def check_request(self, ask: own_job.Request, launcher: str | None) -> None:
        """An allocation may be asked for outside any job, once, for ranks that srun starts."""
        own_job.check_request(ask, launcher, self.allocation, self.own_job)

    def _enter_own_job(self, ask: own_job.Request, pending: own_job.Pending | None) -> None:
        """Submit ``ask``, wait until Slurm runs it (state "pending" meanwhile), and take it as the allocation."""
        self.own_job = job = own_job.OwnJob(ask)
        job.submit()

        def waiting(info: dict[str, str]) -> None:
            self.pending = info
            self._set_state("pending")
            if pending:
                pending(info)

        job.enter(job.wait(waiting))
        self.pending = None
        self._set_state("starting")
        self.allocation = Allocation.current()

    def attach(self, cluster_id: str | None = None, timeout: float = 30) -> list[Rank]:
        """Use engines that are running in this job already (an earlier kernel's, or another notebook's), with
        everything defined on the ranks: ``cluster_id``, else the only set no kernel uses, else the only set."""
        self.await_background()
        if self.set is not None:
            raise HPCAIError("this kernel has engines already", "use them, or %hpc stop them first")
        self.set = found = startup.attach(self.allocation, self.job, cluster_id, timeout)
        self.layout, self.warm, self.telemetry_interval = found.layout, found.warm, found.telemetry_interval
        self._set_state("running")
        return self.ranks

    def stop(self, notify: bool = True, release: bool = True) -> None:
        """Stop the engines and the controller, and (``release``) end this kernel's own job if it has one.
        Harmless when nothing runs; a start in the background finishes first."""
        self.await_background()
        if not self.background.here:  # a stop of the user's, not the one the background start begins with
            self.background.started = False
        running, self.set = self.set, None
        self.warm = None  # a restart after this starts cold, as the first cell after a lost world does
        if running is not None:
            for job in running.grown:
                membership.cancel(job)
            running.stop()
        if release and self.own_job is not None:
            self.own_job.release()
            self.own_job = self.pending = self.allocation = None
        if notify:
            self._set_state("stopped")

    def restart(self, *, timeout: float = 180, progress: Progress | None = None) -> list[Rank]:
        """Stop everything and start the same layout again (the same framework initialised at boot)."""
        if self.layout is None:
            raise HPCAIError("no engines were started in this kernel", "start them first: %hpc start")
        layout, warm = self.layout, self.warm or (self.set.framework if self.set else None)  # before stop clears it
        self._set_state("restarting")
        return self.start(n=layout.n, nodes=layout.nodes, gpus_per_node=layout.per_node, launcher=layout.launcher,
                          framework=warm, timeout=timeout, telemetry_interval=self.telemetry_interval,
                          progress=progress)

    # --- what the ranks are doing -------------------------------------------------------------------------
    def running_set(self) -> RunningSet:
        """The set that runs (once a start in the background is done), or the error that says to start one."""
        self.await_background()
        if not self.running:
            raise HPCAIError("no engines are running", "start them: %hpc start")
        assert self.set is not None
        return self.set

    def status(self) -> list[Rank]:
        """The ranks, each marked alive or not (an engine the controller lost is not alive)."""
        if not self.running or self.set is None:
            return []
        self.take_joined()
        return self.set.status()

    def samples(self) -> list[telemetry.Sample]:
        """Every rank's latest telemetry (read from the set's folder: nothing asks the ranks)."""
        return self.set.samples() if self.set else []

    def set_telemetry(self, interval: float) -> None:
        """Sample every ``interval`` seconds on every rank from now on (0: off)."""
        self.running_set().set_telemetry(interval)
        self.telemetry_interval = interval

    def stacks(self, native: bool = False, timeout: float = 60, source: str | None = None
               ) -> list[rank_stacks.StackGroup]:
        """Every rank's Python stack, identical ones grouped; ``native`` adds the C frames; ``source``: stacks.py."""
        return self.running_set().stacks(native, timeout, source)

    def view(self) -> ipp.DirectView:
        """A DirectView on the ranks, in rank order (for %%px and ipyparallel's own API)."""
        return self.running_set().view()

    # --- cells --------------------------------------------------------------------------------------------
    def run(self, code: str, *, framework: str | None = "horovod", timeout: float | None = None,
            output: str = "auto", push: dict[str, Any] | None = None, write: Write | None = None,
            first_line: int = 1, elastic: int | None = None) -> dict[int, Any]:
        """Run ``code`` on every rank and return each rank's value of the cell's last expression (cells.py).

        Guarantees: an exception on any rank shows every failing rank with its full traceback; a rank that
        dies is reported by rank and host and the rest of the world is stopped (the kernel lives on, `%hpc
        restart` brings the world back); a timeout names the ranks that were stuck; Ctrl-C interrupts every
        rank. ``first_line``: the number of the cell's first line as the user sees it, for tracebacks.
        ``elastic``: when ranks die, go on with the survivors if at least this many are left (the world
        re-formed, the last checkpoint restored, the cell run again).
        """
        with self._running_cell:  # one cell at a time, whichever thread asks (the walltime guard's, say)
            write = write or to_stdout
            self.await_background(write)
            if not self.running:
                self.start(framework=framework)
            self.take_joined()
            cell = Cell(self.running_set(), write, timeout, lost=lambda: self.stop(release=False), elastic=elastic)
            try:
                return cell.run(code, framework, output, push, first_line)
            finally:
                self.last_output = cell.texts(), [r.host for r in cell.world.ranks]
                self.rest.used()

    def checkpoint(self, directory: str | None = None, *, pending_only: bool = False, timeout: float | None = None,
                   write: Write | None = None) -> Outcomes:
        """Run the ranks' walltime hooks (``hpc.on_walltime``) now, checkpoints going to ``directory`` if given;
        ``pending_only``: only if the walltime signal came and they did not run for it yet. Each rank's report."""
        call = "run_pending" if pending_only else "run_hooks"
        return self.run(f"{CONTINUITY}.{call}({directory!r})", framework=None, timeout=timeout, write=write)

    def restore(self, directory: str | None = None, write: Write | None = None) -> Outcomes:
        """Every ``hpc.Checkpoint`` made on the ranks loads its latest save; each rank's report."""
        return self.run(f"{CONTINUITY}.restore_all({directory!r})", framework=None, write=write)


def _rest_after() -> float:
    """HPCAI_REST_AFTER; a bad value is said (the kernel's log, the job's) and the default taken."""
    try:
        return rest_after()
    except HPCAIError as err:
        print(f"hpcai: {err.message}; {err.hint}. Idle engines rest after {DEFAULT_AFTER:g} s meanwhile",
              file=sys.stderr, flush=True)
        return DEFAULT_AFTER


_current: Engines | None = None


def current() -> Engines:
    """This kernel's engines (one set per kernel, shared by the magics and the widget)."""
    global _current
    if _current is None:
        _current = Engines(Allocation.current())
    return _current
