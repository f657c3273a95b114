"""The hub side: HPCSlurmSpawner and its validated options."""

from . import extend, follow_up  # noqa: F401  register the hub's /hub/api/hpcai/extend and /continue handlers
from .options import OptionsError, Profile, SpawnOptions, validate
from .spawner import HPCSlurmSpawner
from . import api  # noqa: E402,F401  after batchspawner's import: its /hub/api/batchspawner handler replaced by ours
from . import compat  # noqa: E402,F401  compat.check(c): the last line of the site template and the demo config

__all__ = ["HPCSlurmSpawner", "OptionsError", "Profile", "SpawnOptions", "validate"]
