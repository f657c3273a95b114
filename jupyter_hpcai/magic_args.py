"""The magics' arguments (runs in the kernel): `%hpc`'s subcommands and `%%horovod_run` / `%%torchrun`'s options, as
argparse parsers that raise HPCAIError instead of exiting the kernel. Imported by the magics and by export (which
reads the magic lines of a notebook's cells)."""

from __future__ import annotations

import argparse
import functools
import shlex

from .engines.launch import LAUNCHERS
from .engines.output import COLLAPSE_ABOVE, LINES_PER_RANK, OUTPUT_MODES
from .errors import HPCAIError
from .ranks import telemetry
from .ranks.frameworks import FRAMEWORKS
from .ranks.stacks import SOURCES
from .scheduler.durations import parse_duration


class HelpShown(HPCAIError):
    """``--help`` was asked for, and argparse has printed it: the magics end there, quietly (an HPCAIError for any
    other caller of ``parse``)."""

    def __init__(self) -> None:
        super().__init__("the help was asked for, and printed", "leave out --help to run the command")


class _Parser(argparse.ArgumentParser):
    """argparse that raises a clear HPCAIError instead of exiting the kernel."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise HPCAIError(f"{self.prog}: {message}", f"usage: {self.format_usage().strip().removeprefix('usage: ')}")

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        if message:
            raise HPCAIError(message.strip())
        raise HelpShown


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
def _ranks(text: str) -> list[int]:
    try:
        ranks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of ranks (2,3)") from None
    if not ranks or min(ranks) < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of ranks (2,3)")
    return ranks


def hpc_parser() -> _Parser:
    parser = _Parser(prog="%hpc", add_help=True)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    start = sub.add_parser("start", help="start engines (default: one per GPU on every node of the job)")
    start.add_argument("-n", type=_positive, help="number of engines")
    start.add_argument("--nodes", type=_positive, help="over this many of the job's nodes (default: -n spread over "
                       "them, srun filling each but the last)")
    start.add_argument("--gpus-per-node", type=_positive, help="ranks on each node (default: -n spread evenly)")
    start.add_argument("--launcher", choices=list(LAUNCHERS))
    start.add_argument("--framework", choices=[*FRAMEWORKS, "auto", "none"], default="auto",
                       help="initialised by every rank as it starts (auto: the env's, Horovod first)")
    start.add_argument("--time", type=duration, help="outside a Slurm job: ask Slurm for an allocation of this "
                                                      "kernel's own, for this long (30m, 2h, HH:MM:SS)")
    start.add_argument("--partition", help="outside a Slurm job: the partition of this kernel's own allocation")
    start.add_argument("--account", help="outside a Slurm job: the account of this kernel's own allocation")
    for name, said in (("stop", "stop the engines (and release this kernel's own Slurm job)"),
                       ("restart", "stop the engines and start them again with the same layout and framework"),
                       ("panel", "the ClusterPanel widget: the allocation, the engines and their rank table")):
        sub.add_parser(name, help=said)
    status = sub.add_parser("status", help=f"each rank: host, GPU, pid, alive (above {COLLAPSE_ABOVE} ranks, each node)")
    status.add_argument("--ranks", action="store_true", help="every rank, one row each, whatever the world's size")
    attach = sub.add_parser("attach", help="use engines running in this job already (an earlier kernel's, or "
                                           "another notebook's), with what the ranks hold")
    attach.add_argument("cluster_id", nargs="?", help="which set (default: the only one no kernel uses, else the only one)")
    start.add_argument("--telemetry", type=_interval, default=telemetry.DEFAULT_INTERVAL, metavar="SECONDS",
                       help="seconds between the ranks' telemetry samples (0: off)")
    top = sub.add_parser("top", help="CPU, memory, GPU and training rate, updated live: every rank's, or above "
                                     f"{COLLAPSE_ABOVE} ranks each node's (min/median/max, stragglers named)")
    top.add_argument("--for", dest="duration", type=_seconds, default=600, metavar="SECONDS",
                     help="keep updating this many seconds")
    shown = top.add_mutually_exclusive_group()
    shown.add_argument("--node", help="this node's ranks, one row each")
    shown.add_argument("--ranks", action="store_true", help="every rank, one row each, whatever the world's size")
    top.add_argument("--straggler", type=_share, metavar="SHARE",
                     help=f"flag ranks whose rate is below this share of the median rate (default: "
                          f"${telemetry.STRAGGLER_VAR}, else {telemetry.DEFAULT_STRAGGLER_SHARE})")
    output = sub.add_parser("output", help="a rank's whole output in the last cell (a cell shows at most "
                                           f"{LINES_PER_RANK} lines of each rank)")
    output.add_argument("rank", type=int, help="the rank")
    sampling = sub.add_parser("telemetry", help="change how often the running ranks sample themselves")
    sampling.add_argument("seconds", type=_interval, help="seconds between samples (0: off)")
    stacks = sub.add_parser("stacks", help="every rank's Python stack, identical ones grouped (py-spy; where it cannot "
                                           "attach, each rank's own thread)")
    stacks.add_argument("--native", action="store_true", help="with the C frames (py-spy only)")
    stacks.add_argument("--source", choices=SOURCES, help="default: $HPCAI_STACKS, else auto. auto: py-spy, and each "
                        "rank's own thread where py-spy cannot attach (every rank in a container); py-spy (not in a "
                        "container); self (without --native)")
    checkpoint = sub.add_parser("checkpoint", help="run the ranks' walltime hooks (hpc.on_walltime) now")
    checkpoint.add_argument("path", nargs="?", help="where hpc.Checkpoint saves go this time (default: each one's own)")
    more = sub.add_parser("extend", help="more walltime for this notebook job, within the site's policy")
    more.add_argument("duration", type=duration, help="how much more: 30m, 2h or Slurm's HH:MM:SS")
    export = sub.add_parser("export", help="this notebook's rank cells as a batch job: an sbatch and a Python script")
    export.add_argument("--cells", default="all", help="the cells with this tag, or all (default)")
    export.add_argument("--out-dir", help="where the scripts go (default: beside the notebook)")
    sub.add_parser("continue", help="queue a follow-up notebook job with these options, starting when this one ends")
    grow = sub.add_parser("grow", help="more nodes for the engines: a second Slurm job whose ranks join this world "
                                       "(the estimate first; the next cell runs on the larger world)")
    grow.add_argument("--nodes", type=_positive, required=True, help="how many more nodes")
    grow.add_argument("--wait", action="store_true", help="return once their ranks are in (else at once)")
    shrink = sub.add_parser("shrink", help="stop ranks and give their nodes back to Slurm (grown jobs' first)")
    which = shrink.add_mutually_exclusive_group(required=True)
    which.add_argument("--nodes", type=_positive, help="give back this many nodes (the notebook's own stays)")
    which.add_argument("--ranks", type=_ranks, help="stop these ranks: 2,3")
    which.add_argument("--node", help="stop every rank on this node")
    restore = sub.add_parser("restore", help="every hpc.Checkpoint on the ranks loads its latest save")
    restore.add_argument("path", nargs="?", help="the folder to load from (default: each one's own)")
    return parser


@functools.cache
def run_parser(prog: str, script: bool = False) -> _Parser:
    """Options of %%horovod_run / %%torchrun; the line forms take a script and its arguments after them."""
    parser = _Parser(prog=prog, add_help=True)
    parser.add_argument("-n", type=_positive, help="ranks (starts engines if none run)")
    parser.add_argument("--timeout", type=_seconds, metavar="SECONDS", help="stop the cell after this many seconds")
    parser.add_argument("--output", choices=OUTPUT_MODES, default="auto",
                        help=f"auto (default): every rank's lines, collapsed above {COLLAPSE_ABOVE} ranks")
    parser.add_argument("--push", default="", metavar="NAMES",
                        help="comma-separated notebook variables to send to every rank")
    parser.add_argument("-o", dest="var", help="store every rank's result in this variable (a list by rank)")
    parser.add_argument("--elastic", type=_positive, metavar="MIN", help="when ranks die and at least MIN survive, "
                        "go on with them: the world re-formed, the last checkpoint restored, the cell run again")
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
