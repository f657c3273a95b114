"""The kernel's side of the engines: the engine set a notebook's kernel starts on its allocation, the cells it runs
there, and what it shows of them. Everything here runs in the kernel (or a process that starts engines as a
kernel does: a benchmark job); what runs on the ranks is ``jupyter_hpcai.ranks``, which this package imports and
which never imports it back.

- ``engines``: ``Engines``, the kernel's one handle (state for the panel, start / stop / restart / attach, cells);
- ``startup``: a set started (the controller and the ranks side by side) or attached;
  ``background``: a start in a thread, which cells and starts wait for;
- ``running_set``: one set while it runs: controller, client, ranks, the set's folder (``contract.py``);
- ``elastic``: the world grown and shrunk (``Engines``' part, mixed in); ``membership``: what each change does;
- ``cells``: a cell on every rank, watched and streamed; ``output``: what the user sees of it;
- ``launch``: layouts and launchers (srun / mpirun / local / local-mpi); ``report``: what a dead launcher said;
- ``own_job``: an allocation of the kernel's own outside any job;
- ``warm``: engines that start with the job, beside the server, for its first kernel (the profile's start_engines);
- ``rest``: idle worlds rest (Horovod with a long cycle) until the next cell wakes them;
- ``listing``: the job's engine sets as files (the server extension reads them too);
- ``controller``: ipyparallel's controller as its own process, tied to the kernel outside a job.

Its names are imported at their first use (PEP 562): the server extension reads ``listing`` without ipyparallel,
0.18 s of a notebook server's imports here.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engines import Engines, current
    from .launch import LAUNCHERS, Layout, plan
    from .output import OUTPUT_MODES, RankFailure
    from .running_set import Rank

_WHERE = {"Engines": "engines", "current": "engines", "LAUNCHERS": "launch", "Layout": "launch", "plan": "launch",
          "OUTPUT_MODES": "output", "RankFailure": "output", "Rank": "running_set"}
__all__ = ["LAUNCHERS", "OUTPUT_MODES", "Engines", "Layout", "Rank", "RankFailure", "current", "plan"]  # = _WHERE


def __getattr__(name: str) -> Any:
    """``name`` from the module that defines it, imported now."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)


def __dir__() -> list[str]:
    """The submodules loaded so far and the package's names (tab completion lists them before their first use)."""
    return sorted({*globals(), *_WHERE})
