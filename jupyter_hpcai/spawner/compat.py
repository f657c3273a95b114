"""batchspawner's settings under HPCSlurmSpawner: each one an admin may set either reaches the job as batchspawner's
``SlurmSpawner`` would use it, or stops the hub with the setting's name and what to use instead. None is accepted
and then ignored (HPCSlurmSpawner writes its own validated script, so batchspawner's template never runs).

``check(config)`` runs as the hub loads its config (the site template and the demo config end with it) and
again as each spawner starts, for a config that does not call it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from ..errors import HPCAIError

# The classes whose config sections HPCSlurmSpawner reads (an admin moving from batchspawner set SlurmSpawner's).
SECTIONS = ("Spawner", "BatchSpawnerBase", "SlurmSpawner", "HPCSlurmSpawner")
PROFILES = "the profiles (partition, nodes, gpus_per_node, walltime, account) and HPCSlurmSpawner.limits"
# setting -> the #SBATCH option it becomes, for every notebook job (the value is one word)
SBATCH = {"req_memory": "--mem", "req_qos": "--qos", "req_reservation": "--reservation"}
# settings used as batchspawner uses them
USED = {
    "req_options": "more #SBATCH options for every job, words starting with '-' (e.g. '--exclusive --constraint=a100')",
    "req_prologue": "shell lines run before the server starts",
    "req_epilogue": "shell lines run after the server ends (not when the job is cancelled or reaches its walltime)",
    "req_keepvars_extra": "more variables of the hub's environment passed to the job (comma-separated names)",
    "exec_prefix": "how the hub runs Slurm commands as the user",
    "batch_submit_cmd": "the submission command (after exec_prefix)",
    "batch_cancel_cmd": "the cancel command (after exec_prefix)",
}
REFUSED = {
    **{name: PROFILES for name in ("req_partition", "req_account", "req_runtime", "req_nprocs", "req_ngpus",
                                    "req_gres", "req_queue")},
    "req_host": "a profile's extra_sbatch: ['--nodelist=HOST']",
    "req_cluster": "one hub per cluster (its SLURM_CONF); the hub's queries do not follow -M",
    "req_srun": "nothing: the server runs in the batch step, and %hpc start runs the ranks with srun itself",
    "batch_script": "req_prologue, req_epilogue, req_options, and the profiles' extra_sbatch: HPCSlurmSpawner writes "
                    "its own script from validated options (`hpcai spawner preview` prints it)",
    **{name: "nothing: the hub reads job states from squeue's fixed fields itself"
       for name in ("batch_query_cmd", "state_pending_re", "state_running_re", "state_unknown_re",
                    "state_exechost_re", "state_exechost_exp")},
    **{name: "nothing: the hub computes it (req_keepvars_extra adds variables to the job's)"
       for name in ("req_keepvars", "req_username", "req_homedir")},
}
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check(config: Mapping[str, Any]) -> None:
    """Stop the hub (HPCAIError) on a batchspawner setting HPCSlurmSpawner would not use, naming it and what to set
    instead; and on a value of a used one that cannot reach a job script."""
    for section in SECTIONS:
        for name, value in dict(config.get(section) or {}).items():
            if name in REFUSED:
                raise HPCAIError(f"c.{section}.{name} is batchspawner's and HPCSlurmSpawner does not use it",
                                 f"remove it; use instead: {REFUSED[name]}")
            if name in SBATCH or name == "req_options":
                sbatch_options({name: str(value)})
            if name == "req_keepvars_extra":
                extra_variables(str(value))


def sbatch_options(settings: Mapping[str, str]) -> list[str]:
    """The #SBATCH options, one word each, of the SBATCH settings and ``req_options`` among ``settings``."""
    options = [f"{SBATCH[name]}={settings[name]}" for name in SBATCH if settings.get(name)]
    try:
        words = shlex.split(settings.get("req_options", ""))
    except ValueError as err:
        raise HPCAIError(f"c.HPCSlurmSpawner.req_options cannot be split into words: {err}",
                         "write options such as '--exclusive --constraint=a100'") from None
    if not all(w.startswith("-") for w in words):
        raise HPCAIError(f"c.HPCSlurmSpawner.req_options {settings['req_options']!r} holds a word that is no option",
                         "each word an sbatch option, starting with '-'")
    for option in options + words:
        if not option.isprintable() or any(c.isspace() for c in option) or option.endswith("="):
            raise HPCAIError(f"the sbatch option {option!r} (from batchspawner's settings) cannot be one #SBATCH word",
                             "no spaces or control characters, and a value after '='")
    return options + words


def extra_variables(value: str) -> list[str]:
    """``req_keepvars_extra``'s variable names."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    for name in names:
        if not _VARIABLE.fullmatch(name):
            raise HPCAIError(f"c.HPCSlurmSpawner.req_keepvars_extra names {name!r}, which is not a variable name",
                             "comma-separated variable names, e.g. 'CUDA_CACHE_PATH,OMP_NUM_THREADS'")
    return names
