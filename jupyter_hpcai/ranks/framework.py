"""What a distributed framework is to the engines (runs in the kernel and on every rank): its name and magic, the
distributions the preflight compares across ranks, the modules a rank imports while it starts, and the functions
that initialise it on every rank (``init``) from the params the kernel computes for the world (``params``, or
``reformed`` after the world changed). The frameworks themselves, and their registry, are in frameworks.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Protocol

Handles = tuple[dict[str, Any], dict[str, Any]]  # (names for the cell namespace, what to report)


class World(Protocol):
    """What ``params`` sees of the engines (in the kernel): their ranks, a call on one rank, the controller's
    address, and the services the kernel keeps for the world while it runs (each stopped with ``shutdown()``)."""

    @property
    def ranks(self) -> Sequence[Any]: ...

    @property
    def listens(self) -> str: ...

    @property
    def services(self) -> dict[str, Any]: ...

    @property
    def folder(self) -> Path: ...

    def call(self, rank: int, function: Callable[..., Any], *args: Any) -> Any: ...


def changeable() -> str | None:
    """A framework whose worlds can always change (a Framework goes to the ranks by pickle: no lambdas in it)."""
    return None


@dataclass(frozen=True)
class Framework:
    """A distributed framework as the ranks initialise it and the kernel's magics name it (frameworks.FRAMEWORKS)."""

    name: str
    magic: str  # the cell magic that runs a cell on every rank with it (%%horovod_run: "horovod_run")
    title: str  # what it is, in the magic's help
    names: tuple[str, ...]  # what a cell of it finds ready on every rank (with hpc, the walltime hooks)
    distributions: tuple[str, ...]
    imports: tuple[str, ...]
    init: Callable[[dict[str, Any]], Handles]  # params -> handles, on a rank
    max_over_ranks: Callable[[int], int]  # a collective every rank calls: the largest of their values
    broadcast_object: Callable[[Any], Any]  # a collective every rank calls: rank 0's (picklable) value
    params: Callable[[World], dict[str, Any]] | None = None
    # params on a re-formed world (grown, shrunk, ranks lost; world.py), where the launch's are stale
    reformed: Callable[[World], dict[str, Any]] | None = None
    fixed: Callable[[], str | None] = changeable  # why this kernel's worlds of it cannot change, or None
    # in the kernel, before a launch: variables the ranks need to initialise it (the ranks on each node, the
    # nodes' addresses)
    launch_env: Callable[[World, Sequence[int], Iterable[str]], dict[str, str]] | None = None
    # in the kernel, for a world no cell used for a while: params that initialise it again in a form that costs
    # less while idle (Horovod: a long cycle), or None where that world cannot rest; the next cell that names
    # the framework initialises it again with ``reformed``'s params. Unset: idle costs nothing (torch)
    rest: Callable[[World], dict[str, Any] | None] | None = None

    def boot(self) -> Handles | None:
        """On a rank while it starts: import the framework, and initialise it when that needs no params."""
        for module in self.imports:
            import_module(module)
        return self.init({}) if self.params is None else None

    def installed(self) -> bool:
        """Whether this python has the framework's packages (the ranks run the same python)."""
        return all(find_spec(module.partition(".")[0]) is not None for module in self.imports)
