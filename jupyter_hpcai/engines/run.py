"""Run a cell on every rank: framework initialised once, output streamed per rank, failures reported.

Guarantees: an exception on any rank shows every failing rank with its full traceback; a rank
that dies is reported by rank and host and the rest of the world is stopped (the kernel lives on,
`%hpc restart` brings the world back); a timeout names the ranks that were stuck; Ctrl-C
interrupts every rank.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import HPCAIError
from . import rankside
from .cluster import Engines, Rank

OUTPUT_MODES = ("all", "rank0", "collapse")
Write = Callable[[str], None]


class RankFailure(HPCAIError):
    """Some ranks failed; ``outcomes`` holds what each rank returned."""

    def __init__(self, message: str, hint: str, outcomes: dict[int, dict[str, Any]] | None = None) -> None:
        super().__init__(message, hint)
        self.outcomes = outcomes or {}


@dataclass
class Streamer:
    """Turns each rank's growing stdout/stderr into prefixed lines, in one of three modes."""

    ranks: list[Rank]
    mode: str
    write: Write
    _seen: dict[int, int] = field(default_factory=dict)
    _partial: dict[int, str] = field(default_factory=dict)
    _pending: dict[int, list[str]] = field(default_factory=dict)

    def prefix(self, rank: int) -> str:
        return f"[rank {rank} {self.ranks[rank].host}] "

    def feed(self, texts: dict[int, str], final: bool = False) -> None:
        for rank, text in texts.items():
            new = self._partial.get(rank, "") + text[self._seen.get(rank, 0):]
            self._seen[rank] = len(text)
            *lines, rest = new.split("\n")
            if final and rest:
                lines, rest = [*lines, rest], ""
            self._partial[rank] = rest
            self._pending.setdefault(rank, []).extend(lines)
        self._emit(final)

    def _emit(self, final: bool) -> None:
        out: list[str] = []
        if self.mode == "collapse":
            everyone = [self._pending.setdefault(r.rank, []) for r in self.ranks]
            while all(everyone):  # every rank has a next line: fold it when all agree
                heads = [lines.pop(0) for lines in everyone]
                if len(set(heads)) == 1:
                    out.append(f"[all {len(heads)} ranks] {heads[0]}")
                else:
                    out += [self.prefix(r.rank) + h for r, h in zip(self.ranks, heads)]
        if self.mode != "collapse" or final:  # collapse holds lines back until the other ranks catch up
            for rank in sorted(self._pending):
                if self.mode != "rank0" or rank == 0:
                    out += [self.prefix(rank) + line for line in self._pending[rank]]
                self._pending[rank] = []
        if out:
            self.write("".join(line + "\n" for line in out))


def _texts(ars: dict[int, Any]) -> dict[int, str]:
    return {rank: (ar.stdout or "") + (ar.stderr or "") for rank, ar in ars.items()}


def run_on_ranks(engines: Engines, code: str, *, framework: str = "horovod", timeout: float | None = None,
                 output: str = "all", push: dict[str, Any] | None = None, write: Write | None = None) -> dict[int, Any]:
    """Run ``code`` on every rank and return each rank's value of the cell's last expression."""
    if output not in OUTPUT_MODES:
        raise HPCAIError(f"unknown output mode '{output}'", f"use one of: {', '.join(OUTPUT_MODES)}")
    write = write or (lambda text: (sys.stdout.write(text), sys.stdout.flush()))
    if not engines.running:
        engines.start()
    engines.init_framework(framework)
    if push:
        engines.view().push(push, block=True)
    assert engines.client is not None
    # One request to every rank, in rank order; split() gives each rank its part. A lone engine is addressed
    # by its id, not a list of one, or its part would hold lists.
    ids = [r.engine_id for r in engines.ranks]
    whole = engines.client[ids if len(ids) > 1 else ids[0]].apply_async(rankside.run_cell, code)
    ars = dict(zip((r.rank for r in engines.ranks), whole.split()))
    streamer = Streamer(engines.ranks, output, write)
    deadline = time.monotonic() + timeout if timeout else None
    try:
        while not whole.wait(0.1):
            streamer.feed(_texts(ars))
            if not engines.controller_alive():
                engines.stop()
                raise RankFailure("the ipyparallel controller died, so the ranks can no longer be reached; they were "
                                  "stopped and the notebook kernel is fine", "bring the world back with %hpc restart")
            dead = engines.dead()
            if dead:
                streamer.feed(_texts(ars), final=True)
                report = engines.launcher_report()
                engines.stop()
                who = ", ".join(f"rank {r.rank} on {r.host}" for r in dead)
                raise RankFailure(f"ranks died: {who}" + (f"\n{report}" if report else "")
                                  + "\nthe other ranks were stopped; the notebook kernel is fine",
                                  "bring the world back with %hpc restart, then run the cell again")
            if deadline and time.monotonic() > deadline:
                stuck = [rank for rank, ar in ars.items() if not ar.ready()]
                streamer.feed(_texts(ars), final=True)
                hosts = ", ".join(f"rank {r} on {engines.ranks[r].host}" for r in stuck)
                engines.stop()
                raise RankFailure(f"timed out after {timeout:g} s; still running: {hosts} "
                                  "(stuck, e.g. waiting in a collective for a rank that never joined). "
                                  "The engines were stopped", "bring the world back with %hpc restart")
    except KeyboardInterrupt:
        engines.client.send_signal(signal.SIGINT, targets=[r.engine_id for r in engines.ranks], block=False)
        whole.wait(10)
        streamer.feed(_texts(ars), final=True)
        raise
    whole.wait_for_output(10)  # a result can arrive before the last of its rank's output does
    streamer.feed(_texts(ars), final=True)
    outcomes = {rank: ar.get() for rank, ar in ars.items()}
    failed = {rank: o for rank, o in outcomes.items() if not o["ok"]}
    if failed:
        for rank, o in sorted(failed.items()):
            write(f"---- rank {rank} on {engines.ranks[rank].host}: {o['ename']} ----\n{o['traceback']}")
        summary = ", ".join(f"{r} ({o['ename']}: {o['evalue'][:80]})" for r, o in sorted(failed.items()))
        raise RankFailure(f"{len(failed)} of {len(outcomes)} ranks failed: {summary}",
                          "the tracebacks above show each failing rank; the engines are still running", outcomes)
    return {rank: o["value"] for rank, o in outcomes.items()}
