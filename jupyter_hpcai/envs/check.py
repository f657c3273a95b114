"""Re-check a built environment: activation, then the recipe's verify steps."""

from __future__ import annotations

from .build import activated, recipe_of
from .store import Env
from .verify import StepResult, verify


def check(env: Env) -> list[StepResult]:
    """Activate the current build and re-run its verify steps; raise naming the failing step."""
    build, environ = activated(env)
    return verify(build.python, recipe_of(env)[1].verify, environ)
