"""This rank's place in its world (on a rank): the world a set of engines forms changes when the kernel grows it
(ranks of a second Slurm job join), shrinks it, or loses ranks; the kernel then numbers the ranks again densely and
tells each one its place (``assign``) before the next cell initialises the framework again on the new world.

Until then a rank's place is its launcher's (SLURM_PROCID, ...), shifted by ``HPCAI_RANK_OFFSET`` for the ranks of
a grown job, so that they never take the numbers of the ranks already there. A cell learns of a change once, with
``hpc.world_changed()`` (the new size: ``hpc.world_size()``).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from ..scheduler import chosen
from .identity import LOCAL_RANK_VARS, LOCAL_SIZE_VARS, RANK_VARS, SIZE_VARS, WORLD, first_int

environment = chosen().environment

OFFSET = "HPCAI_RANK_OFFSET"
_changes = 0  # re-formings of this rank's world
_told = 0  # the re-formings a cell was told of (world_changed)


def shift(environ: MutableMapping[str, str]) -> None:
    """At boot, in a grown job's rank: its launcher's rank moved past the ranks already in the world."""
    offset = first_int(environ, (OFFSET,), 0)
    if offset:
        environ[WORLD["rank"]] = str(offset + first_int(environ, RANK_VARS[1:], 0))


def assign(rank: int, size: int, local_rank: int, local_size: int) -> None:
    """This rank's place in the world the kernel formed; the framework is initialised again by the next cell."""
    global _changes
    from . import calls, telemetry

    os.environ.update({WORLD["rank"]: str(rank), WORLD["size"]: str(size), WORLD["local_rank"]: str(local_rank),
                       WORLD["local_size"]: str(local_size)})
    telemetry.renumber(rank)
    calls.forget_framework()
    calls.join()  # the names every cell has
    _changes += 1


def world_changed() -> bool:
    """True once after each change of this world (grown, shrunk, ranks lost): the cell that sees it re-scales what
    depends on the size (the learning rate, the batch per rank). False in every other cell."""
    global _told
    changed, _told = _told != _changes, _changes
    return changed


def world_size() -> int:
    """Ranks in this world now."""
    return first_int(os.environ, SIZE_VARS, 1)


__all__ = ["LOCAL_RANK_VARS", "LOCAL_SIZE_VARS", "assign", "shift", "world_changed", "world_size"]
