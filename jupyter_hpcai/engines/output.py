"""What a cell run on the ranks shows the user: each rank's output as prefixed lines (OUTPUT_MODES: ``auto``, the
default, collapses above COLLAPSE_ABOVE ranks), lines and failures grouped by identical text, and the error that
carries every rank's outcome. cells.py runs the cell."""

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
LOOK_AHEAD = 64  # lines of each rank collapse looks through for a text they all printed
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
            out += self._collapse(final)
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

    def _collapse(self, final: bool) -> list[str]:
        """Collapse's lines: a text every rank has printed shows once, after the lines some ranks printed before it
        (rank 0's own progress lines); with no text in common and a line from every rank, the ranks' next lines show
        at once, one per distinct text; lines the others may still print are held HOLD seconds at most."""
        everyone = {r.rank: self._pending.setdefault(r.rank, []) for r in self.ranks}
        out: list[str] = []
        while all(everyone.values()):
            heads = {lines[0] for lines in everyone.values()}
            common = heads if len(heads) == 1 else set.intersection(*(set(lines[:LOOK_AHEAD])
                                                                       for lines in everyone.values()))
            if not common:  # the ranks' next lines differ: each distinct text once, with its ranks
                out += self._bounded(grouped({rank: lines.pop(0) for rank, lines in everyone.items()}))
                continue
            text = min(common, key=everyone[self.ranks[0].rank].index)  # the first of them, as rank 0 printed it
            before = {rank: lines[:lines.index(text)] for rank, lines in everyone.items()}
            for rank, lines in everyone.items():
                del lines[:len(before[rank]) + 1]
            out += self._heads_until_empty(before) + self._bounded([(list(everyone), text)])
        held = any(everyone.values())
        self._held_since = (self._held_since or time.monotonic()) if held else None
        if held and (final or time.monotonic() - self._held_since > HOLD):  # the others print less (rank 0's own)
            out += self._heads_until_empty(everyone)
            self._held_since = None
        return out

    def _heads_until_empty(self, queues: dict[int, list[str]]) -> list[str]:
        """Every line of ``queues`` (emptied), a round of the ranks' next lines at a time, each distinct text once."""
        out: list[str] = []
        while any(queues.values()):
            out += self._bounded(grouped({rank: lines.pop(0) for rank, lines in queues.items() if lines}))
        return out

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
