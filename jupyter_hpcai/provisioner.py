"""The `hpcai-env` kernel provisioner: the kernel starts inside its env, activated as `conda activate` would.

A kernelspec's static ``env`` cannot run activate.d scripts or load modules. This provisioner
computes the env's activation (cached per build) and applies it on top of the environment the
kernel would get anyway, so a kernel inside a Slurm job keeps its allocation (SLURM_*,
CUDA_VISIBLE_DEVICES). A container env's kernel runs inside its container (envs/container.py).
A removed or broken env fails the start at once, with a message that names
the env, the failing step and the fix; JupyterLab shows it in its kernel error dialog.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jupyter_client.provisioning import LocalProvisioner
from tornado.web import HTTPError
from traitlets import Unicode

from .envs import EnvStore, activated
from .envs.container import Container, is_container
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
    env_root = Unicode("", help="Root of the env store (default: HPCAI_ENV_ROOT or the user's).").tag(config=True)

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        kwargs = await super().pre_launch(**kwargs)
        try:
            env = EnvStore(Path(self.env_root) if self.env_root else None).env(self.env)
            if is_container(env):
                return self._in_container(Container.current(env), kwargs)
            build, environ = activated(env, kwargs.get("env") or {})
        except HPCAIError as err:
            raise KernelEnvError(f"Kernel for env '{self.env}' cannot start: {err.message}. Fix: {err.hint}") from None
        cmd = list(kwargs["cmd"])
        if cmd and Path(cmd[0]).name.startswith("python"):
            cmd[0] = str(build.python)  # exactly the build that was activated, even if `current` moves meanwhile
        kwargs["cmd"] = cmd
        kwargs["env"] = environ
        return kwargs

    @staticmethod
    def _in_container(container: Container, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``udocker run`` the kernel in the env's container: host env, the user's identity, home and the
        connection file's folder, the Slurm allocation (its variables and the host's Slurm client)."""
        cmd = list(kwargs["cmd"])
        connection = cmd[cmd.index("-f") + 1] if "-f" in cmd else None
        binds = [str(Path(connection).parent)] if connection else []
        kwargs["cmd"] = [*container.run_argv(binds), container.python, *cmd[1:]]
        kwargs["env"] = container.environ(kwargs.get("env") or {})
        return kwargs
