"""A built environment: a prefix made by `hpcai env build` (conda layer, python, pip layer), activated as
`conda activate` would."""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..errors import HPCAIError
from ..proc import run
from . import activate
from .manifest import PrefixManifest
from .preflight import site_facts, toolchain_env
from .recipe import Recipe
from .store import KINDS, BuiltEnv, Checked
from .verify import verify

CURVE_SINCE = (7, 3)  # the first ipykernel that takes CurveZMQ keys from its connection file


@dataclass(frozen=True)
class PrefixEnv(BuiltEnv):
    """The current build of a built env."""

    kind: ClassVar[str] = "prefix"
    interrupt_mode: ClassVar[str] = "signal"
    manifest: PrefixManifest

    @property
    def recipe(self) -> Recipe:
        """The recipe the build was made from, as its manifest records it."""
        return Recipe(**self.manifest.recipe)

    @property
    def python(self) -> str:
        return str(self.env_dir.current_link / "bin" / "python")

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        if not self.build.python.exists():
            raise HPCAIError(f"env '{self.name}' is broken: its python ({self.build.python}) is missing",
                             f"rebuild it: hpcai env build RECIPE --name {self.name} --rebuild")
        return activate.activation_env(self.build.prefix, self.recipe, self.name, base)

    def argv(self, cmd: Sequence[str], binds: Sequence[str] = ()) -> list[str]:
        """``cmd`` with its python replaced by exactly this build's (even if `current` moves meanwhile)."""
        cmd = list(cmd)
        if cmd and Path(cmd[0]).name.startswith("python"):
            cmd[0] = str(self.build.python)
        return cmd

    def check(self) -> Checked:
        steps = verify(self.build.python, self.recipe.verify, self.environ())
        return Checked([s.step for s in steps], self._site_warnings())

    def _site_warnings(self) -> list[str]:
        """How this node differs from the one the env was built on (MPI version, GPUs for an NCCL build)."""
        built, recipe = self.manifest.build_site, self.recipe
        here = site_facts(toolchain_env(recipe))
        warnings = []
        if built.get("mpi") and here["mpi"] != built["mpi"]:
            warnings.append(f"MPI differs from the build node {built.get('node')}: built with '{built['mpi']}', "
                            f"here '{here['mpi'] or 'no mpirun'}'; MPI programs (Horovod, mpi4py) may fail to start")
        if recipe.build_env.get("HOROVOD_GPU_OPERATIONS") == "NCCL" and not here["gpus"]:
            warnings.append(f"env '{self.name}' was built for NCCL but this node has no GPU visible")
        return warnings

    def remove(self) -> None:
        self.env_dir.require_writable("remove")
        with self.env_dir.exclusive():
            shutil.rmtree(self.env_dir.path / "builds", ignore_errors=True)
            self.env_dir.current_link.unlink(missing_ok=True)
        shutil.rmtree(self.env_dir.path, ignore_errors=True)

    def describe(self) -> dict[str, str]:
        m = self.manifest
        return {"kind": "conda" if m.conda else "venv", "python": m.python or "-",
                "packages": f"{len(m.conda)} conda, {len(m.pip)} pip"}

    def encrypts(self) -> bool:
        """A recent enough ipykernel, and a zmq built with curve (asked of the env's own python)."""
        version = next((p.version for p in [*self.manifest.pip, *self.manifest.conda] if p.name.lower() == "ipykernel"),
                       "")
        if tuple(int(n) for n in re.findall(r"\d+", version)[:2]) < CURVE_SINCE:
            return False
        done = run([str(self.build.python), "-c", "import zmq; print(zmq.has('curve'))"], check=False, timeout=60)
        return done.stdout.strip() == "True"

    def has_package(self, name: str) -> bool:
        return any(p.name.lower() == name for p in [*self.manifest.pip, *self.manifest.conda])


KINDS[PrefixManifest] = PrefixEnv
