"""Toolchain preflight: before any download or compile, check what the recipe's build needs.

Compiler version (gcc >= 7.2 for Horovod, or the recipe's `build.min_gcc`), CMake, MPI (mpicc,
vendor and version), and for NCCL builds CUDA, the NCCL headers and library, and the GPUs. Each
problem names what is missing and how to get it. The facts found go into the env's manifest.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import mpi
from ..errors import HPCAIError
from ..proc import run
from ..scheduler import chosen
from . import activate
from .recipe import Recipe

environment = chosen().environment

HOROVOD_MIN_GCC = "7.2"


@dataclass
class Preflight:
    facts: dict[str, Any] = field(default_factory=dict)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (what is wrong, how to fix it)
    warnings: list[str] = field(default_factory=list)

    def raise_for_problems(self) -> None:
        if self.problems:
            lines = "\n".join(f"  - {what}\n    fix: {fix}" for what, fix in self.problems)
            raise HPCAIError(f"the build's preflight found {len(self.problems)} problem(s):\n{lines}",
                             "fix them (load a module, add a conda package) and build again")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def _line(cmd: list[str], env: dict[str, str], last: bool = False) -> str | None:
    """The first (or last) line a tool prints about itself; None when it is missing or fails."""
    exe = shutil.which(cmd[0], path=env.get("PATH"))
    if exe is None:
        return None
    done = run([exe, *cmd[1:]], env=env, check=False, timeout=60)
    lines = (done.stdout or done.stderr).strip().splitlines()
    return (lines[-1] if last else lines[0]) if done.returncode == 0 and lines else None


def toolchain_env(recipe: Recipe, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the build runs in before its prefix exists: the recipe's modules loaded."""
    env = dict(os.environ if base is None else base)
    if not recipe.modules:
        return env
    with tempfile.TemporaryDirectory() as empty:
        return activate.compute(Path(empty), recipe.name, list(recipe.modules), {}, env).apply(env)


def site_facts(env: dict[str, str]) -> dict[str, Any]:
    """Where this runs: node, Slurm job and partition, GPUs, compiler, MPI and CUDA versions."""
    gpus = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    smi = _line(["nvidia-smi", "-L"], env)
    return {
        "node": environment.node_name(env), "job_id": environment.job_id(env),
        "partition": env.get(environment.PARTITION), "gpus": gpus or ([smi] if smi else []),
        "compiler": _line([env.get("CC", "gcc"), "-dumpfullversion"], env),
        "cmake": _line(["cmake", "--version"], env),
        "mpi": mpi.host_version(env), "mpicc": shutil.which("mpicc", path=env.get("PATH")),
        "cuda": _line(["nvcc", "--version"], env, last=True),
    }


def preflight(recipe: Recipe, env: dict[str, str] | None = None) -> Preflight:
    """Check the toolchain the recipe's build needs, in ``env`` (default: this process's, modules loaded)."""
    env = toolchain_env(recipe, env)
    result = Preflight(facts=site_facts(env))
    facts, problem = result.facts, result.problems.append
    conda_specs = " ".join(recipe.conda.specs) if recipe.conda else ""
    build_env = recipe.build_env
    horovod = recipe.builds_horovod()
    minimum = recipe.build.min_gcc or (HOROVOD_MIN_GCC if horovod else None)
    if minimum:
        compiler = facts["compiler"]
        if compiler is None and "gxx_linux-64" not in conda_specs:
            problem((f"no C/C++ compiler ({env.get('CC', 'gcc')}) on PATH; the build needs gcc >= {minimum}",
                     "module load gcc (a recent one), or add gxx_linux-64 to the recipe's conda specs"))
        elif compiler and _version(compiler) < _version(minimum):
            problem((f"gcc {compiler} is older than {minimum}, which "
                     + ("Horovod needs" if horovod and not recipe.build.min_gcc else "the recipe asks for"),
                     f"module load a gcc >= {minimum} (e.g. `module load gcc/11`), or add gxx_linux-64 to the conda specs"))
    if horovod and facts["cmake"] is None and "cmake" not in conda_specs:
        problem(("cmake not found; Horovod's build needs it", "module load cmake, or add cmake to the recipe's conda specs"))
    needs_mpi = build_env.get("HOROVOD_WITH_MPI") == "1" or any(r.startswith("mpi4py") for r in recipe.pip)
    if needs_mpi and facts["mpicc"] is None and "openmpi" not in conda_specs and "mpich" not in conda_specs:
        problem(("mpicc not found on PATH; Horovod with MPI and mpi4py compile against it",
                 "module load openmpi (the MPI the engines will use), or add openmpi to the conda specs"))
    if build_env.get("HOROVOD_GPU_OPERATIONS") == "NCCL":
        _nccl_checks(recipe, env, result, conda_specs)
    return result


def _nccl_checks(recipe: Recipe, env: dict[str, str], result: Preflight, conda_specs: str) -> None:
    facts, problem = result.facts, result.problems.append
    cuda_from_conda = any(p in conda_specs for p in ("cuda-nvcc", "cudatoolkit", "cuda-toolkit"))
    if facts["cuda"] is None and not cuda_from_conda:
        problem(("CUDA not found (no nvcc on PATH, no CUDA package in the conda specs); NCCL builds need it",
                 "module load cuda, or add cuda-nvcc and cuda-cudart-dev to the conda specs"))
    home_spec = recipe.build_env.get("HOROVOD_NCCL_HOME", "")
    from_conda = "CONDA_PREFIX" in home_spec and re.search(r"(^|\s)nccl", conda_specs)
    if not from_conda:
        home = Path(activate.expand(home_spec, env)) if home_spec else None
        if home is None or not (home / "include" / "nccl.h").exists() or not list((home / "lib").glob("libnccl.so*")):
            problem((f"NCCL home not found: HOROVOD_NCCL_HOME={home_spec or '(unset)'} has no include/nccl.h and "
                     "lib/libnccl.so", "point HOROVOD_NCCL_HOME at your NCCL install (module load nccl), or add "
                     "nccl to the conda specs and set HOROVOD_NCCL_HOME: ${CONDA_PREFIX}"))
    if not facts["gpus"]:
        result.warnings.append("no GPU visible on this node: build NCCL envs on a GPU node "
                               "(hpcai env build RECIPE --on-partition PARTITION --gpus 1)")
