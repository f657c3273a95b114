"""The hub side (runs in JupyterHub, as root): HPCSlurmSpawner, its validated options, and the hub's API handlers,
which the hub's config registers (hub_api.register())."""

from .options import OptionsError, Profile, SpawnOptions, validate
from .spawner import HPCSlurmSpawner
from . import compat, hub_api  # noqa: E402  after batchspawner's import (by spawner.py)

__all__ = ["HPCSlurmSpawner", "OptionsError", "Profile", "SpawnOptions", "compat", "hub_api", "validate"]
