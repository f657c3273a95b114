"""Re-check a built environment: activation, then the recipe's verify steps."""

from __future__ import annotations

from .build import activated, recipe_of
from .preflight import site_facts, toolchain_env
from .store import Env
from .verify import StepResult, verify


def check(env: Env) -> list[StepResult]:
    """Activate the current build and re-run its verify steps; raise naming the failing step."""
    build, environ = activated(env)
    return verify(build.python, recipe_of(env)[1].verify, environ)


def site_warnings(env: Env) -> list[str]:
    """How this node differs from the one the env was built on (MPI version, GPUs for an NCCL build)."""
    build, recipe = recipe_of(env)
    built = (build.manifest() or {}).get("build_site") or {}
    here = site_facts(toolchain_env(recipe))
    warnings = []
    if built.get("mpi") and here["mpi"] != built["mpi"]:
        warnings.append(f"MPI differs from the build node {built.get('node')}: built with '{built['mpi']}', "
                        f"here '{here['mpi'] or 'no mpirun'}'; MPI programs (Horovod, mpi4py) may fail to start")
    if recipe.build_env.get("HOROVOD_GPU_OPERATIONS") == "NCCL" and not here["gpus"]:
        warnings.append(f"env '{env.name}' was built for NCCL but this node has no GPU visible")
    return warnings
