"""The hub side: HPCSlurmSpawner and its validated options."""

from . import extend  # noqa: F401  registers the hub's /hub/api/hpcai/extend handler
from .options import OptionsError, Profile, SpawnOptions, validate
from .spawner import HPCSlurmSpawner

__all__ = ["HPCSlurmSpawner", "OptionsError", "Profile", "SpawnOptions", "validate"]
