"""Environments: recipes, the conda and pip layers, versioned builds, activation, verification."""

from .build import Builder, BuildResult, activation_env
from .recipe import Recipe, load_recipe, parse_recipe
from .store import Build, Env, EnvStore

__all__ = ["Build", "BuildResult", "Builder", "Env", "EnvStore", "Recipe", "activation_env", "load_recipe", "parse_recipe"]
