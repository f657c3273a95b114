"""Build an env as a Slurm job on the partition whose nodes will use it (GPUs, drivers, CUDA, NCCL).

The job runs the same `hpcai env build` on a compute node, told what this host decided (the env root it builds
into, where the product comes from: a node may lack this host's site config or the wheel's folder); the CLI
follows its output file line by line until the job ends (``Submitted.follow``) and returns the build's exit status. Cancelling the job makes the
build in it stop the way Ctrl-C does: the previous env stays current.
"""

from __future__ import annotations

import shlex
import sys

from ..scheduler.jobscript import JobScript, Submitted
from .build import BuildRequest
from ..paths import product_requirement
from .recipe import PRODUCT_VARIABLE, recipe_file
from .store import EnvStore


def submit(request: BuildRequest, store: EnvStore, partition: str) -> Submitted:
    """Submit the build job (one node); its output goes to the env's private log folder."""
    recipe = request.recipe()
    env = store.env(request.name or recipe.name, site=request.site)
    env.require_writable("build")
    gpus = recipe.build.gpus if request.gpus is None else request.gpus
    time_limit = request.time_limit or recipe.build.time
    logs = env.path / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    logs.chmod(0o700)
    # from /, and -I: no module from the folder it was submitted from reaches the build
    cmd = [sys.executable, "-I", "-m", "jupyter_hpcai.cli", "env", "build",
           str(recipe_file(request.recipe_path).absolute()), "--name", env.name, *request.job_args()]
    # what this host decided, whatever the node's own /etc says: the root the env goes to, and the product's source
    decided = {"HPCAI_ENV_PATH" if request.site else "HPCAI_ENV_ROOT": str(env.root.path),
               **({"HPCAI_PRODUCT": product_requirement(recipe.base_dir)} if PRODUCT_VARIABLE in recipe.pip else {})}
    exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in decided.items())
    return JobScript(name=f"hpcai-build-{env.name}", nodes=1, time=time_limit, partition=partition,
                     account=request.account or None, output=f"{logs}/job-%j.out",
                     extra=("--ntasks=1", *([f"--gpus={gpus}"] if gpus else [])),
                     body=f"export PYTHONUNBUFFERED=1 COLUMNS=160 {exports}\ncd /\nexec {shlex.join(cmd)}\n").submit()
