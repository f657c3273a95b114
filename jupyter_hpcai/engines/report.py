"""What a launcher said when its ranks died, cut down to the part that names the cause; and, to read it, all it
printed and whether its process has ended.

A dying MPI world prints the same explanation once per rank, interleaved line by line, among routine
logs. Read per rank (srun's ``--label``, which the local launcher copies, and mpirun's ``--tag-output`` say which
rank wrote each line), an explanation is a block: Open MPI's help messages between dashed rules, its ``***``
abort banner, or a Python traceback; any other line stands alone. Blocks are kept whole and shown once, with the
ranks that printed them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Routine lines: ipyparallel's logs short of errors, TensorFlow's start-up notices.
ROUTINE = re.compile(r"\[(IPEngine|KernelNanny)[.\d]*\] (?!ERROR|CRITICAL)|: I tensorflow/|^To enable the following")
_LABEL = re.compile(r"^(?:(\d+): |\[\d+,(\d+)\]<std(?:out|err)>:)")  # srun --label, mpirun --tag-output
_RULE = re.compile(r"^-{20,}$")
_ERRORISH = re.compile(r"error|abort|fail|not found|cannot|unable|denied|killed|exception|traceback", re.I)


@dataclass
class _Block:
    lines: list[str]
    ranks: list[str] = field(default_factory=list)

    @property
    def important(self) -> bool:
        return any(_ERRORISH.search(line) for line in self.lines)

    def render(self) -> str:
        who = f"[rank{'s' * (len(self.ranks) > 1)} {','.join(self.ranks)}]" if self.ranks else ""
        if len(self.lines) == 1:
            return f"{who} {self.lines[0]}".strip()
        return "\n".join([who, *self.lines] if who else self.lines)


def _split(lines: list[str]) -> list[list[str]]:
    """One rank's lines as blocks: dashed help messages, ``***`` banners and tracebacks whole, others alone."""
    blocks, i = [], 0
    while i < len(lines):
        end = i + 1
        if _RULE.match(lines[i]):  # up to and including the closing rule
            while end < len(lines) and not _RULE.match(lines[end]):
                end += 1
            end += 1
        elif lines[i].startswith("***"):
            while end < len(lines) and lines[end].startswith("***"):
                end += 1
        elif lines[i].startswith("Traceback (most recent call last)"):  # indented frames, then the exception
            while end < len(lines) and lines[end].startswith((" ", "\t")):
                end += 1
            end += 1
        blocks.append(lines[i:end])
        i = end
    return blocks


def launcher_said(output: str, limit: int = 80) -> str:
    """The cause-naming part of a launcher's output: whole blocks, once each, at most about ``limit`` lines
    (when it is longer, routine blocks go first, then the latest long ones; single lines such as srun's go last)."""
    by_rank: dict[str, list[str]] = {}
    for raw in output.splitlines():
        label = _LABEL.match(raw)
        line = (raw[label.end():] if label else raw).rstrip()
        if not ROUTINE.search(line):
            by_rank.setdefault(label.group(1) or label.group(2) if label else "", []).append(line)
    blocks: dict[str, _Block] = {}
    for rank, lines in by_rank.items():
        for block_lines in _split(lines):
            if not any(line.strip() for line in block_lines):
                continue  # blank lines between blocks (inside one they stay)
            block = blocks.setdefault("\n".join(block_lines), _Block(block_lines))
            if rank:
                block.ranks.append(rank)
    shown = list(blocks.values())
    total = sum(len(b.lines) for b in shown)
    for block in sorted(reversed(shown), key=lambda b: (b.important, len(b.lines) == 1)):
        if total <= limit:
            break
        shown.remove(block)
        total -= len(block.lines)
    return "\n".join(b.render() for b in shown)


def exited(launcher: Any) -> bool:
    """Whether a launcher's process has ended (a zombie has). Asks the process: ipyparallel moves ``state`` to
    'after' from its event loop, which runs only during its own calls."""
    try:
        return launcher.process.status() == "zombie" or launcher.poll() is not None
    except Exception:  # psutil.NoSuchProcess: already reaped
        return True


def printed(launcher: Any) -> str:
    """All a launcher printed so far (its ``get_output`` caches the first read, so read the file while there)."""
    try:
        return Path(launcher.output_file).read_text(errors="replace")
    except (OSError, TypeError):
        return launcher.get_output(remove=False) or ""
