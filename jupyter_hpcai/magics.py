"""`%hpc`, and a rank magic per framework (`%%horovod_run`, `%%torchrun`: frameworks.FRAMEWORKS) with its line form:
argument parsing and display over the engines API."""

from __future__ import annotations

import argparse
import functools
import html
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class

from . import engines as engines_api
from . import guard, hub_client
from .engines import own_job, warm
from .engines.output import COLLAPSE_ABOVE
from .ranks import telemetry
from .ranks.identity import rank_ranges
from .ranks.framework import Framework
from .ranks.frameworks import FRAMEWORKS
from .errors import HPCAIError
from .magic_args import HelpShown, hpc_parser, parse, run_parser


@magics_class
class HPCMagics(Magics):  # type: ignore[misc]
    """The notebook's view of the engines."""

    @line_magic
    def hpc(self, line: str) -> Any:
        """%hpc start [-n N] [--nodes K] [--gpus-per-node G] [--launcher srun|mpirun|local|local-mpi] [--framework F]
        [--telemetry S] [--time T --partition P --account A: outside a job, an allocation of its own]
        | attach [CLUSTER_ID] | stop | restart | status | top [--for S] [--straggler SHARE] [--node N | --ranks]
        | output RANK | telemetry S | stacks [--native]
        | checkpoint [PATH] | restore [PATH] | extend DURATION | continue | export [--cells TAG] [--out-dir D]
        | grow --nodes K [--wait] | shrink --nodes K | --ranks R,R | --node NAME | panel"""
        try:
            args = parse(hpc_parser(), line)
        except HelpShown:
            return None
        return SUBCOMMANDS[args.command](engines_api.current(), args)

    def on_ranks(self, framework: str, line: str, cell: str | None = None) -> Any:
        """A rank magic of ``framework`` (frameworks.FRAMEWORKS: its magic's name): the cell, or with no cell the
        script the line names, on every rank."""
        name = FRAMEWORKS[framework].magic
        try:
            args = parse(run_parser(f"%{name}" if cell is None else f"%%{name}", script=cell is None), line)
        except HelpShown:
            return None
        first_line = 2  # a cell magic's body starts on the cell's second line
        if cell is None:
            cell, first_line = _script_cell(args.script, args.args), 1
        engines = engines_api.current()
        if args.n is not None and (not engines.running or len(engines.ranks) != args.n):
            engines.start(n=args.n, framework=framework)
        push = {}
        for var in filter(None, (n.strip() for n in args.push.split(","))):
            if var not in self.shell.user_ns:
                raise HPCAIError(f"--push {var}: no such variable in the notebook", "define it first, or fix the name")
            push[var] = self.shell.user_ns[var]
        values = engines.run(cell, framework=framework, timeout=args.timeout, output=args.output, push=push,
                             first_line=first_line, elastic=args.elastic)
        if args.var:
            self.shell.user_ns[args.var] = [values[r] for r in sorted(values)]
            return None
        return values[0]


def _own_request(args: argparse.Namespace, engines: engines_api.Engines) -> own_job.Request | None:
    """What ``%hpc start`` asks Slurm for: outside any job, --nodes, --time, --partition or --account ask for an
    allocation of the kernel's own (one rank per GPU; GPUs per node from -n, else 1), for --time."""
    outside = engines.allocation is None and args.launcher in (None, "srun")
    if not (args.time or args.partition or args.account or (outside and args.nodes)):
        return None
    if not args.time:
        raise HPCAIError("outside a Slurm job, %hpc start --nodes asks Slurm for an allocation of this kernel's own, "
                         "and a job that holds GPU nodes says for how long",
                         "add --time (30m, 2h or HH:MM:SS); for engines on this machine leave out --nodes")
    nodes = args.nodes or 1
    per_node = args.gpus_per_node or (-(-args.n // nodes) if args.n else 1)
    return own_job.Request(nodes, per_node, args.time, args.partition, args.account)


def _print_pending(info: dict[str, str]) -> None:
    """One line per change while Slurm has not started the kernel's job."""
    print(f"Slurm job {info['JobId']}: {info['JobState'].lower()} {own_job.waiting(info)}", flush=True)


Engines = engines_api.Engines


def _start(engines: Engines, args: argparse.Namespace) -> None:
    if engines.started_in_background and _asks_the_default(args):  # they are starting, or running: no second start
        engines.await_background(write=_print_now)
        if engines.running:
            print(f"{len(engines.ranks)} engines ready, started in the background ({engines.layout.launcher})"  # type: ignore[union-attr]
                  + (f"; {engines.warm} initialised on every rank" if engines.warm else "") + ":")
            _print_ranks(engines.ranks)
            return
    ask = _own_request(args, engines)
    if ask is not None:
        engines.check_request(ask, args.launcher)  # refused before anything is said or submitted
    if ask is not None and not (engines.own_job and engines.own_job.request == ask):
        print(f"asking Slurm for {ask.describe()} (released at %hpc stop or when this kernel ends)", flush=True)
    ranks = engines.start(n=args.n, nodes=args.nodes, gpus_per_node=args.gpus_per_node, launcher=args.launcher,
                          framework=None if args.framework == "none" else args.framework,
                          telemetry_interval=args.telemetry, ask=ask, pending=_print_pending)
    for old in engines.replaced:
        print(f"stopped {old.cluster_id} ({old.n} ranks), left running by a kernel that is gone "
              "(%hpc attach would have used it)")
    warm = f"; {engines.warm} initialising on every rank" if engines.warm else ""
    own = f" in this kernel's Slurm job {engines.own_job.job_id}" if engines.own_job else ""
    print(f"{len(ranks)} engines ready ({engines.layout.launcher}){own}{warm}:")  # type: ignore[union-attr]
    _print_ranks(ranks)


def _asks_the_default(args: argparse.Namespace) -> bool:
    """A plain ``%hpc start``: what a start in the background starts."""
    return (args.n, args.nodes, args.gpus_per_node, args.launcher, args.time, args.partition, args.account) == \
        (None,) * 7 and args.framework == "auto" and args.telemetry == telemetry.DEFAULT_INTERVAL


def _print_now(text: str) -> None:
    print(text, end="", flush=True)


def _attach(engines: Engines, args: argparse.Namespace) -> None:
    ranks = engines.attach(args.cluster_id)
    found = engines.running_set()
    ready = f"; {found.framework} initialised" if found.framework else ""
    print(f"attached to {found.cluster.cluster_id}: {len(ranks)} engines ({found.layout.launcher}){ready}, "
          "with everything defined on them:")
    _print_ranks(ranks)


def _stop(engines: Engines, args: argparse.Namespace) -> None:
    engines.await_background(write=_print_now)
    job = engines.own_job.job_id if engines.own_job else None
    engines.stop()
    print("engines stopped" + (f"; Slurm job {job} released" if job else ""))


def _status(engines: Engines, args: argparse.Namespace) -> None:
    engines.await_background(write=_print_now)
    ranks = engines.status()
    if not ranks:
        print("no engines running; start them with %hpc start")
    _print_ranks(ranks, every=args.ranks)
    world = engines.set
    if ranks and world is not None and world.resting:
        print(f"{world.resting} is at rest (idle engines cost less); the next cell that uses it wakes it")


def _stacks(engines: Engines, args: argparse.Namespace) -> None:
    from .ranks.stacks import render

    print(render(engines.stacks(native=args.native, source=args.source)))


def _telemetry(engines: Engines, args: argparse.Namespace) -> None:
    engines.set_telemetry(args.seconds)
    print(f"telemetry every {args.seconds:g} s on every rank" if args.seconds else "telemetry off")


def _extend(engines: Engines, args: argparse.Namespace) -> None:
    granted = hub_client.extend(args.duration)
    print(f"Slurm job {granted['job_id']} extended: time limit {granted['time_limit']}, ends {granted['end_time']}")


def _continue(engines: Engines, args: argparse.Namespace) -> None:
    queued = hub_client.follow_up()
    print(f"follow-up queued: server '{queued['server']}', Slurm job {queued['job_id']}, starts when job "
          f"{queued['after']} ends (the hub's home page lists it; then open {queued['url']}).\n"
          "There, %hpc start and the cells that make your model, then %hpc restore loads the last checkpoint.")


def _panel(engines: Engines, args: argparse.Namespace) -> Any:
    from .widgets import ClusterPanel

    return ClusterPanel(engines)


# %hpc's subcommands (their arguments: magic_args.hpc_parser); each returns what the cell shows, or None
SUBCOMMANDS: dict[str, Callable[[Engines, argparse.Namespace], Any]] = {
    "start": _start, "attach": _attach, "stop": _stop, "restart": lambda e, a: _print_ranks(e.restart()),
    "status": _status, "stacks": _stacks, "telemetry": _telemetry, "output": lambda e, a: _output(e, a.rank),
    "top": lambda e, a: _top(e, a.duration, a.straggler, a.node, a.ranks),
    "checkpoint": lambda e, a: print(guard.report(e.checkpoint(a.path)), end=""),
    "restore": lambda e, a: print(guard.restored(e.restore(a.path)), end=""),
    "extend": _extend, "export": lambda e, a: _export(e, a.cells, a.out_dir), "continue": _continue, "panel": _panel,
    "grow": lambda e, a: e.grow(a.nodes, wait=a.wait) and None,
    "shrink": lambda e, a: print(e.shrink(nodes=a.nodes, ranks=a.ranks, node=a.node)),
}


def _export(engines: engines_api.Engines, chosen: str, out_dir: str | None) -> None:
    """Write this notebook (as last saved) as a batch job with this job's layout, and print the sbatch script."""
    from pathlib import Path

    from . import export

    notebook = os.environ.get("JPY_SESSION_NAME", "")
    if not notebook.endswith(".ipynb") or not os.path.isfile(notebook):
        raise HPCAIError("this kernel does not know its notebook's file (JPY_SESSION_NAME)",
                         "run it from a terminal: hpcai job from-notebook NOTEBOOK.ipynb")
    spec = export.spec_for(Path(notebook), chosen, **export.job_layout(engines.allocation, engines.layout))
    sbatch, script = export.write(spec, Path(out_dir).expanduser() if out_dir else None)
    print(sbatch.read_text())
    print(f"wrote {sbatch} and {script} (from the notebook as last saved); submit with: sbatch {sbatch}")


def _script_cell(script: str, args: list[str]) -> str:
    """A cell that runs ``script`` as __main__ with ``args`` on a rank (the path must exist on every node)."""
    path = os.path.abspath(os.path.expanduser(script))
    if not os.path.isfile(path):
        raise HPCAIError(f"no such script: {script}", "give the path of a Python file on a filesystem every node sees")
    return f"import runpy, sys\nsys.argv = {[path, *args]!r}\nrunpy.run_path({path!r}, run_name='__main__')"


class _TopTable:
    """%hpc top's table, as HTML for the notebook and as text elsewhere."""

    def __init__(self, engines: engines_api.Engines, ratio: float | None, node: str | None = None,
                 every_rank: bool = False) -> None:
        samples = engines.samples()
        if node is not None:
            samples = [s for s in samples if s.host == node]
        by_node = node is None and not every_rank and len(samples) > COLLAPSE_ABOVE
        self.columns = telemetry.NODE_COLUMNS if by_node else telemetry.COLUMNS
        self.rows = (telemetry.node_rows if by_node else telemetry.rows)(samples, ratio)
        if not engines.running:
            self.empty = "no engines running; start them with %hpc start"
        elif not engines.telemetry_interval:
            self.empty = "telemetry is off for these engines; %hpc start --telemetry 2 turns it on"
        else:
            self.empty = f"no samples yet: the first arrive within {engines.telemetry_interval:g} s"

    def __repr__(self) -> str:
        if not self.rows:
            return self.empty
        widths = [max(len(c), *(len(r[i]) for r in self.rows)) for i, c in enumerate(self.columns)]
        return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip()
                         for row in [self.columns, *self.rows])

    def _repr_html_(self) -> str:
        if not self.rows:
            return f"<i>{html.escape(self.empty)}</i>"
        head = "".join(f"<th>{c}</th>" for c in self.columns)
        body = "".join("<tr{}>{}</tr>".format(' class="hpcai-straggler" style="color:#b00020"'
                                              if telemetry.alarming(r[-1]) else "",
                                              "".join(f"<td>{html.escape(v)}</td>" for v in r)) for r in self.rows)
        return f'<table class="hpcai-top"><tr>{head}</tr>{body}</table>'


def _top(engines: engines_api.Engines, duration: float, ratio: float | None, node: str | None = None,
         every_rank: bool = False) -> None:
    """Show the table, then update it in place every sampling interval for ``duration`` s, until these
    engines stop (a thread: the notebook stays free for other cells)."""
    from IPython.display import display

    if node is not None and node not in {r.host for r in engines.ranks}:
        raise HPCAIError(f"no rank runs on node '{node}'", "name one of the nodes %hpc top lists")
    table = functools.partial(_TopTable, engines, ratio, node, every_rank)
    handle = display(table(), display_id=True)
    watched, every = engines.set, engines.telemetry_interval
    if watched is None or not every:
        return
    stopped = threading.Event()

    def follow() -> None:
        deadline = time.monotonic() + duration
        while not stopped.wait(every) and time.monotonic() < deadline:
            if engines.set is not watched:  # stopped or restarted: a last update says so
                stopped.set()
            handle.update(table())

    threading.Thread(target=follow, name="hpcai-top", daemon=True).start()


def _output(engines: engines_api.Engines, rank: int) -> None:
    """Print rank ``rank``'s whole stdout and stderr in the last cell run on the ranks."""
    texts, hosts = engines.last_output
    if rank not in texts:
        raise HPCAIError(f"no output of rank {rank} from the last cell" if texts else "no cell has run on the ranks",
                         f"name a rank of the last cell: 0-{len(texts) - 1}" if texts else "run a rank cell first")
    stdout, stderr = texts[rank]
    lines_out, lines_err = stdout.count("\n"), stderr.count("\n")
    print(f"rank {rank} on {hosts[rank]}, the last cell: {lines_out} lines on stdout, {lines_err} on stderr")
    print(stdout, end="" if stdout.endswith("\n") or not stdout else "\n")
    if stderr:
        print(stderr, end="", file=sys.stderr)


def _print_ranks(ranks: list[engines_api.Rank], every: bool = False) -> None:
    """Each rank (host, GPU, pid, job, alive); above COLLAPSE_ABOVE ranks, unless ``every``, a row per node."""
    if ranks and not every and len(ranks) > COLLAPSE_ABOVE:
        _print_nodes(ranks)
        return
    if ranks:
        print(f"  {'rank':>4}  {'host':<12} {'gpu':<4} {'pid':>8}  {'job':<8}  alive")
    for r in ranks:
        print(f"  {r.rank:>4}  {r.host:<12} {r.gpu or '-':<4} {r.pid:>8}  {r.job or '-':<8}  "
              f"{'yes' if r.alive else 'NO (dead)'}")


def _print_nodes(ranks: list[engines_api.Rank]) -> None:
    nodes: dict[str, list[engines_api.Rank]] = {}
    for r in ranks:
        nodes.setdefault(r.host, []).append(r)
    print(f"  {'node':<12} {'ranks':<10} {'gpus':<8} {'job':<8}  alive")
    for host, here in nodes.items():
        gpus = [r.gpu for r in here if r.gpu]
        dead = [r.rank for r in here if not r.alive]
        print(f"  {host:<12} {rank_ranges(r.rank for r in here):<10} "
              f"{rank_ranges(map(int, gpus)) if gpus and all(g.isdigit() for g in gpus) else '-':<8} "
              f"{','.join(dict.fromkeys(r.job or '-' for r in here)):<8}  {len(here) - len(dead)}/{len(here)}"
              + (f" (dead: ranks {rank_ranges(dead)})" if dead else ""))
    print(f"  ({len(ranks)} ranks on {len(nodes)} nodes, a row per node; %hpc status --ranks lists each rank)")


_guard: guard.WalltimeGuard | None = None


def rank_magic_help(framework: Framework) -> str:
    """A rank magic's help: its options, and what its cells find ready on every rank."""
    return (f"%%{framework.magic} [-n N] [--timeout S] [--output auto|all|rank0|collapse] [--push NAMES] [-o VAR] "
            f"[--elastic MIN] ({framework.title}: {', '.join(framework.names)}), or %{framework.magic} [options] "
            "SCRIPT [ARGS...]")


def _rank_magic(magics: HPCMagics, framework: str) -> Callable[..., Any]:
    def magic(line: str, cell: str | None = None) -> Any:
        return magics.on_ranks(framework, line, cell)

    magic.__doc__ = rank_magic_help(FRAMEWORKS[framework])
    return magic


def load(ipython: Any) -> None:
    """The magics, the walltime guard, and the engines the job starts for its first kernel (warm.py; once per
    kernel)."""
    global _guard
    magics = HPCMagics(ipython)
    ipython.register_magics(magics)
    for name, framework in FRAMEWORKS.items():  # one rank magic per framework, named in its registry
        ipython.register_magic_function(_rank_magic(magics, name), "line_cell", framework.magic)
    if _guard is None:
        _guard = guard.WalltimeGuard(ipython, engines_api.current)
        _guard.start()
        warm.start_with_kernel(engines_api.current())
