"""What a cell run on the ranks shows the user: each rank's output as prefixed lines (three modes: ``auto``, the
default, collapses above COLLAPSE_ABOVE ranks), failures grouped by identical traceback, and the error that carries
every rank's outcome. cells.py runs the cell."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import HPCAIError
from ..ranks.identity import rank_ranges

OUTPUT_MODES = ("auto", "all", "rank0", "collapse")
HOLD = 1.0  # seconds collapse holds a rank's line back, waiting for the other ranks' next lines
LINES_PER_RANK = 2000  # a cell shows at most this many lines of each rank; %hpc output RANK prints the rest
COLLAPSE_ABOVE = 8  # ranks: ``auto`` shows every rank's lines up to this world, and collapses above it
Write = Callable[[str], None]


def resolved(mode: str, ranks: int) -> str:
    """The mode a cell of ``ranks`` ranks shows its output in (``auto``: all, or collapse above COLLAPSE_ABOVE)."""
    if mode != "auto":
        return mode
    return "collapse" if ranks > COLLAPSE_ABOVE else "all"


def grouped(values: Mapping[int, str]) -> list[tuple[list[int], str]]:
    """The ranks with identical ``values``, each group once, in the order of its first rank."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(values):
        groups.setdefault(values[rank], []).append(rank)
    return [(ranks, value) for value, ranks in groups.items()]


class RankFailure(HPCAIError):
    """Some ranks failed; ``outcomes`` holds what each rank returned."""

    def __init__(self, message: str, hint: str, outcomes: dict[int, dict[str, Any]] | None = None) -> None:
        super().__init__(message, hint)
        self.outcomes = outcomes or {}


Streams = dict[int, tuple[str, str]]  # each rank's stdout and stderr so far, by rank


@dataclass
class Streamer:
    """Turns each rank's growing stdout and stderr into prefixed lines, in one of OUTPUT_MODES. The two streams are
    read apart (each keeps its own unfinished line), so a line of one never splits a line of the other."""

    ranks: list[Any]  # running_set.Rank: host by rank
    mode: str
    write: Write
    _seen: dict[tuple[int, int], int] = field(default_factory=dict)  # (rank, stream): characters already read
    _partial: dict[tuple[int, int], str] = field(default_factory=dict)  # (rank, stream): its unfinished line
    _pending: dict[int, list[str]] = field(default_factory=dict)
    _held_since: float | None = None  # collapse: when the oldest line it holds back came
    limit: int = LINES_PER_RANK
    _shown: dict[int, int] = field(default_factory=dict)  # lines shown of each rank (a collapsed line: for each)
    _unshown: dict[int, int] = field(default_factory=dict)  # lines past the limit, by rank

    def __post_init__(self) -> None:
        self.mode = resolved(self.mode, len(self.ranks))

    def prefix(self, rank: int) -> str:
        return f"[rank {rank} {self.ranks[rank].host}] "

    def group_prefix(self, ranks: list[int]) -> str:
        if len(ranks) == 1:
            return self.prefix(ranks[0])
        return f"[all {len(ranks)} ranks] " if len(ranks) == len(self.ranks) else f"[ranks {rank_ranges(ranks)}] "

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
            while all(everyone):  # every rank has a next line: one line per distinct text, with its ranks
                heads = {r.rank: lines.pop(0) for r, lines in zip(self.ranks, everyone)}
                out += self._bounded(grouped(heads))
            held = any(everyone)
            self._held_since = (self._held_since or time.monotonic()) if held else None
            if held and (final or time.monotonic() - self._held_since > HOLD):  # the others print less (rank 0's own)
                while any(everyone):
                    heads = {r.rank: lines.pop(0) for r, lines in zip(self.ranks, everyone) if lines}
                    out += self._bounded(grouped(heads))
                self._held_since = None
        if self.mode != "collapse" or final:  # collapse holds lines back (HOLD at most) for the others to catch up
            for rank in sorted(self._pending):
                if self.mode != "rank0" or rank == 0:
                    out += self._bounded([([rank], line) for line in self._pending[rank]])
                self._pending[rank] = []
        if final and self._unshown:
            out += [f"{self.group_prefix(ranks)}{count} more lines not shown (each rank shows {self.limit} at most): "
                    f"%hpc output RANK prints a rank's whole output"
                    for ranks, count in grouped({rank: str(n) for rank, n in self._unshown.items()})]
            self._unshown = {}
        if out:
            self.write("".join(line + "\n" for line in out))

    def _bounded(self, lines: list[tuple[list[int], str]]) -> list[str]:
        """The prefixed lines whose ranks are all within the limit; the others counted for the closing note."""
        shown = []
        for ranks, line in lines:
            if all(self._shown.get(rank, 0) < self.limit for rank in ranks):
                shown.append(self.group_prefix(ranks) + line)
                for rank in ranks:
                    self._shown[rank] = self._shown.get(rank, 0) + 1
            else:
                for rank in ranks:
                    self._unshown[rank] = self._unshown.get(rank, 0) + 1
        return shown


def to_stdout(text: str) -> None:
    """The ``Write`` when none is given: the kernel's stdout (the cell's output), flushed at once."""
    sys.stdout.write(text)
    sys.stdout.flush()
