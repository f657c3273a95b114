"""Per-rank telemetry: what every rank is doing, sampled on the rank, read by the kernel and the server.

Each rank (boot.py) runs a sampler thread that writes one small JSON file, ``telemetry-<rank>.json``, into
its engine set's private folder every ``HPCAI_TELEMETRY_INTERVAL`` seconds (2 by default; 0 turns it off,
and ``set_interval`` changes it on running ranks): CPU %, RSS, the rank's own GPU's utilisation and memory
through NVML (gpus.py: by index, GPU UUID or MIG identifier; blank, with the reason, where it cannot be read),
and the training rate when the user's code reports its steps (``step``, ``keras_callback``, ``torch_hook``).
A sample takes about half a millisecond here (more on a loaded node: the benchmark prints it), and the thread
keeps sampling while the rank's main thread waits inside a collective. Readers (``%hpc top``, the ClusterPanel,
the side panel through the server extension) only read the files: nothing talks to the ranks, so a busy rank is
never asked.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..contract import TELEMETRY
from ..errors import HPCAIError
from . import gpus
from .identity import RANK_VARS, first_int, host_name, rank_ranges

FOLDER_VAR = "HPCAI_RANK_FOLDER"  # the engine set's private folder (contract.py)
INTERVAL_VAR = "HPCAI_TELEMETRY_INTERVAL"
DEFAULT_INTERVAL = 2.0
HISTORY = 30  # samples kept for the sparklines
RECENT = 5  # samples a straggler is judged on
PAUSED_CHECK = 1.0  # seconds between looks at the interval while telemetry is off
STRAGGLER_VAR = "HPCAI_STRAGGLER_SHARE"  # a rank whose recent rate is below this share of the median is a straggler
DEFAULT_STRAGGLER_SHARE = 0.67

_steps = 0
_steps_lock = threading.Lock()


def step(items: int = 1) -> None:
    """Report ``items`` (samples, images, tokens) processed by this rank; the telemetry shows the rate."""
    global _steps
    with _steps_lock:
        _steps += items


def keras_callback(batch_size: int) -> Any:
    """A Keras callback that reports each batch: ``model.fit(..., callbacks=[keras_callback(batch_size)])``."""
    import tensorflow as tf

    class Steps(tf.keras.callbacks.Callback):  # type: ignore[misc,name-defined]
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            step(batch_size)

    return Steps()


def torch_hook(module: Any) -> Any:
    """Report every forward pass of ``module`` (its first input's batch size); returns the hook's handle."""

    def hook(_module: Any, inputs: tuple[Any, ...], _output: Any) -> None:
        step(int(inputs[0].shape[0]) if inputs and hasattr(inputs[0], "shape") else 1)

    return module.register_forward_hook(hook)


@dataclass
class Sample:
    """One rank's latest sample, with its recent history (oldest first)."""

    rank: int
    host: str
    pid: int
    time: float
    interval: float
    cpu: float  # percent of one core
    rss: int  # bytes
    gpu_util: float | None = None  # percent
    gpu_mem: int | None = None  # bytes
    gpu_note: str = ""  # why a GPU reading is blank (gpus.py): no GPU, no NVML, a device NVML cannot find, MIG
    rate: float | None = None  # items per second, when the user's code reports steps
    cpu_history: list[float] = field(default_factory=list)
    rate_history: list[float] = field(default_factory=list)

    @property
    def recent_rate(self) -> float | None:
        """The mean rate over the last ``RECENT`` samples: what straggling is judged on (one slow sample is not)."""
        recent = self.rate_history[-RECENT:]
        return sum(recent) / len(recent) if recent else None

    def fresh(self, now: float | None = None) -> bool:
        """Sampled within the last three intervals (a rank that stopped sampling has died or is frozen)."""
        return ((now or time.time()) - self.time) < 3 * self.interval + 1


class _Gpu:
    """This rank's GPU through NVML (gpus.py), or why it has no readings (no nvidia-ml-py, no driver, no device)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.nvml: Any = None
        try:
            import pynvml
        except ImportError:
            self.device = gpus.Device("", why="no GPU readings: nvidia-ml-py is not installed in this env")
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:  # no driver, or no GPU on this node
            self.device = gpus.Device("", why=f"no GPU readings: NVML: {error}")
            return
        self.nvml, self.device = pynvml, gpus.rank_device(environ, pynvml)

    def read(self) -> gpus.Reading:
        return gpus.read(self.device, self.nvml)


class Sampler(threading.Thread):
    """Samples this process every ``interval`` seconds into ``folder/telemetry-<rank>.json`` (a daemon)."""

    def __init__(self, folder: Path, rank: int, host: str, interval: float, environ: Mapping[str, str]) -> None:
        super().__init__(name="hpcai-telemetry", daemon=True)
        import psutil

        self.path = folder / TELEMETRY.format(rank=rank)
        self.process = psutil.Process()
        self.gpu = _Gpu(environ)
        self.sample = Sample(rank, host, os.getpid(), time.time(), interval, 0.0, 0)
        self._done = threading.Event()
        self.process.cpu_percent(None)  # starts the CPU counter

    def run(self) -> None:
        last_steps, last_time = _steps, time.monotonic()
        while not self._done.wait(self.sample.interval or PAUSED_CHECK):
            now, steps = time.monotonic(), _steps
            if self.sample.interval:  # off: no sample, and the next rate starts from now
                self.take((steps - last_steps) / (now - last_time) if steps else None)
            last_steps, last_time = steps, now

    def take(self, rate: float | None) -> None:
        """One sample, written whole (a reader never sees half a file)."""
        s = self.sample
        with self.process.oneshot():
            s.cpu, s.rss = self.process.cpu_percent(None), self.process.memory_info().rss
        gpu = self.gpu.read()
        s.gpu_util, s.gpu_mem, s.gpu_note = gpu.util, gpu.mem, gpu.note
        s.rate, s.time = rate, time.time()
        s.cpu_history = [*s.cpu_history, s.cpu][-HISTORY:]
        if rate is not None:
            s.rate_history = [*s.rate_history, rate][-HISTORY:]
        path = self.path
        partial = path.with_name(f".{path.name}.{os.getpid()}")  # two ranks renumbered onto each other's names
        try:
            partial.write_text(json.dumps(vars(s)))  # vars: asdict would deep-copy the histories
            os.replace(partial, path)
            if path != self.path:  # renumbered meanwhile: the new name's sample comes next
                path.unlink()
        except OSError:  # the set's folder went away (the engines are stopping)
            self._done.set()


def checked_interval(seconds: float) -> float:
    """``seconds`` as a sampling interval, or the error that says what is allowed."""
    if seconds < 0:
        raise HPCAIError(f"the telemetry interval must be 0 (off) or more seconds, not {seconds:g}")
    return seconds


def interval(environ: Mapping[str, str]) -> float:
    """The sampling interval the kernel asked for (0: telemetry off)."""
    try:
        return max(0.0, float(environ.get(INTERVAL_VAR, DEFAULT_INTERVAL)))
    except ValueError:
        return DEFAULT_INTERVAL


_sampler: Sampler | None = None  # this rank's, when it is a rank


def start_sampling(environ: Mapping[str, str]) -> None:
    """At boot: the rank's sampler, when the kernel gave the set a folder (idle while the interval is 0)."""
    global _sampler
    folder = environ.get(FOLDER_VAR)
    if folder and Path(folder).is_dir():
        rank = first_int(environ, RANK_VARS, -1)
        _sampler = Sampler(Path(folder), rank, host_name(environ), interval(environ), environ)
        _sampler.start()


def set_interval(seconds: float) -> bool:
    """On a rank: sample every ``seconds`` from now on (0: off, and its file goes); False where no sampler runs."""
    if _sampler is None:
        return False
    _sampler.sample.interval = seconds
    if not seconds:
        _sampler.path.unlink(missing_ok=True)
    return True


def renumber(rank: int) -> None:
    """On a rank whose world was re-formed (world.py): its samples go under its new rank from now on."""
    if _sampler is not None and _sampler.sample.rank != rank:
        old, _sampler.sample.rank = _sampler.path, rank
        _sampler.path = old.with_name(TELEMETRY.format(rank=rank))
        old.unlink(missing_ok=True)


def sample_cost(times: int = 20) -> float:
    """Seconds one sample takes this rank's sampler (for the benchmark); 0 where no sampler runs."""
    if _sampler is None:
        return 0.0
    start = time.perf_counter()
    for _ in range(times):
        _sampler.take(_sampler.sample.rate)
    return (time.perf_counter() - start) / times


def read(folder: Path) -> list[Sample]:
    """Every rank's latest sample in an engine set's folder, by rank (ranks that never sampled are absent)."""
    samples = []
    for path in folder.glob(TELEMETRY.format(rank="*")):
        try:
            samples.append(Sample(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):  # gone, or being replaced
            continue
    return sorted(samples, key=lambda s: s.rank)


def straggler_share(environ: Mapping[str, str] = os.environ) -> float:
    """The share of the median rate below which a rank is a straggler: ``HPCAI_STRAGGLER_SHARE`` (set it in a
    profile's or the user's environment; the kernel and the server read it), 0.67 when unset or not in (0, 1)."""
    try:
        share = float(environ.get(STRAGGLER_VAR, DEFAULT_STRAGGLER_SHARE))
    except ValueError:
        return DEFAULT_STRAGGLER_SHARE
    return share if 0 < share < 1 else DEFAULT_STRAGGLER_SHARE


def stragglers(samples: list[Sample], ratio: float | None = None) -> set[int]:
    """Ranks whose recent training rate is below ``ratio`` (default: ``straggler_share()``) times the median of
    the ranks' (needs two ranks reporting)."""
    ratio = straggler_share() if ratio is None else ratio
    rates = {s.rank: s.recent_rate for s in samples if s.recent_rate is not None}
    if len(rates) < 2:
        return set()
    median = statistics.median(rates.values())
    return {rank for rank, rate in rates.items() if median > 0 and rate < ratio * median}


def summary(samples: list[Sample], ratio: float | None = None) -> list[dict[str, Any]]:
    """The samples as rows for JSON (the server extension) with ``fresh`` and ``straggler`` filled in."""
    slow, now = stragglers(samples, ratio), time.time()
    return [{**asdict(s), "fresh": s.fresh(now), "straggler": s.rank in slow} for s in samples]




COLUMNS = ("rank", "host", "CPU %", "RSS", "GPU %", "GPU mem", "rate /s", "note")


def rows(samples: list[Sample], ratio: float | None = None) -> list[tuple[str, ...]]:
    """The samples as table rows (``COLUMNS``), for %hpc top and the ClusterPanel."""
    ratio = straggler_share() if ratio is None else ratio
    slow, now = stragglers(samples, ratio), time.time()

    def note(s: Sample) -> str:
        if not s.fresh(now):
            return f"no sample for {now - s.time:.0f} s"
        if s.rank in slow:
            return f"straggler (< {ratio:.0%} of the median rate)"
        return s.gpu_note if s.gpu_util is None or s.gpu_mem is None else ""

    return [(str(s.rank), s.host, f"{s.cpu:.0f}", _size(s.rss), "-" if s.gpu_util is None else f"{s.gpu_util:.0f}",
             "-" if s.gpu_mem is None else _size(s.gpu_mem), "-" if s.rate is None else f"{s.rate:.1f}", note(s))
            for s in samples]


def alarming(note: str) -> bool:
    """Whether a row's note is one to flag (a straggler, a silent or dead rank), not a reading's blank (no GPU)."""
    return any(word in note for word in ("straggler", "no sample", "dead"))


NODE_COLUMNS = ("node", "ranks", "CPU %", "RSS", "GPU %", "GPU mem", "rate /s", "note")


def node_rows(samples: list[Sample], ratio: float | None = None, dead: frozenset[int] = frozenset()
              ) -> list[tuple[str, ...]]:
    """The samples summed up per node (``NODE_COLUMNS``): each reading as min/median/max over the node's ranks
    (one value where they agree), and the ranks that are stragglers or silent (``dead`` ones aside) named; nodes
    in rank order."""
    ratio = straggler_share() if ratio is None else ratio
    slow, now = stragglers(samples, ratio), time.time()
    nodes: dict[str, list[Sample]] = {}
    for sample in sorted(samples, key=lambda s: s.rank):
        nodes.setdefault(sample.host, []).append(sample)

    def spread(values: list[float | None], show: Any) -> str:
        known = sorted(v for v in values if v is not None)
        if not known:
            return "-"
        low, middle, high = known[0], statistics.median(known), known[-1]
        return show(low) if low == high else "/".join(show(v) for v in (low, middle, high))

    def note(group: list[Sample]) -> str:
        silent = [s.rank for s in group if not s.fresh(now) and s.rank not in dead]
        slow_here = [s.rank for s in group if s.rank in slow and s.fresh(now)]
        return "; ".join([*([f"no sample: ranks {rank_ranges(silent)}"] if silent else []),
                          *([f"straggler: ranks {rank_ranges(slow_here)}"] if slow_here else [])])

    return [(host, rank_ranges(s.rank for s in group), spread([s.cpu for s in group], lambda v: f"{v:.0f}"),
             spread([s.rss for s in group], _size), spread([s.gpu_util for s in group], lambda v: f"{v:.0f}"),
             spread([s.gpu_mem for s in group], _size), spread([s.rate for s in group], lambda v: f"{v:.1f}"),
             note(group)) for host, group in nodes.items()]


NODE_TABLE_COLUMNS = ("node", "ranks", "running", *NODE_COLUMNS[2:])


def node_table(members: list[tuple[int, str, bool]], samples: list[Sample]) -> list[tuple[str, ...]]:
    """A large world's panel rows (``NODE_TABLE_COLUMNS``): node_rows with how many of each node's ranks run, and
    its dead ranks named first in the note. ``members``: each rank's (rank, host, alive), in rank order."""
    readings = {row[0]: row for row in node_rows(samples, dead=frozenset(r for r, _, alive in members if not alive))}
    nodes: dict[str, list[tuple[int, bool]]] = {}
    for rank, host, alive in members:
        nodes.setdefault(host, []).append((rank, alive))
    table = []
    for host, here in nodes.items():
        dead = [rank for rank, alive in here if not alive]
        row = readings.get(host, (host, "", *("-",) * (len(NODE_COLUMNS) - 3), ""))  # no sample from it yet
        note = "; ".join([*([f"dead: ranks {rank_ranges(dead)}"] if dead else []), *([row[-1]] if row[-1] else [])])
        table.append((host, rank_ranges(r for r, _ in here), f"{len(here) - len(dead)}/{len(here)}", *row[2:-1], note))
    return table


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


__all__ = ["COLUMNS", "NODE_COLUMNS", "NODE_TABLE_COLUMNS", "Sample", "alarming", "keras_callback", "node_rows",
           "node_table", "read", "rows", "step", "stragglers",
           "summary", "torch_hook"]
