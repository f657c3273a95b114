"""Environments: one ``Env`` protocol with a class per kind (a built prefix, a container), a typed manifest,
``EnvStore`` over the user's and the site's roots; recipes, the conda and pip layers, builds, activation."""

from .build import BuildRequest, BuildResult, Builder, Event
from ..container_launch import ContainerLaunch
from .container import ContainerEnv
from .prefix import PrefixEnv
from .recipe import Recipe, load_recipe, parse_recipe
from .store import Build, Checked, Env, EnvDir, EnvStore, open_env

__all__ = [
    "Build", "BuildRequest", "BuildResult", "Builder", "Checked", "ContainerEnv", "ContainerLaunch", "Env", "EnvDir",
    "EnvStore", "Event", "PrefixEnv", "Recipe", "load_recipe", "open_env", "parse_recipe",
]
