"""Every rank's Python stack, grouped: where a hung collective waits, and which rank is elsewhere.

py-spy reads a process's stack from outside (ptrace), so this works while a rank is blocked inside C (an MPI,
Gloo or NCCL collective) and its engine cannot answer a request. The kernel runs this module once on every
node of the ranks (``python -m jupyter_hpcai.ranks.stacks PID,...``, through the launcher's way onto the
nodes); each copy dumps the ranks that run on its node and prints them as JSON. Where py-spy cannot attach
(ptrace forbidden on the node, the ranks in a container), each rank's own thread takes its stack instead
(selfstacks.py), and the report says which did. Identical stacks are shown once, with the ranks that share them,
cut at the notebook cell and numbered as the cell shows its lines.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HPCAIError
from ..proc import run
from . import selfstacks
from .identity import host_name

CELL_FILE = re.compile(r"ipykernel_\d+/\d+\.py$")  # where IPython compiles a cell (ipykernel's compiler)
PTRACE_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")
SOURCE_VAR = "HPCAI_STACKS"
SOURCES = ("auto", "py-spy", "self")  # py-spy, and the ranks' own threads where it cannot attach; one of them only
CANNOT_ATTACH = re.compile(r"ptrace|permission denied|operation not permitted|not installed|container", re.I)


@dataclass(frozen=True)
class Frame:
    name: str
    file: str
    line: int

    @property
    def in_cell(self) -> bool:
        return bool(CELL_FILE.search(self.file))

    @property
    def place(self) -> tuple[str, str, int]:
        """Where it stands, the same on every rank (each rank's kernel names its cell files after its pid)."""
        return self.name, "<cell>" if self.in_cell else self.file, self.line

    def render(self) -> str:
        if self.in_cell:
            return f"{self.name} (cell line {self.line})"
        return f"{self.name} ({self.file.rsplit('site-packages/', 1)[-1]}:{self.line})"


@dataclass(frozen=True)
class StackGroup:
    """Ranks whose main threads stand at the same place (innermost frame first), or share one error."""

    ranks: tuple[int, ...]
    frames: tuple[Frame, ...]
    error: str = ""
    own: tuple[int, ...] = ()  # its ranks whose own thread took their stack (the others': py-spy)

    def headline(self, world: int) -> str:
        who = f"rank{'s' * (len(self.ranks) > 1)} {','.join(map(str, self.ranks))} ({len(self.ranks)} of {world})"
        if self.error:
            return f"{who}: no stack: {self.error}"
        cell = next((f for f in reversed(self.frames) if f.in_cell), None)  # the cell's own line, outermost
        if cell is None:
            return f"{who}: idle (no cell running)" if self.frames else f"{who}: no Python frames"
        inner = self.frames[0]
        return f"{who}: at cell line {cell.line}" if inner is cell else f"{who}: in {inner.name}, from cell line {cell.line}"

    def render(self, world: int) -> str:
        return "\n".join([self.headline(world), *(f"    {f.render()}" for f in self.frames)])


def main_thread(dump: list[dict[str, Any]], pid: int) -> tuple[Frame, ...]:
    """The frames of the thread that runs the cells (the process's main thread) in py-spy's dump, cut."""
    thread = next((t for t in dump if t.get("os_thread_id") == pid or t.get("thread_name") == "MainThread"), None)
    if thread is None:
        return ()
    return cut(tuple(Frame(f["name"], f["filename"], int(f["line"])) for f in thread["frames"]))


def cut(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """Frames (innermost first) cut at the outermost cell frame: what is below it (the engine's own machinery) is
    the same on every rank. A rank running no cell keeps its innermost three frames."""
    cells = [i for i, f in enumerate(frames) if f.in_cell]
    return frames[:cells[-1] + 1] if cells else frames[:3]


def group(stacks: dict[int, tuple[Frame, ...] | str], own: frozenset[int] = frozenset()) -> list[StackGroup]:
    """Ranks with identical stacks (or the same error) together, whoever read them (``own``: the ranks whose own
    thread did); the largest group first."""
    found: dict[tuple[tuple[tuple[str, str, int], ...], str], tuple[tuple[Frame, ...], list[int]]] = {}
    for rank, stack in sorted(stacks.items()):
        frames = () if isinstance(stack, str) else stack
        key = (tuple(f.place for f in frames), stack if isinstance(stack, str) else "")
        found.setdefault(key, (frames, []))[1].append(rank)
    groups = [StackGroup(tuple(ranks), frames, error, tuple(r for r in ranks if r in own))
              for (_, error), (frames, ranks) in found.items()]
    return sorted(groups, key=lambda g: (-len(g.ranks), g.ranks))


def source(container: bool, asked: str | None = None, native: bool = False,
           environ: Mapping[str, str] = os.environ) -> str:
    """Where the stacks come from: ``asked``, else ``HPCAI_STACKS``, else auto; in a ``container``, whose ranks the
    host's py-spy cannot follow, self. The error that says what is allowed."""
    chosen = asked or environ.get(SOURCE_VAR) or "auto"
    if chosen not in SOURCES:
        raise HPCAIError(f"{chosen!r} is not a source of stacks", f"use one of: {', '.join(SOURCES)}")
    if container and chosen == "py-spy":
        raise HPCAIError("the ranks run in a container, where the host's py-spy cannot follow them",
                         "use auto or self: each rank's own thread takes its stack")
    chosen = "self" if container else chosen
    if native and chosen == "self":
        raise HPCAIError("--native needs py-spy: a rank's own thread sees its Python frames only",
                         "leave out --native" + ("" if container else ", or use --source auto or py-spy"))
    return chosen


def collect(ranks: list[tuple[int, str, int]], on_nodes: Callable[[list[str]], list[str]], folder: Path,
            native: bool = False, timeout: float = 60, source: str = "auto") -> list[StackGroup]:
    """The stacks of ``ranks`` (rank, host, pid), grouped. py-spy: this module runs once on every host, started by
    ``on_nodes(hosts)`` (the launcher's way onto the ranks' nodes: a srun step inside the job, nothing outside).
    Each rank's own thread (selfstacks.py, through the set's ``folder``): with ``source`` self, and with auto for
    the ranks py-spy could not attach to."""
    found: dict[int, tuple[Frame, ...] | str] = {}
    if source != "self":
        argv = [*on_nodes(sorted({host for _, host, _ in ranks})), sys.executable, "-m", __name__,
                ",".join(f"{host}={pid}" for _, host, pid in ranks), *(["--native"] * native)]
        spied = parse(run(argv, timeout=timeout, check=False).stdout)
        found = {rank: spied.get(pid, f"no answer from {host}") for rank, host, pid in ranks}
    unread = [r for r in ranks if source == "self" or (source == "auto" and _cannot_attach(found[r[0]]))]
    own = selfstacks.ask(folder, unread) if unread else {}
    for rank, answer in own.items():
        if not isinstance(answer, str):
            found[rank] = cut(tuple(Frame(*frame) for frame in answer))
        else:  # neither could read it: both say why (py-spy's advice on ptrace included)
            found[rank] = f"{answer}; py-spy: {found[rank]}" if rank in found else answer
    return group(found, frozenset(r for r, answer in own.items() if not isinstance(answer, str)))


def _cannot_attach(stack: tuple[Frame, ...] | str) -> bool:
    """Whether py-spy's answer for a rank is that it could not attach (ptrace refused, py-spy missing)."""
    return isinstance(stack, str) and bool(CANNOT_ATTACH.search(stack))


def render(groups: list[StackGroup]) -> str:
    """The groups, then a line that says who read the stacks."""
    world = sum(len(g.ranks) for g in groups)
    return "\n".join([*(g.render(world) for g in groups), who_read(groups)]) if groups else ""


def who_read(groups: list[StackGroup]) -> str:
    """``(stacks read by py-spy ...)``, ``(stacks taken by each rank's own thread)``, or which ranks each."""
    own = sorted(r for g in groups for r in g.own)
    if not own:
        return "(stacks read by py-spy from outside the ranks)"
    if len(own) == sum(len(g.ranks) for g in groups):
        return "(stacks taken by each rank's own thread)"
    return f"(stacks read by py-spy; ranks {','.join(map(str, own))} by their own threads: py-spy could not attach)"


def _py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"  # the env's, installed with jupyter-hpcai
    return str(beside) if beside.exists() else shutil.which("py-spy")


TRACED = "the ranks may run under another tracer: udocker's P modes (proot) trace them; use a container mode F or R"


def _ptrace_hint() -> str:
    try:
        scope = int(PTRACE_SCOPE.read_text())
    except (OSError, ValueError):
        return TRACED
    if scope == 0:
        return TRACED
    # never a capability for py-spy: with CAP_SYS_PTRACE every user could read every process, the hub's included
    return (f"kernel.yama.ptrace_scope is {scope} on this node, and py-spy reads a rank (not a child of its own) only "
            "where it is 0: ask the admins for 0 (sysctl -w kernel.yama.ptrace_scope=0, kept in /etc/sysctl.d/)")


def dump(pid: int, native: bool = False, timeout: float = 30) -> tuple[Frame, ...] | str:
    """One process's main-thread stack, or why it could not be read."""
    py_spy = _py_spy()
    if py_spy is None:
        return "py-spy is not installed in this env (it comes with jupyter-hpcai: pip install py-spy)"
    try:
        done = subprocess.run([py_spy, "dump", "--json", "--pid", str(pid), *(["--native"] * native)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"py-spy took more than {timeout:g} s"
    if done.returncode != 0:  # its error and causes, without the Rust backtrace that RUST_BACKTRACE adds
        said = (done.stderr or done.stdout).split("Stack backtrace:")[0]
        reason = "; ".join(line.strip() for line in said.splitlines() if line.strip()) or f"py-spy exited with {done.returncode}"
        if re.search(r"permission denied|operation not permitted|ptrace", done.stderr, re.I):
            reason += f"; {_ptrace_hint()}"
        return reason
    return main_thread(json.loads(done.stdout), pid)


def main(argv: list[str] | None = None) -> None:
    """On a node: ``python -m jupyter_hpcai.ranks.stacks HOST=PID,HOST=PID,... [--native]``: the stacks of the
    processes of this host, as one JSON line {pid: frames or error}. By host, not by what /proc shows: the nodes
    of a machine may share one pid namespace, and two py-spy cannot stop one process at once."""
    args = argv if argv is not None else sys.argv[1:]
    native = "--native" in args
    pairs = [item.rpartition("=") for item in args[0].split(",") if item] if args else []
    pids = [int(pid) for host, _, pid in pairs if host == host_name(os.environ)]
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(pids)))) as pool:  # a node's ranks at once
        stacks = list(pool.map(lambda pid: dump(pid, native), pids))
    found = {pid: stack if isinstance(stack, str) else [[f.name, f.file, f.line] for f in stack]
             for pid, stack in zip(pids, stacks)}
    print(json.dumps(found), flush=True)


def parse(output: str) -> dict[int, tuple[Frame, ...] | str]:
    """The JSON lines every node printed, merged (pid -> frames or error)."""
    merged: dict[int, tuple[Frame, ...] | str] = {}
    for line in output.splitlines():
        if line.startswith("{"):
            for pid, stack in json.loads(line).items():
                merged[int(pid)] = stack if isinstance(stack, str) else tuple(Frame(*f) for f in stack)
    return merged


if __name__ == "__main__":
    main()
