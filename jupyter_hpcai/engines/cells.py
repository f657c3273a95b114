"""A cell run on every rank of a running set (in the kernel): the framework initialised first if it is not,
one request to all ranks, watched and streamed; failures, deaths, timeouts and interrupts told by rank.
What the user sees of it is output.py."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..errors import HPCAIError
from ..ranks import calls
from ..ranks.continuity import restore_all
from ..ranks.continuity import steps as rank_steps
from ..ranks import stacks as rank_stacks
from ..ranks.frameworks import FRAMEWORKS
from .output import COLLAPSE_ABOVE, OUTPUT_MODES, RankFailure, Streamer, Streams, Write, grouped, rank_ranges
from .running_set import Rank, RunningSet

CONTINUITY = "__import__('jupyter_hpcai.ranks.continuity', fromlist=['hpc'])"  # the ranks' walltime API
# seconds the other ranks may take to fail too once one rank's framework initialisation failed; past it, they are
# taken as waiting for it in the framework's collective start (Horovod's over MPI has no timeout)
CELL_FILE = re.compile(r"ipykernel_\d+")  # where a rank's kernel compiles its cells: its pid, in its tracebacks
FAILED_INIT_GRACE = 10.0
STACKS_WITHIN = 15.0  # seconds the slow-start notice waits for the ranks' stacks (the watch pauses meanwhile)
Outcomes = dict[int, dict[str, Any]]  # each rank's calls.run_cell report, by rank


def preflight(world: RunningSet, framework: str) -> Outcomes:
    """Check that every rank sees the same python and framework versions (gathered with the rank table);
    raise with a table when not."""
    names = ("python", "executable", *FRAMEWORKS[framework].distributions)
    found = {rank: {k: v.get(k) for k in names} for rank, v in world.versions.items()}
    if any(v != found[0] for v in found.values()):
        rows = "\n".join(f"  rank {rank} ({world.ranks[rank].host}): {v}" for rank, v in sorted(found.items()))
        raise HPCAIError(f"the ranks do not see the same environment:\n{rows}", "make the env reachable at the same "
                         "path on every node (a shared filesystem), then %hpc restart")
    return found


def framework_setup(world: RunningSet, name: str, elastic: bool = False) -> Callable[[], Any] | None:
    """What a cell's ranks run first so that ``name`` is initialised and awake (None once it is); a re-formed or
    resting world's with the framework's ``reformed`` params. ``elastic``: the cell goes on after lost ranks, which
    the framework must allow."""
    if name not in FRAMEWORKS:
        raise HPCAIError(f"unknown framework '{name}'", f"use one of: {', '.join(FRAMEWORKS)}")
    framework = FRAMEWORKS[name]
    if elastic and (why := framework.fixed()):
        raise HPCAIError(f"--elastic: {why}", "or run the cell without --elastic")
    world.rested()
    waking = world.resting == name  # initialised at rest (another framework's cells may have run since)
    if world.framework == name and not waking:
        return None
    if world.framework != name:
        preflight(world, name)
    params_of = framework.reformed if (world.changes or waking) and framework.reformed else framework.params
    return partial(calls.init_framework, framework, params_of(world) if params_of else {}, waking)


def who(ranks: list[Rank]) -> str:
    """``rank 3 on n2``, or ``ranks 0-63 on n1-n8`` style: ranges of ranks, and their nodes (how many, past 4)."""
    if len(ranks) == 1:
        return f"rank {ranks[0].rank} on {ranks[0].host}"
    hosts = list(dict.fromkeys(r.host for r in ranks))
    return f"ranks {rank_ranges([r.rank for r in ranks])} on {', '.join(hosts) if len(hosts) <= 4 else f'{len(hosts)} nodes'}"


def listed(ranks: list[Rank]) -> str:
    """Ranks by rank and host (``rank 0 on n1, rank 2 on n2``); above COLLAPSE_ABOVE of them, by node (``ranks
    0-7 on n1, rank 9 on n2, ...``). Each Rank carries its host: the world may have been renumbered since."""
    if len(ranks) <= COLLAPSE_ABOVE:
        return ", ".join(f"rank {r.rank} on {r.host}" for r in ranks)
    by_node: dict[str, list[Rank]] = {}
    for rank in ranks:
        by_node.setdefault(rank.host, []).append(rank)
    return ", ".join(who(here) for here in by_node.values())


class RanksDied(Exception):
    """Ranks died during an elastic cell (``whole``: its request) and enough may survive to go on."""

    def __init__(self, whole: Any) -> None:
        super().__init__("ranks died")
        self.whole = whole


@dataclass
class Cell:
    """One cell on every rank of ``world``. ``lost`` stops the world (a rank died, the controller died, the
    timeout passed): the kernel lives on and ``%hpc restart`` brings the world back. ``elastic``: when ranks die
    and at least this many survive, the world re-forms on the survivors, restores the last checkpoint and runs
    the cell again instead."""

    world: RunningSet
    write: Write
    timeout: float | None
    lost: Callable[[], None]
    elastic: int | None = None
    last: Any = None  # the last request to the ranks (its AsyncResult): their whole output, for %hpc output

    def run(self, code: str, framework: str | None, output: str, push: dict[str, Any] | None,
            first_line: int) -> dict[int, Any]:
        """Each rank's value of the cell's last expression; RankFailure with every traceback if some failed."""
        if output not in OUTPUT_MODES:
            raise HPCAIError(f"unknown output mode '{output}'", f"use one of: {', '.join(OUTPUT_MODES)}")
        if self.elastic is not None and not 1 <= self.elastic <= len(self.world.ranks):
            raise HPCAIError(f"--elastic {self.elastic}: the world has {len(self.world.ranks)} ranks",
                             f"use --elastic 1..{len(self.world.ranks)} (the fewest ranks to go on with)")
        while True:
            try:
                return self._run_once(code, framework, output, push, first_line)
            except RanksDied as died:
                try:
                    self._go_on_without(died.whole)
                except Exception as err:  # too few survivors, or more ranks died while they re-formed
                    self.lost()
                    if isinstance(err, HPCAIError):
                        raise
                    raise RankFailure(f"ranks died, and the survivors could not go on: {err}; the world was stopped",
                                      "bring the world back with %hpc restart") from None

    def _go_on_without(self, whole: Any) -> None:
        """Once the survivors are done with the cell, they re-form the world and load the last checkpoint; one line
        says so. Too few survivors, or some stuck: the world is lost as without ``elastic``."""
        world = self.world
        began = time.monotonic()
        free = self._survivors_free(whole)
        dead = world.dead()  # again: ranks of one node are found dead one by one
        gone = {r.engine_id for r in dead}
        survivors = [r.engine_id for r in world.ranks if r.engine_id not in gone]
        if not free or len(world.ranks) - len(dead) < (self.elastic or 0):
            names = listed(dead)
            why = "the survivors stayed stuck in the cell" if not free else f"fewer than {self.elastic} ranks are left"
            raise RankFailure(f"ranks died: {names}; {why}, so the world was stopped; the notebook kernel is fine",
                              "bring the world back with %hpc restart, then run the cell again")
        lost_at = max(world.connected[survivors].apply_sync(rank_steps), default=0)
        freed = time.monotonic()
        world.drop(dead)
        placed = time.monotonic()
        restored = world.view().apply_sync(restore_all)
        loaded = time.monotonic()
        step = min((r["step"] for r in restored), default=0)
        names = listed(dead)
        self.write(f"hpcai: {names} lost at step {lost_at}; continuing on {len(world.ranks)} ranks from step "
                   f"{step}" + ("" if any(r["restored"] for r in restored) else " (no checkpoint saved yet)")
                   + f" (survivors free {freed - began:.1f} s, renumbered {placed - freed:.1f} s, checkpoint loaded "
                   f"{loaded - placed:.1f} s; the framework starts again with the cell)\n")

    def _run_once(self, code: str, framework: str | None, output: str, push: dict[str, Any] | None,
                  first_line: int) -> dict[int, Any]:
        setup = framework_setup(self.world, framework, self.elastic is not None) if framework else None
        if setup is not None:  # its own request: a rank that dies in it died of the framework's init
            self._request("pass", 1, None, setup, "all", initialising=framework)
            self.world.framework = framework
            if self.world.resting == framework:
                self.world.resting = None
        outcomes = self._request(code, first_line, push, None, output, initialising=None)
        failed = {rank: o for rank, o in outcomes.items() if not o["ok"]}
        if failed:
            self.write(self.tracebacks(failed))
            summary = ", ".join(f"{rank_ranges(ranks)} ({error})" for ranks, error in
                                grouped({r: f"{o['ename']}: {o['evalue'][:80]}" for r, o in failed.items()}))
            raise RankFailure(f"{len(failed)} of {len(outcomes)} ranks failed: {summary}",
                              "the tracebacks above show each failing rank (ranks that failed alike under one); "
                              "the engines are still running", outcomes)
        return {rank: o["value"] for rank, o in outcomes.items()}

    def _request(self, code: str, first_line: int, push: dict[str, Any] | None, setup: Callable[[], Any] | None,
                 output: str, initialising: str | None) -> Outcomes:
        """One run_cell request to every rank, watched and streamed; each rank's outcome, by rank."""
        client = self.world.connected
        ids = [r.engine_id for r in self.world.ranks]
        whole = self.last = self.world.broadcast(calls.run_cell, code, first_line, push, setup)
        streamer = Streamer(self.world.ranks, output, self.write)
        try:
            self._watch(whole, streamer, initialising)
        except KeyboardInterrupt:
            client.send_signal(signal.SIGINT, targets=ids, block=False)
            freed = whole.wait(10)
            streamer.feed(_texts(whole), final=True)
            if not freed:  # blocked in C (a collective), where SIGINT waits
                self.write(f"some ranks are still busy after the interrupt; where each rank is:\n{self.where_stuck()}"
                           "\n%hpc restart frees them\n")
            raise
        whole.wait_for_output(10)  # a result can arrive before the last of its rank's output does
        streamer.feed(_texts(whole), final=True)
        outcomes = dict(enumerate(whole.get()))
        failed = {rank: o for rank, o in outcomes.items() if o.get("setup")}
        if failed:
            raise HPCAIError(f"initialising {initialising} failed on the ranks:\n{self.tracebacks(failed)}",
                             "fix the cause above, then %hpc restart")
        return outcomes

    def _watch(self, whole: Any, streamer: Streamer, initialising: str | None) -> None:
        """Stream output until every rank is done; stop the world on a dead rank, a dead controller or the timeout.
        ``initialising``: the framework this cell initialises first (ranks that die then died of its init)."""
        world = self.world
        deadline = time.monotonic() + self.timeout if self.timeout else None
        init = InitWatch(self, whole, initialising) if initialising else None
        while True:
            done = whole.wait(0.1)
            if done and whole.successful():  # run_cell returns every outcome; only a rank's death fails it
                return
            streamer.feed(_texts(whole))
            if init is not None and not done:
                init.check(streamer)
            if not world.controller_alive():
                self.lost()
                raise RankFailure("the ipyparallel controller died, so the ranks can no longer be reached; they were "
                                  "stopped and the notebook kernel is fine", "bring the world back with %hpc restart")
            if dead := world.dead():
                streamer.feed(_texts(whole), final=True)
                if self.elastic and len(world.ranks) - len(dead) >= self.elastic:
                    raise RanksDied(whole)
                report = world.launcher_report()
                self.lost()
                names = listed(dead)
                if initialising:  # e.g. MPI_Init aborting the process, in the rank's boot or in the cell's setup
                    raise HPCAIError(f"initialising {initialising} failed on the ranks: ranks died: {names}"
                                     + (f"\nthe launcher said:\n{report}" if report else ""),
                                     "fix the cause above, then %hpc restart")
                raise RankFailure(f"ranks died: {names}" + (f"\n{report}" if report else "")
                                  + "\nthe other ranks were stopped; the notebook kernel is fine",
                                  "bring the world back with %hpc restart, then run the cell again")
            if done:
                return  # failed otherwise: get() raises it
            if deadline and time.monotonic() > deadline:
                hosts = self.still_running(whole)
                streamer.feed(_texts(whole), final=True)
                where = self.where_stuck()
                self.lost()
                raise RankFailure(f"timed out after {self.timeout:g} s; still running: {hosts} "
                                  "(stuck, e.g. waiting in a collective for a rank that never joined). "
                                  f"Where each rank was:\n{where}\nThe engines were stopped",
                                  "bring the world back with %hpc restart")

    def _survivors_free(self, whole: Any, wait: float = 60) -> bool:
        """Whether the surviving ranks finished their part of the cell (a collective with a dead peer fails on
        them; one blocked in C is interrupted), so that they can run it again. The controller fails a dead rank's
        part, so every part ends."""
        client = self.world.connected

        def free() -> bool:
            client.spin()
            return not set(whole.msg_ids) & client.outstanding

        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not free():
            time.sleep(0.1)
        if not free():
            alive = [r.engine_id for r in self.world.ranks if r.engine_id in client.ids]
            client.send_signal(signal.SIGINT, targets=alive, block=False)
            end = time.monotonic() + 10
            while time.monotonic() < end and not free():
                time.sleep(0.1)
        return free()

    def texts(self) -> Streams:
        """Each rank's whole stdout and stderr in the last request, by rank (none before one)."""
        return _texts(self.last) if self.last is not None else {}

    def still_running(self, whole: Any) -> str:
        """The ranks whose part of ``whole`` has not ended, by rank and host."""
        outstanding = self.world.connected.outstanding
        return listed([rank for rank, msg_id in zip(self.world.ranks, whole.msg_ids) if msg_id in outstanding])

    def tracebacks(self, failed: Outcomes) -> str:
        """Each distinct traceback once, under a line naming its ranks (the rank and its host, or the ranks' ranges
        and nodes) and the error."""
        alike = grouped({r: CELL_FILE.sub("ipykernel", o["traceback"]) for r, o in failed.items()})
        return "".join(f"---- {who([self.world.ranks[r] for r in ranks])}: {failed[ranks[0]]['ename']} ----\n"
                       f"{failed[ranks[0]]['traceback']}"
                       for ranks, _ in alike)

    def where_stuck(self, timeout: float = 60) -> str:
        """The ranks' grouped stacks for an error message, or why there are none."""
        try:
            return rank_stacks.render(self.world.stacks(timeout=timeout))
        except HPCAIError as err:
            return f"(no stacks: {err.message})"


@dataclass
class InitWatch:
    """While a cell's ranks initialise ``framework`` (the cell's ``whole`` request): past calls.SLOW_INIT, say once
    which ranks it waits for and where each is; once some ranks failed and the others have not ended within
    FAILED_INIT_GRACE, stop the world (they wait for those in the framework's collective start)."""

    cell: Cell
    whole: Any
    framework: str
    started: float = field(default_factory=time.monotonic)
    said_slow: bool = False
    failed_at: float | None = None  # when a rank's failure was first seen

    def check(self, streamer: Streamer) -> None:
        now = time.monotonic()
        if not self.said_slow and now - self.started > calls.SLOW_INIT:
            self.said_slow = True
            if notice := self._slow():
                self.cell.write(notice)
        failed = _setup_failures(self.whole)
        if not failed:
            return
        self.failed_at = self.failed_at or now
        if now - self.failed_at > FAILED_INIT_GRACE:
            streamer.feed(_texts(self.whole), final=True)
            self.cell.lost()
            raise HPCAIError(f"initialising {self.framework} failed on some ranks while the others waited for them "
                             f"in its start, so the engines were stopped:\n{self.cell.tracebacks(failed)}",
                             "fix the cause above, then %hpc restart")

    def _slow(self) -> str:
        """The notice: the ranks not done and where each is (read within STACKS_WITHIN, the watch waiting); empty
        if every rank is done by now."""
        waiting = self.cell.still_running(self.whole)
        if not waiting:
            return ""
        return (f"hpcai: initialising {self.framework} has taken over {calls.SLOW_INIT:g} s; not done yet: {waiting}. "
                f"Where each rank is:\n{self.cell.where_stuck(STACKS_WITHIN)}\nStill waiting: interrupt the cell to "
                "stop, then %hpc restart to start the ranks again\n")


def _setup_failures(whole: Any) -> Outcomes:
    """The ranks whose part of ``whole`` has ended with its setup (the framework's initialisation) failed."""
    ended = {rank: child.result() for rank, child in enumerate(whole._children)
             if child.done() and child.exception() is None}
    return {rank: o for rank, o in ended.items() if isinstance(o, dict) and o.get("setup")}


def _texts(whole: Any) -> Streams:
    """Each rank's stdout and stderr so far, by rank, from the AsyncResult's raw metadata (its ``stdout``
    attribute parses the metadata's dates with dateutil first: about 3 ms a cell on 4 ranks)."""
    return {rank: (md.get("stdout") or "", md.get("stderr") or "") for rank, md in enumerate(whole._metadata)}
