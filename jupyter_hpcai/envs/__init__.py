"""Environments: recipes, the conda and pip layers, versioned builds, activation, verification."""

from .build import Builder, BuildResult, activated, activation_env, recipe_of
from .recipe import Recipe, load_recipe, parse_recipe
from .store import Build, Env, EnvStore

__all__ = [
    "Build", "BuildResult", "Builder", "Env", "EnvStore", "Recipe", "activated", "activation_env", "load_recipe",
    "parse_recipe", "recipe_of",
]
