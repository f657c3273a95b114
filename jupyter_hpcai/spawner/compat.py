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
from ..scheduler import chosen
from . import hub_api

environment = chosen().environment

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
    "req_keepvars_extra": "more variables of the server's environment (Spawner.env_keep, Spawner.environment) "
                          "passed on by --export (comma-separated names)",
    "exec_prefix": "how the hub runs Slurm commands as the user",
    "batch_submit_cmd": "the submission command (after exec_prefix; no {placeholders})",
    "batch_cancel_cmd": "the cancel command (after exec_prefix; {job_id})",
}
REFUSED = {
    **{name: PROFILES for name in ("req_partition", "req_account", "req_runtime", "req_nprocs", "req_ngpus",
                                    "req_gres", "req_queue")},
    "req_host": "a profile's extra_sbatch: ['--nodelist=HOST']",
    "req_cluster": f"one hub per cluster (its {environment.CONFIG}); the hub's queries do not follow -M",
    "batchspawner_singleuser_cmd": "nothing, or HPCSlurmSpawner.server_launcher: the job runs Spawner.cmd through "
                                   "hpcai-singleuser, whose server reports its port once it listens there; "
                                   "batchspawner-singleuser reported a port before the server held it",
    "req_srun": "nothing: the server runs in the batch step, and %hpc start runs the ranks with srun itself",
    "batch_script": "req_prologue, req_epilogue, req_options, and the profiles' extra_sbatch: HPCSlurmSpawner writes "
                    "its own script from validated options (`hpcai spawner preview` prints it)",
    **{name: "nothing: the hub reads job states from squeue's fixed fields itself"
       for name in ("batch_query_cmd", "state_pending_re", "state_running_re", "state_unknown_re",
                    "state_exechost_re", "state_exechost_exp")},
    **{name: "nothing: the hub computes it (req_keepvars_extra adds variables to the job's)"
       for name in ("req_keepvars", "req_username", "req_homedir")},
    # JupyterHub's: it would let a user's options set spawner attributes (exec_prefix, say) in the root hub
    "apply_user_options": "profiles and the form: options are validated whole by HPCSlurmSpawner",
}
# What the hub writes into every job script itself: an admin's option may not change it, or the job would differ
# from the one the hub tracks and extends (extend.as_submitted), or its log go elsewhere.
OWN_OPTIONS = ("--output", "--error", "--nodes", "--partition", "--gres", "--account", "--time", "--export",
               "--chdir", "--dependency", "--signal", "--job-name", "--ntasks-per-node")
OWN_SHORT = ("-o", "-e", "-N", "-p", "-A", "-t", "-D", "-d", "-J", "-G")  # the same, short (a value may follow)


def _hub_writes(option: str) -> bool:
    """Whether ``option`` sets what the hub writes into every job script itself."""
    if option.startswith("--"):
        return option.split("=", 1)[0] in OWN_OPTIONS or option.startswith("--gpus")
    return option[:2] in OWN_SHORT


_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _is_ours(spawner_class: Any) -> bool:
    """Whether a config's ``JupyterHub.spawner_class`` (a name or a class) is HPCSlurmSpawner or a subclass."""
    if isinstance(spawner_class, str):
        return spawner_class.rsplit(".", 1)[-1] == "HPCSlurmSpawner"
    return any(cls.__name__ == "HPCSlurmSpawner" for cls in getattr(spawner_class, "__mro__", ()))


def check(config: Mapping[str, Any]) -> None:
    """Stop the hub (HPCAIError) on a batchspawner setting HPCSlurmSpawner would not use, naming it and what to set
    instead; on a value of a used one that cannot reach a job script; and on a hub config that spawns with
    HPCSlurmSpawner without registering the hub's API (hub_api.register), where no server could report its port."""
    hub = dict(config.get("JupyterHub") or {})
    ours = _is_ours(hub.get("spawner_class"))
    if ours and hub.get("internal_ssl"):
        raise HPCAIError("JupyterHub.internal_ssl is not supported with HPCSlurmSpawner: the hub's check of what "
                         "answers on a server's port speaks plain HTTP",
                         "leave internal_ssl off, and keep the network between the hub and the nodes to the cluster "
                         "(the site-install guide's firewall rules)")
    if ours and not hub_api.registered():
        raise HPCAIError("the hub's config does not register jupyter-hpcai's hub API, so no notebook server could "
                         "report its port", "add to it: jupyter_hpcai.spawner.hub_api.register()")
    for section in SECTIONS:
        for name, value in dict(config.get(section) or {}).items():
            if name in REFUSED:
                raise HPCAIError(f"c.{section}.{name} is batchspawner's and HPCSlurmSpawner does not use it",
                                 f"remove it; use instead: {REFUSED[name]}")
            if name in SBATCH or name == "req_options":
                sbatch_options({name: str(value)})
            if name == "req_keepvars_extra":
                extra_variables(str(value))
            if name == "job_log_dir":
                log_dir(str(value))


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
    for option in words:
        if _hub_writes(option):
            raise HPCAIError(f"c.HPCSlurmSpawner.req_options has {option}, which the hub writes itself",
                             "resources belong in the profiles; the log folder is job_log_dir")
    for option in options + words:
        if not option.isprintable() or any(c.isspace() for c in option) or option.endswith("="):
            raise HPCAIError(f"the sbatch option {option!r} (from batchspawner's settings) cannot be one #SBATCH word",
                             "no spaces or control characters, and a value after '='")
    return options + words


def log_dir(value: str) -> str:
    """``HPCSlurmSpawner.job_log_dir``: a folder under the home, or an absolute one per user ({username})."""
    if value.strip() in ("", ".", "./") or (value.startswith("/") and "{username}" not in value):
        raise HPCAIError(f"c.HPCSlurmSpawner.job_log_dir {value!r} is not a folder of its own for each user",
                         "a folder under the home (the default .hpcai/logs), or an absolute path with {username} "
                         "in a place where users cannot make each other's folders")
    return value


def extra_variables(value: str) -> list[str]:
    """``req_keepvars_extra``'s variable names."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    for name in names:
        if not _VARIABLE.fullmatch(name):
            raise HPCAIError(f"c.HPCSlurmSpawner.req_keepvars_extra names {name!r}, which is not a variable name",
                             "comma-separated variable names, e.g. 'CUDA_CACHE_PATH,OMP_NUM_THREADS'")
    return names
