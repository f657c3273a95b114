"""Re-check a built environment: activation, then the recipe's verify steps."""

from __future__ import annotations

from ..errors import HPCAIError
from .build import activation_env
from .recipe import Recipe
from .store import Env
from .verify import StepResult, verify


def recipe_of(env: Env) -> Recipe:
    """The recipe the env's current build was made from (recorded in its manifest)."""
    build = env.current()
    manifest = build.manifest() if build else None
    if manifest is None:
        raise HPCAIError(f"env '{env.name}' has no finished build", f"build it: hpcai env build RECIPE --name {env.name}")
    return Recipe(**manifest["recipe"])


def check(env: Env) -> list[StepResult]:
    """Activate the current build and re-run its verify steps; raise naming the failing step."""
    build = env.current()
    recipe = recipe_of(env)
    assert build is not None
    if not build.python.exists():
        raise HPCAIError(f"env '{env.name}' is broken: {build.python} is missing",
                         f"rebuild it: hpcai env build RECIPE --name {env.name} --rebuild")
    return verify(build.python, recipe.verify, activation_env(build, recipe, env.name))
