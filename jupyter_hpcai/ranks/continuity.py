"""Surviving the walltime, on the ranks: hooks that run when the job's end nears, and checkpoints of a Keras
or torch model with its optimizer and step. Every rank's namespace has this module as ``hpc``.

Slurm signals the notebook job's batch shell some minutes before its walltime and the shell leaves a mark
(``allocation.walltime_signal``). A training loop sees it at a step boundary: every ``CHECK_EVERY`` steps
(``hpc.step()`` in a loop, or ``hpc.keras_callback()``) the ranks agree on it with one collective (the largest
of each rank's flag), so that every rank runs the hooks at the same step. Ranks idle between cells run them
when the kernel asks (``Engines.checkpoint``). Either way the hooks run once per signal, in the order they
were registered, and ``%hpc checkpoint`` runs them on demand.

A ``Checkpoint`` saves model, optimizer, step and epoch: rank 0 writes a new folder whole (a temporary name, then a
rename) and points ``latest`` at it, while the other ranks wait for it in a collective; ``restore`` loads the
latest on every rank. The folder is ``$HPCAI_CHECKPOINT_DIR/<name>``, by default ``~/.hpcai/checkpoints/<name>``
(a site points the variable at scratch: checkpoints can be large).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Protocol

from ..scheduler import allocation, chosen
from . import calls, telemetry
from .identity import RANK_VARS, first_int
from .world import world_changed, world_size  # noqa: F401  (hpc.world_changed(), hpc.world_size())

environment = chosen().environment

CHECK_EVERY = 10  # steps between the ranks' agreement on the walltime signal (one tiny collective)
CHECKPOINT_DIR_VAR = "HPCAI_CHECKPOINT_DIR"
KEEP = 2  # checkpoints kept per name, newest first

_hooks: dict[Any, Callable[[], Any]] = {}  # by name: a cell run again replaces its hooks, it does not add more
_checkpoints: dict[str, Checkpoint] = {}  # by name, the latest made
_steps = 0
_epoch = 0  # the epoch the Keras callback is in, or the one a restore resumed at
_next_check = CHECK_EVERY
_ran_for: float | None = None  # the signal the hooks last ran for
_directory: Path | None = None  # where Checkpoint.save writes while %hpc checkpoint PATH runs the hooks
LOOK_EVERY = 1.0  # seconds between rank 0's looks for the signal's mark
_looked, _pending = -LOOK_EVERY, False


def on_walltime(hook: Callable[[], Any], name: str | None = None) -> Callable[[], Any]:
    """Run ``hook`` on this rank when the job's walltime nears (also a decorator). Registering again under the
    same name replaces the earlier hook, so running a cell twice does not add a second: ``name`` defaults to
    the checkpoint's for a ``Checkpoint``'s save, else to the function's qualified name (lambdas: each its own)."""
    owner = getattr(hook, "__self__", None)
    key: Any = name or (f"checkpoint {owner.name}" if isinstance(owner, Checkpoint)
                        else getattr(hook, "__qualname__", None))
    _hooks[hook if key is None or key.endswith("<lambda>") else key] = hook
    return hook


def step(items: int = 1) -> None:
    """One training step done (``items``: samples in it, for the telemetry's rate). Every ``CHECK_EVERY``
    steps the ranks agree on whether the walltime signal came, and run the hooks once if it did: call it on
    every rank, at the same place in the loop."""
    global _steps, _next_check
    telemetry.step(items)
    _steps += 1
    if _steps < _next_check:
        return
    _next_check = _steps + CHECK_EVERY
    if _hooks and any_rank(_rank() == 0 and _pending_now()):
        report = run_hooks()
        print(f"hpcai: walltime near: {describe(report)}", flush=True)


def steps() -> int:
    """Steps done on this rank (``step`` calls, or the step a ``Checkpoint.restore`` resumed at)."""
    return _steps


def epoch() -> int:
    """The epoch the Keras callback is in, or the one a ``Checkpoint.restore`` resumed at:
    ``model.fit(..., initial_epoch=hpc.epoch())`` continues there."""
    return _epoch


def keras_callback(batch_size: int = 1, stop: bool = False) -> Any:
    """A Keras callback calling ``step`` after every batch and keeping ``epoch``; with ``stop``, training stops
    once the walltime hooks ran. ``model.fit(..., callbacks=[hpc.keras_callback(batch_size)])``."""
    import tensorflow as tf

    class Walltime(tf.keras.callbacks.Callback):  # type: ignore[misc,name-defined]
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            global _epoch
            _epoch = epoch

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            before = _ran_for
            step(batch_size)
            if stop and _ran_for != before:
                self.model.stop_training = True

    return Walltime()


def run_hooks(directory: str | None = None) -> dict[str, Any]:
    """Run the registered hooks now, on this rank (``directory``: where checkpoints go this time); what
    happened, for the kernel's report. A hook that fails is reported and the others still run."""
    global _ran_for, _directory, _pending
    if _hooks:  # with none, the signal stays pending for hooks registered after it
        _ran_for, _pending = allocation.walltime_signal() or time.time(), False
    _directory = Path(directory).expanduser() if directory else None
    started, errors = time.monotonic(), []
    try:
        for hook in list(_hooks.values()):
            try:
                hook()
            except Exception as err:
                errors.append(f"{getattr(hook, '__qualname__', hook)}: {type(err).__name__}: {err}\n"
                              + "".join(traceback.format_tb(err.__traceback__)[-3:]))
    finally:
        _directory = None
    return {"hooks": len(_hooks), "seconds": time.monotonic() - started, "step": _steps, "errors": errors,
            "saved": [str(c.last_saved) for c in _checkpoints.values() if c.last_saved]}


def run_pending(directory: str | None = None) -> dict[str, Any]:
    """``run_hooks`` if the walltime signal came and the hooks have not run for it (in a cell's training loop,
    say); else what says they already did."""
    if pending():
        return run_hooks(directory)
    return {"hooks": len(_hooks), "seconds": 0.0, "step": _steps, "errors": [], "saved": [], "already": True}


def _pending_now() -> bool:
    """``pending``, looked up at most once a second: only rank 0 asks (the collective tells the others), so a
    fast loop on many ranks does not stat a shared filesystem thousands of times a second."""
    global _looked, _pending
    if time.monotonic() - _looked >= LOOK_EVERY:
        _looked, _pending = time.monotonic(), pending()
    return _pending


def pending() -> bool:
    """Whether the walltime signal came and this rank's hooks have not run for it."""
    signal = allocation.walltime_signal()
    return signal is not None and signal != _ran_for


def describe(report: dict[str, Any]) -> str:
    """One line for a rank's ``run_hooks`` report."""
    if not report["hooks"]:
        return "no walltime hooks registered (hpc.on_walltime(fn) registers one)"
    if report.get("already"):
        return f"the walltime hooks already ran (step {report['step']})"
    saved = f"; saved {', '.join(report['saved'])}" if report["saved"] else ""
    failed = f"; {len(report['errors'])} failed: {report['errors'][0].splitlines()[0]}" if report["errors"] else ""
    return f"ran {report['hooks']} walltime hook(s) at step {report['step']} in {report['seconds']:.1f} s{saved}{failed}"


def restore_all(directory: str | None = None) -> dict[str, Any]:
    """Every Checkpoint made on this rank loads its latest save (from ``directory`` if given)."""
    if not _checkpoints:
        return {"restored": [], "step": _steps, "missing": "no hpc.Checkpoint made on this rank"}
    restored = []
    for checkpoint in _checkpoints.values():
        folder = Path(directory).expanduser() if directory else checkpoint.directory
        if checkpoint.restore(folder) is not None:
            restored.append(str(checkpoint.last_restored))
    return {"restored": restored, "step": _steps, "missing": "" if restored else "no checkpoint saved yet"}


def any_rank(flag: bool) -> bool:
    """Whether any rank's ``flag`` is set: a collective through the initialised framework (every rank calls it)."""
    return bool(_max_over_ranks(int(flag)))


def _max_over_ranks(value: int) -> int:
    """The largest of every rank's ``value`` (a collective), or ``value`` without a framework."""
    framework = calls.initialised()
    return framework.max_over_ranks(value) if framework is not None else value


def _rank() -> int:
    return first_int(os.environ, RANK_VARS, 0)


class Format(Protocol):
    """How a model and its optimizer go to files and back."""

    def accepts(self, model: Any) -> bool: ...

    def save(self, model: Any, optimizer: Any, folder: Path) -> None: ...

    def load(self, model: Any, optimizer: Any, folder: Path) -> None: ...


class KerasFormat:
    """A Keras model's weights and its optimizer's variables, as numpy arrays (``.npz``)."""

    def accepts(self, model: Any) -> bool:
        return hasattr(model, "get_weights") and hasattr(model, "set_weights")

    def save(self, model: Any, optimizer: Any, folder: Path) -> None:
        import numpy as np

        np.savez(folder / "model.npz", *model.get_weights())
        if optimizer is not None:
            np.savez(folder / "optimizer.npz", *[v.numpy() for v in _optimizer_variables(optimizer)])

    def load(self, model: Any, optimizer: Any, folder: Path) -> None:
        import numpy as np

        with np.load(folder / "model.npz") as saved:
            model.set_weights([saved[f"arr_{i}"] for i in range(len(saved.files))])
        if optimizer is not None and (folder / "optimizer.npz").exists():
            if hasattr(optimizer, "build") and not _optimizer_variables(optimizer)[1:]:
                optimizer.build(model.trainable_variables)  # its slots exist only after a first step
            with np.load(folder / "optimizer.npz") as saved:
                values = [saved[f"arr_{i}"] for i in range(len(saved.files))]
            variables = _optimizer_variables(optimizer)
            if len(variables) != len(values):
                raise ValueError(f"the optimizer has {len(variables)} variables and the checkpoint {len(values)}: "
                                 "make the same optimizer as the one saved")
            for variable, value in zip(variables, values):
                variable.assign(value)


class TorchFormat:
    """``state_dict`` of the model and of the optimizer, in one ``torch.save`` file."""

    def accepts(self, model: Any) -> bool:
        return hasattr(model, "state_dict") and hasattr(model, "load_state_dict")

    def save(self, model: Any, optimizer: Any, folder: Path) -> None:
        import torch

        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict() if optimizer else None},
                   folder / "state.pt")

    def load(self, model: Any, optimizer: Any, folder: Path) -> None:
        import torch

        state = torch.load(folder / "state.pt", map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        if optimizer is not None and state["optimizer"] is not None:
            optimizer.load_state_dict(state["optimizer"])


def _optimizer_variables(optimizer: Any) -> list[Any]:
    found = optimizer.variables
    return list(found() if callable(found) else found)


class Checkpoint:
    """A model, its optimizer and the step, saved so that a later job resumes where this one stopped.

    ``hpc.on_walltime(Checkpoint(model, opt).save)`` saves at the walltime signal; ``ckpt.save()`` any time;
    ``start = ckpt.restore()`` (or ``%hpc restore``) in the next job loads the latest save and returns its step.
    Call both on every rank: rank 0 writes, the others wait; every rank reads.
    """

    formats: ClassVar[tuple[Format, ...]] = (TorchFormat(), KerasFormat())

    def __init__(self, model: Any, optimizer: Any = None, *, name: str = "checkpoint",
                 directory: str | os.PathLike[str] | None = None) -> None:
        self.model, self.optimizer, self.name = model, optimizer, name
        self.format = next((f for f in self.formats if f.accepts(model)), None)
        if self.format is None:
            raise TypeError(f"hpc.Checkpoint saves Keras and torch models, not {type(model).__name__}")
        root = os.environ.get(CHECKPOINT_DIR_VAR) or Path.home() / ".hpcai" / "checkpoints"
        self.directory = Path(directory).expanduser() if directory else Path(root) / name
        self.last_saved: Path | None = None
        self.last_restored: Path | None = None
        _checkpoints[name] = self

    def save(self, step: int | None = None) -> Path:
        """Save now (rank 0 writes; every rank returns once it is written); the saved folder."""
        step = _steps if step is None else step
        directory = _directory or self.directory
        folder = directory / f"step-{step:09d}"
        error: Exception | None = None
        if _rank() == 0:
            try:
                self._write(directory, folder, step)
            except Exception as err:  # the other ranks still get their answer below, then everyone raises
                error = err
        failed = _max_over_ranks(int(error is not None))  # the others wait for rank 0 here, and learn how it went
        if error is not None:
            raise error
        if failed:
            raise RuntimeError(f"rank 0 could not write the checkpoint {folder} (its error says why)")
        self.last_saved = folder
        return folder

    def _write(self, directory: Path, folder: Path, step: int) -> None:
        """On rank 0: a temporary folder, renamed whole, then ``latest``; the oldest saves beyond KEEP go."""
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = directory / f".{folder.name}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(mode=0o700)
        self.format.save(self.model, self.optimizer, partial)  # type: ignore[union-attr]
        meta = {"step": step, "epoch": _epoch, "saved_at": time.time(), "name": self.name,
                "job": environment.job_id(os.environ) or "", "ranks": world_size()}
        (partial / "meta.json").write_text(json.dumps(meta))
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
        _write_whole(directory / "latest", folder.name)
        for old in sorted(directory.glob("step-*"))[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)

    def restore(self, directory: str | os.PathLike[str] | None = None) -> int | None:
        """Load the latest save into the model and optimizer on this rank; its step (which ``hpc.steps()``
        continues from; ``hpc.epoch()`` is its epoch), or None when nothing was saved there yet."""
        global _steps, _epoch, _next_check
        directory = Path(directory).expanduser() if directory else self.directory
        try:
            folder = directory / (directory / "latest").read_text().strip()
        except FileNotFoundError:
            return None
        self.format.load(self.model, self.optimizer, folder)  # type: ignore[union-attr]
        meta = json.loads((folder / "meta.json").read_text())
        _steps, _epoch = meta["step"], meta.get("epoch", 0)
        _next_check = _steps + CHECK_EVERY
        self.last_restored = folder
        return int(_steps)


def _write_whole(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    partial.replace(path)
