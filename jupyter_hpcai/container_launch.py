"""What a container env's kernel tells the engines it starts: how each rank runs in the same container.

Its own module, with nothing but the standard library under it: the kernel and the engines run it inside the
container, whose image has only what it has (python, ipykernel, ipyparallel), not this project's dependencies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import ClassVar

from .errors import HPCAIError


@dataclass(frozen=True)
class ContainerLaunch:
    """What a container env's kernel tells its engines (through one variable): how each rank runs in the
    same container, and the MPI of the image and of the host, checked before any rank starts."""

    VARIABLE: ClassVar[str] = "HPCAI_CONTAINER"
    name: str
    run: list[str]
    python: str
    mpi: str | None
    host_mpi: str | None

    def to_env(self) -> dict[str, str]:
        return {self.VARIABLE: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ContainerLaunch | None:
        """The kernel's container launch, or None outside a container env's kernel."""
        if cls.VARIABLE not in environ:
            return None
        try:
            return cls(**json.loads(environ[cls.VARIABLE]))
        except (ValueError, TypeError) as err:
            raise HPCAIError(f"{cls.VARIABLE} is not a container launch: {err}",
                             "restart the kernel (its provisioner sets it)") from None

    def rank_argv(self, module: str) -> list[str]:
        """``python -m module`` in the container."""
        return [*self.run, self.python, "-m", module]
