"""What a cell run on the ranks shows the user: each rank's output as prefixed lines (three modes), and the
error that carries every rank's outcome. cells.py runs the cell."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import HPCAIError

OUTPUT_MODES = ("all", "rank0", "collapse")
Write = Callable[[str], None]


class RankFailure(HPCAIError):
    """Some ranks failed; ``outcomes`` holds what each rank returned."""

    def __init__(self, message: str, hint: str, outcomes: dict[int, dict[str, Any]] | None = None) -> None:
        super().__init__(message, hint)
        self.outcomes = outcomes or {}


Streams = dict[int, tuple[str, str]]  # each rank's stdout and stderr so far, by rank


@dataclass
class Streamer:
    """Turns each rank's growing stdout and stderr into prefixed lines, in one of three modes. The two streams are
    read apart (each keeps its own unfinished line), so a line of one never splits a line of the other."""

    ranks: list[Any]  # running_set.Rank: host by rank
    mode: str
    write: Write
    _seen: dict[tuple[int, int], int] = field(default_factory=dict)  # (rank, stream): characters already read
    _partial: dict[tuple[int, int], str] = field(default_factory=dict)  # (rank, stream): its unfinished line
    _pending: dict[int, list[str]] = field(default_factory=dict)

    def prefix(self, rank: int) -> str:
        return f"[rank {rank} {self.ranks[rank].host}] "

    def feed(self, texts: Streams, final: bool = False) -> None:
        for rank, streams in texts.items():
            for key, text in (((rank, i), text) for i, text in enumerate(streams)):
                new = self._partial.get(key, "") + text[self._seen.get(key, 0):]
                self._seen[key] = len(text)
                *lines, rest = new.split("\n")
                if final and rest:
                    lines, rest = [*lines, rest], ""
                self._partial[key] = rest
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


def to_stdout(text: str) -> None:
    """The ``Write`` when none is given: the kernel's stdout (the cell's output), flushed at once."""
    sys.stdout.write(text)
    sys.stdout.flush()
