"""The hub side: HPCSlurmSpawner and its validated options."""

from .options import OptionsError, Profile, SpawnOptions, validate
from .spawner import HPCSlurmSpawner

__all__ = ["HPCSlurmSpawner", "OptionsError", "Profile", "SpawnOptions", "validate"]
