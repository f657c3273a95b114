"""Kernelspecs for environments, written from the template in kernels/kernel.json."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import paths
from .envs import Env
from .errors import HPCAIError


def kernel_name(env: Env) -> str:
    return f"hpcai-{env.name}".lower()


def render(env: Env, display_name: str | None = None) -> dict[str, Any]:
    """kernel.json for ``env``: its python, started through the hpcai-env provisioner, which runs it in the env
    (activated, or in its container); the provisioner finds the env in the root it lives in."""
    values = {"{python}": env.python, "{env}": env.name, "{env_root}": str(env.env_dir.root.path),
              "{display_name}": display_name or f"Python ({env.name}, {env.describe()['kind']})"}

    def fill(node: Any) -> Any:
        if isinstance(node, str):
            return values.get(node, node)
        if isinstance(node, list):
            return [fill(n) for n in node]
        if isinstance(node, dict):
            return {k: fill(v) for k, v in node.items()}
        return node

    spec = fill(json.loads(paths.kernel_template().read_text()))
    spec["interrupt_mode"] = env.interrupt_mode
    if env.encrypts():
        spec["metadata"]["supported_encryption"] = ["curve"]  # a server with transport_encryption=auto then uses it
    return spec


def install(env: Env, *, display_name: str | None = None, user: bool | None = None, prefix: str | None = None) -> Path:
    """Install the kernelspec where Jupyter finds it; returns its folder. By default a user env's kernelspec is the
    user's own, and a site env's goes under this install's prefix (the hub's venv, on storage the nodes share): the
    servers Spawner.cmd starts there look in it, while the system path (/usr/local/share/jupyter) is the host's own."""
    from jupyter_client.kernelspec import KernelSpecManager

    if not env.has_package("ipykernel"):
        raise HPCAIError(f"env '{env.name}' has no ipykernel, so it cannot run a kernel",
                         "add `ipykernel` to the recipe's pip list (or to the container image) and rebuild")
    user = (env.env_dir.scope == "user" and prefix is None) if user is None else user
    prefix = sys.prefix if prefix is None and not user else prefix
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp).chmod(0o755)  # copied as is: a system-wide kernelspec must be readable by every user
        (Path(tmp) / "kernel.json").write_text(json.dumps(render(env, display_name), indent=2) + "\n")
        try:
            dest = KernelSpecManager().install_kernel_spec(tmp, kernel_name(env), user=user, prefix=prefix)
        except PermissionError as err:
            raise HPCAIError(f"cannot install the kernel of env '{env.name}' for every user: {err.filename} is not "
                             "writable by you", "an admin installs site kernels; for yourself: hpcai kernel install "
                             f"{env.name} --user") from None
    return Path(dest)
