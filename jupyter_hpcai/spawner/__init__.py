"""The hub side: HPCSlurmSpawner and its validated options."""

from . import extend, follow_up  # noqa: F401  register the hub's /hub/api/hpcai/extend and /continue handlers
from .options import OptionsError, Profile, SpawnOptions, validate
from .spawner import HPCSlurmSpawner
from . import api  # noqa: E402,F401  after batchspawner's import: its /hub/api/batchspawner handler replaced by ours

__all__ = ["HPCSlurmSpawner", "OptionsError", "Profile", "SpawnOptions", "validate"]
