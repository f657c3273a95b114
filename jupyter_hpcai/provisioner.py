"""The `hpcai-env` kernel provisioner: the kernel starts inside its env, through the env's own protocol.

A kernelspec's static ``env`` cannot run activate.d scripts, load modules or enter a container. This
provisioner asks the env (envs.Env) for the argv and the environment of its kernel: a built prefix is
activated as `conda activate` would (cached per build) on top of the environment the kernel would get
anyway, so a kernel inside a Slurm job keeps its allocation (SLURM_*, CUDA_VISIBLE_DEVICES); a container
env's kernel runs in its container. A removed or broken env fails the start at once, with a message that
names the env, the failing step and the fix; JupyterLab shows it in its kernel error dialog.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jupyter_client.provisioning import LocalProvisioner
from tornado.web import HTTPError
from traitlets import Unicode

from .contract import START_ENGINES
from .envs import EnvStore
from .errors import HPCAIError


class KernelEnvError(HTTPError):
    """Why a kernel could not start in its env.

    An HTTPError, because jupyter_server hides other exceptions behind "Unhandled error"; this
    message reaches the REST reply and JupyterLab's kernel error dialog.
    """

    def __init__(self, message: str) -> None:
        super().__init__(500, log_message=message.replace("%", "%%"), reason="Kernel environment error")


class HPCAIEnvProvisioner(LocalProvisioner):  # type: ignore[misc]
    """Start the kernel in an hpcai env (config: ``env`` name and ``env_root``, from the kernelspec)."""

    env = Unicode(help="Name of the hpcai env the kernel runs in.").tag(config=True)
    env_root = Unicode("", help="The root the env lives in (default: the search path, yours first).").tag(config=True)

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        kwargs = await super().pre_launch(**kwargs)
        try:
            store = EnvStore.at(Path(self.env_root)) if self.env_root else EnvStore()
            env = store.get(self.env)
            cmd = list(kwargs["cmd"])
            if (kwargs.get("env") or {}).get(START_ENGINES) == "1":  # its first kernel takes the job's engines (warm.py)
                cmd.append("--ext=jupyter_hpcai")
            connection = cmd[cmd.index("-f") + 1] if "-f" in cmd else None
            kwargs["cmd"] = env.argv(cmd, binds=[str(Path(connection).parent)] if connection else [])
            kwargs["env"] = env.environ(kwargs.get("env") or {})
        except HPCAIError as err:
            raise KernelEnvError(f"Kernel for env '{self.env}' cannot start: {err.message}. Fix: {err.hint}") from None
        return kwargs
