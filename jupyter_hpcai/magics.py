"""`%hpc`, `%%horovod_run` and their line forms: argument parsing and display over the engines API."""

from __future__ import annotations

import argparse
import functools
import html
import os
import shlex
import threading
import time
from typing import Any

from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class

from . import engines as engines_api
from . import guard, hubapi
from .engines import own_job, telemetry
from .engines.frameworks import FRAMEWORKS
from .engines.launch import LAUNCHERS
from .engines.output import OUTPUT_MODES
from .errors import HPCAIError
from .slurm import parse_duration


class _Parser(argparse.ArgumentParser):
    """argparse that raises a clear HPCAIError instead of exiting the kernel."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise HPCAIError(f"{self.prog}: {message}", f"usage: {self.format_usage().strip().removeprefix('usage: ')}")

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        if message:
            raise HPCAIError(message.strip())
        raise HPCAIError(self.format_help().strip())  # --help: show it as the message


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= 7 * 24 * 3600:
        raise argparse.ArgumentTypeError(f"must be between 0 and one week, not {text}")
    return value


def _interval(text: str) -> float:
    value = float(text) if text.replace(".", "", 1).isdigit() else -1
    if not (value == 0 or 0.1 <= value <= 3600):
        raise argparse.ArgumentTypeError(f"must be 0 (off) or between 0.1 and 3600 seconds, not {text}")
    return value


def duration(text: str) -> int:
    """30m, 2h, or Slurm's time format, in seconds."""
    unit = {"m": 60, "h": 3600}.get(text[-1:].lower())
    try:
        seconds = int(text[:-1]) * unit if unit else parse_duration(text)
    except ValueError:
        seconds = None
    if not seconds or seconds < 60:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration of a minute or more (30m, 2h or HH:MM:SS)")
    return seconds


def _share(text: str) -> float:
    value = float(text) if text.replace(".", "", 1).isdigit() else -1
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be a share between 0 and 1 (e.g. 0.67), not {text}")
    return value


@functools.cache
def hpc_parser() -> _Parser:
    parser = _Parser(prog="%hpc", add_help=True)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    start = sub.add_parser("start", help="start engines (default: one per GPU on every node of the job)")
    start.add_argument("-n", type=_positive, help="number of engines")
    start.add_argument("--nodes", type=_positive)
    start.add_argument("--gpus-per-node", type=_positive)
    start.add_argument("--launcher", choices=list(LAUNCHERS))
    start.add_argument("--framework", choices=[*FRAMEWORKS, "auto", "none"], default="auto",
                       help="initialised by every rank as it starts (auto: the env's, Horovod first)")
    start.add_argument("--time", type=duration, help="outside a Slurm job: ask Slurm for an allocation of this "
                                                      "kernel's own, for this long (30m, 2h, HH:MM:SS)")
    start.add_argument("--partition", help="outside a Slurm job: the partition of this kernel's own allocation")
    start.add_argument("--account", help="outside a Slurm job: the account of this kernel's own allocation")
    for name in ("stop", "restart", "status", "panel"):
        sub.add_parser(name)
    attach = sub.add_parser("attach", help="use engines running in this job already (an earlier kernel's, or "
                                           "another notebook's), with what the ranks hold")
    attach.add_argument("cluster_id", nargs="?", help="which set (default: the only one no kernel uses, else the only one)")
    start.add_argument("--telemetry", type=_interval, default=telemetry.DEFAULT_INTERVAL, metavar="SECONDS",
                       help="seconds between the ranks' telemetry samples (0: off)")
    top = sub.add_parser("top", help="every rank's CPU, memory, GPU and training rate, updated live")
    top.add_argument("--for", dest="duration", type=_seconds, default=600, help="keep updating this many seconds")
    top.add_argument("--straggler", type=_share, metavar="SHARE",
                     help=f"flag ranks whose rate is below this share of the median rate (default: "
                          f"${telemetry.STRAGGLER_VAR}, else {telemetry.DEFAULT_STRAGGLER_SHARE})")
    sampling = sub.add_parser("telemetry", help="change how often the running ranks sample themselves")
    sampling.add_argument("seconds", type=_interval, help="seconds between samples (0: off)")
    stacks = sub.add_parser("stacks", help="every rank's Python stack, identical ones grouped (py-spy)")
    stacks.add_argument("--native", action="store_true", help="with the C frames")
    checkpoint = sub.add_parser("checkpoint", help="run the ranks' walltime hooks (hpc.on_walltime) now")
    checkpoint.add_argument("path", nargs="?", help="where hpc.Checkpoint saves go this time (default: each one's own)")
    more = sub.add_parser("extend", help="more walltime for this notebook job, within the site's policy")
    more.add_argument("duration", type=duration, help="how much more: 30m, 2h or Slurm's HH:MM:SS")
    export = sub.add_parser("export", help="this notebook's rank cells as a batch job: an sbatch and a Python script")
    export.add_argument("--cells", default="all", help="the cells with this tag, or all (default)")
    export.add_argument("--out-dir", help="where the scripts go (default: beside the notebook)")
    sub.add_parser("continue", help="queue a follow-up notebook job with these options, starting when this one ends")
    restore = sub.add_parser("restore", help="every hpc.Checkpoint on the ranks loads its latest save")
    restore.add_argument("path", nargs="?", help="the folder to load from (default: each one's own)")
    return parser


@functools.cache
def run_parser(prog: str, script: bool = False) -> _Parser:
    """Options of %%horovod_run / %%torchrun; the line forms take a script and its arguments after them."""
    parser = _Parser(prog=prog, add_help=True)
    parser.add_argument("-n", type=_positive, help="ranks (starts engines if none run)")
    parser.add_argument("--timeout", type=_seconds, help="stop the cell after this many seconds")
    parser.add_argument("--output", choices=OUTPUT_MODES, default="all")
    parser.add_argument("--push", default="", help="comma-separated notebook variables to send to every rank")
    parser.add_argument("-o", dest="var", help="store every rank's result in this variable (a list by rank)")
    if script:
        parser.add_argument("script", help="a Python file; its `if __name__ == '__main__'` block runs on every rank")
        parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    return parser


def parse(parser: _Parser, line: str) -> argparse.Namespace:
    try:
        words = shlex.split(line)
    except ValueError as err:
        raise HPCAIError(f"{parser.prog}: {err}", "check the quotes in the magic's arguments") from None
    return parser.parse_args(words)


@magics_class
class HPCMagics(Magics):  # type: ignore[misc]
    """The notebook's view of the engines."""

    @line_magic
    def hpc(self, line: str) -> Any:
        """%hpc start [-n N] [--nodes K] [--gpus-per-node G] [--launcher srun|mpirun|local] [--framework F]
        [--telemetry S] [--time T --partition P --account A: outside a job, an allocation of its own]
        | attach [CLUSTER_ID] | stop | restart | status | top [--for S] [--straggler SHARE] | telemetry S | stacks [--native]
        | checkpoint [PATH] | restore [PATH] | extend DURATION | continue | export [--cells TAG] [--out-dir D]
        | panel"""
        args = parse(hpc_parser(), line)
        engines = engines_api.current()
        if args.command == "start":
            ask = _own_request(args, engines)
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
        elif args.command == "attach":
            ranks = engines.attach(args.cluster_id)
            ready = f"; {engines.framework} initialised" if engines.framework else ""
            print(f"attached to {engines.cluster.cluster_id}: {len(ranks)} engines ({engines.layout.launcher}){ready}, "  # type: ignore[union-attr]
                  "with everything defined on them:")
            _print_ranks(ranks)
        elif args.command == "stop":
            job = engines.own_job.job_id if engines.own_job else None
            engines.stop()
            print("engines stopped" + (f"; Slurm job {job} released" if job else ""))
        elif args.command == "restart":
            _print_ranks(engines.restart())
        elif args.command == "status":
            ranks = engines.status()
            if not ranks:
                print("no engines running; start them with %hpc start")
            _print_ranks(ranks)
        elif args.command == "stacks":
            from .engines.stacks import render

            print(render(engines.stacks(native=args.native)))
        elif args.command == "telemetry":
            engines.set_telemetry(args.seconds)
            print(f"telemetry every {args.seconds:g} s on every rank" if args.seconds else "telemetry off")
        elif args.command == "top":
            _top(engines, args.duration, args.straggler)
        elif args.command == "checkpoint":
            print(guard.report(engines.checkpoint(args.path)), end="")
        elif args.command == "extend":
            granted = hubapi.extend(args.duration)
            print(f"Slurm job {granted['job_id']} extended: time limit {granted['time_limit']}, ends {granted['end_time']}")
        elif args.command == "export":
            _export(engines, args.cells, args.out_dir)
        elif args.command == "continue":
            queued = hubapi.follow_up()
            print(f"follow-up queued: server '{queued['server']}', Slurm job {queued['job_id']}, starts when job "
                  f"{queued['after']} ends (the hub's home page lists it; then open {queued['url']}).\n"
                  "There, %hpc start and the cells that make your model, then %hpc restore loads the last checkpoint.")
        elif args.command == "restore":
            print(guard.restored(engines.restore(args.path)), end="")
        elif args.command == "panel":
            from .widgets import ClusterPanel

            return ClusterPanel(engines)
        return None

    @line_cell_magic
    def horovod_run(self, line: str, cell: str | None = None) -> Any:
        """%%horovod_run [-n N] [--timeout S] [--output all|rank0|collapse] [--push NAMES] [-o VAR]
        (Horovod on TensorFlow: hvd, tf, rank, size, local_rank), or %horovod_run [options] SCRIPT [ARGS...]"""
        return self._run("horovod", "horovod_run", line, cell)

    @line_cell_magic
    def torchrun(self, line: str, cell: str | None = None) -> Any:
        """%%torchrun [options] (torch.distributed: dist, rank, world_size, local_rank, device),
        or %torchrun [options] SCRIPT [ARGS...]"""
        return self._run("torch", "torchrun", line, cell)

    def _run(self, framework: str, name: str, line: str, cell: str | None) -> Any:
        args = parse(run_parser(f"%{name}" if cell is None else f"%%{name}", script=cell is None), line)
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
                             first_line=first_line)
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
    start = info["StartTime"] or "not known yet"
    reason = info["Reason"] if info["Reason"] not in ("", "None") else "not scheduled yet"
    print(f"Slurm job {info['JobId']}: {info['JobState'].lower()} ({reason}), "
          f"expected start {start}", flush=True)


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

    def __init__(self, engines: engines_api.Engines, ratio: float | None) -> None:
        self.rows = telemetry.rows(engines.samples(), ratio)
        if not engines.running:
            self.empty = "no engines running; start them with %hpc start"
        elif not engines.telemetry_interval:
            self.empty = "telemetry is off for these engines; %hpc start --telemetry 2 turns it on"
        else:
            self.empty = f"no samples yet: the first arrive within {engines.telemetry_interval:g} s"

    def __repr__(self) -> str:
        if not self.rows:
            return self.empty
        widths = [max(len(c), *(len(r[i]) for r in self.rows)) for i, c in enumerate(telemetry.COLUMNS)]
        return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip()
                         for row in [telemetry.COLUMNS, *self.rows])

    def _repr_html_(self) -> str:
        if not self.rows:
            return f"<i>{html.escape(self.empty)}</i>"
        head = "".join(f"<th>{c}</th>" for c in telemetry.COLUMNS)
        body = "".join("<tr{}>{}</tr>".format(' class="hpcai-straggler" style="color:#b00020"' if r[-1] else "",
                                              "".join(f"<td>{html.escape(v)}</td>" for v in r)) for r in self.rows)
        return f'<table class="hpcai-top"><tr>{head}</tr>{body}</table>'


def _top(engines: engines_api.Engines, duration: float, ratio: float | None) -> None:
    """Show the table, then update it in place every sampling interval for ``duration`` s, until these
    engines stop (a thread: the notebook stays free for other cells)."""
    from IPython.display import display

    handle = display(_TopTable(engines, ratio), display_id=True)
    folder, every = engines.folder, engines.telemetry_interval
    if folder is None or not every:
        return
    stopped = threading.Event()

    def follow() -> None:
        deadline = time.monotonic() + duration
        while not stopped.wait(every) and time.monotonic() < deadline:
            if engines.folder != folder:  # stopped or restarted: a last update says so
                stopped.set()
            handle.update(_TopTable(engines, ratio))

    threading.Thread(target=follow, name="hpcai-top", daemon=True).start()


def _print_ranks(ranks: list[engines_api.Rank]) -> None:
    if ranks:
        print(f"  {'rank':>4}  {'host':<12} {'gpu':<4} {'pid':>8}  alive")
    for r in ranks:
        print(f"  {r.rank:>4}  {r.host:<12} {r.gpu or '-':<4} {r.pid:>8}  {'yes' if r.alive else 'NO (dead)'}")


_guard: guard.WalltimeGuard | None = None


def load(ipython: Any) -> None:
    """The magics, and the walltime guard (once per kernel)."""
    global _guard
    ipython.register_magics(HPCMagics)
    if _guard is None:
        _guard = guard.WalltimeGuard(ipython, engines_api.current)
        _guard.start()
