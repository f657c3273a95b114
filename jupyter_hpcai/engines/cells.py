"""A cell run on every rank of a running set (in the kernel): the framework initialised first if it is not,
one request to all ranks, watched and streamed; failures, deaths, timeouts and interrupts told by rank.
What the user sees of it is output.py."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..errors import HPCAIError
from ..ranks import calls
from ..ranks import stacks as rank_stacks
from ..ranks.frameworks import FRAMEWORKS
from .output import OUTPUT_MODES, RankFailure, Streamer, Streams, Write
from .running_set import RunningSet

CONTINUITY = "__import__('jupyter_hpcai.ranks.continuity', fromlist=['hpc'])"  # the ranks' walltime API
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


def framework_setup(world: RunningSet, name: str) -> Callable[[], Any] | None:
    """What a cell's ranks run first so that ``name`` is initialised (None once it is)."""
    if world.framework == name:
        return None
    if name not in FRAMEWORKS:
        raise HPCAIError(f"unknown framework '{name}'", f"use one of: {', '.join(FRAMEWORKS)}")
    preflight(world, name)
    framework = FRAMEWORKS[name]
    params = framework.params(world) if framework.params else {}
    return partial(calls.init_framework, framework, params)


@dataclass
class Cell:
    """One cell on every rank of ``world``. ``lost`` stops the world (a rank died, the controller died, the
    timeout passed): the kernel lives on and ``%hpc restart`` brings the world back."""

    world: RunningSet
    write: Write
    timeout: float | None
    lost: Callable[[], None]

    def run(self, code: str, framework: str | None, output: str, push: dict[str, Any] | None,
            first_line: int) -> dict[int, Any]:
        """Each rank's value of the cell's last expression; RankFailure with every traceback if some failed."""
        if output not in OUTPUT_MODES:
            raise HPCAIError(f"unknown output mode '{output}'", f"use one of: {', '.join(OUTPUT_MODES)}")
        setup = framework_setup(self.world, framework) if framework else None
        if setup is not None:  # its own request: a rank that dies in it died of the framework's init
            self._request("pass", 1, None, setup, "all", initialising=framework)
            self.world.framework = framework
        outcomes = self._request(code, first_line, push, None, output, initialising=None)
        failed = {rank: o for rank, o in outcomes.items() if not o["ok"]}
        if failed:
            self.write(self._tracebacks(failed))
            summary = ", ".join(f"{r} ({o['ename']}: {o['evalue'][:80]})" for r, o in sorted(failed.items()))
            raise RankFailure(f"{len(failed)} of {len(outcomes)} ranks failed: {summary}",
                              "the tracebacks above show each failing rank; the engines are still running", outcomes)
        return {rank: o["value"] for rank, o in outcomes.items()}

    def _request(self, code: str, first_line: int, push: dict[str, Any] | None, setup: Callable[[], Any] | None,
                 output: str, initialising: str | None) -> Outcomes:
        """One run_cell request to every rank, watched and streamed; each rank's outcome, by rank."""
        client = self.world.connected
        ids = [r.engine_id for r in self.world.ranks]
        whole = client[ids].apply_async(calls.run_cell, code, first_line, push, setup)  # one request, rank order
        streamer = Streamer(self.world.ranks, output, self.write)
        try:
            self._watch(whole, streamer, initialising)
        except KeyboardInterrupt:
            client.send_signal(signal.SIGINT, targets=ids, block=False)
            freed = whole.wait(10)
            streamer.feed(_texts(whole), final=True)
            if not freed:  # blocked in C (a collective), where SIGINT waits
                self.write(f"some ranks are still busy after the interrupt; where each rank is:\n{self._where_stuck()}"
                           "\n%hpc restart frees them\n")
            raise
        whole.wait_for_output(10)  # a result can arrive before the last of its rank's output does
        streamer.feed(_texts(whole), final=True)
        outcomes = dict(enumerate(whole.get()))
        failed = {rank: o for rank, o in outcomes.items() if o.get("setup")}
        if failed:
            raise HPCAIError(f"initialising {initialising} failed on the ranks:\n{self._tracebacks(failed)}",
                             "fix the cause above, then %hpc restart")
        return outcomes

    def _watch(self, whole: Any, streamer: Streamer, initialising: str | None) -> None:
        """Stream output until every rank is done; stop the world on a dead rank, a dead controller or the timeout.
        ``initialising``: the framework this cell initialises first (ranks that die then died of its init)."""
        world = self.world
        deadline = time.monotonic() + self.timeout if self.timeout else None
        while True:
            done = whole.wait(0.1)
            if done and whole.successful():  # run_cell returns every outcome; only a rank's death fails it
                return
            streamer.feed(_texts(whole))
            if not world.controller_alive():
                self.lost()
                raise RankFailure("the ipyparallel controller died, so the ranks can no longer be reached; they were "
                                  "stopped and the notebook kernel is fine", "bring the world back with %hpc restart")
            if dead := world.dead():
                streamer.feed(_texts(whole), final=True)
                report = world.launcher_report()
                self.lost()
                who = ", ".join(f"rank {r.rank} on {r.host}" for r in dead)
                if initialising:  # e.g. MPI_Init aborting the process, in the rank's boot or in the cell's setup
                    raise HPCAIError(f"initialising {initialising} failed on the ranks: ranks died: {who}"
                                     + (f"\nthe launcher said:\n{report}" if report else ""),
                                     "fix the cause above, then %hpc restart")
                raise RankFailure(f"ranks died: {who}" + (f"\n{report}" if report else "")
                                  + "\nthe other ranks were stopped; the notebook kernel is fine",
                                  "bring the world back with %hpc restart, then run the cell again")
            if done:
                return  # failed otherwise: get() raises it
            if deadline and time.monotonic() > deadline:
                outstanding = world.connected.outstanding
                stuck = [rank for rank, msg_id in enumerate(whole.msg_ids) if msg_id in outstanding]
                streamer.feed(_texts(whole), final=True)
                hosts = ", ".join(f"rank {r} on {world.ranks[r].host}" for r in stuck)
                where = self._where_stuck()
                self.lost()
                raise RankFailure(f"timed out after {self.timeout:g} s; still running: {hosts} "
                                  "(stuck, e.g. waiting in a collective for a rank that never joined). "
                                  f"Where each rank was:\n{where}\nThe engines were stopped",
                                  "bring the world back with %hpc restart")

    def _tracebacks(self, failed: Outcomes) -> str:
        """Each failing rank's traceback under a line naming the rank, its host and the error."""
        return "".join(f"---- rank {rank} on {self.world.ranks[rank].host}: {o['ename']} ----\n{o['traceback']}"
                       for rank, o in sorted(failed.items()))

    def _where_stuck(self) -> str:
        """The ranks' grouped stacks for an error message, or why there are none."""
        try:
            return rank_stacks.render(self.world.stacks())
        except HPCAIError as err:
            return f"(no stacks: {err.message})"


def _texts(whole: Any) -> Streams:
    """Each rank's stdout and stderr so far, by rank, from the AsyncResult's raw metadata (its ``stdout``
    attribute parses the metadata's dates with dateutil first: about 3 ms a cell on 4 ranks)."""
    return {rank: (md.get("stdout") or "", md.get("stderr") or "") for rank, md in enumerate(whole._metadata)}
