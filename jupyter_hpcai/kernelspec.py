"""Kernelspecs for built environments, written from the template in kernels/kernel.json."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

from . import paths
from .envs.store import Build, Env
from .errors import HPCAIError
from .proc import run

CURVE_SINCE = (7, 3)  # the first ipykernel that takes CurveZMQ keys from its connection file


def kernel_name(env: Env) -> str:
    return f"hpcai-{env.name}".lower()


def render(env: Env, display_name: str | None = None) -> dict[str, Any]:
    """kernel.json for ``env``: its `current` python, started through the hpcai-env provisioner.

    A container env's kernel is the container's python, run by the provisioner through udocker; it is
    interrupted by a message (a signal would reach udocker, not the kernel inside).
    """
    manifest = (env.current().manifest() if env.current() else None) or {}  # type: ignore[union-attr]
    container = manifest.get("kind") == "container"
    python = manifest["python"] if container else str(env.current_link / "bin" / "python")
    values = {"{python}": python, "{env}": env.name, "{env_root}": str(env.root),
              "{display_name}": display_name or f"Python ({env.name}{', container' if container else ''})"}

    def fill(node: Any) -> Any:
        if isinstance(node, str):
            return values.get(node, node)
        if isinstance(node, list):
            return [fill(n) for n in node]
        if isinstance(node, dict):
            return {k: fill(v) for k, v in node.items()}
        return node

    spec = fill(json.loads(paths.kernel_template().read_text()))
    if container:
        spec["interrupt_mode"] = "message"
    elif env.current() and _encrypts(env.current(), manifest):  # type: ignore[arg-type]
        spec["metadata"]["supported_encryption"] = ["curve"]  # a server with transport_encryption=auto then uses it
    return spec


def _encrypts(build: Build, manifest: dict[str, Any]) -> bool:
    """Whether the env's kernel can encrypt its connection (CurveZMQ): a recent enough ipykernel, and a zmq built
    with curve (asked of the env's own python)."""
    version = next((p["version"] for p in manifest.get("pip", []) + manifest.get("conda", [])
                    if p["name"].lower() == "ipykernel"), "")
    if tuple(int(n) for n in re.findall(r"\d+", version)[:2]) < CURVE_SINCE:
        return False
    done = run([str(build.python), "-c", "import zmq; print(zmq.has('curve'))"], check=False, timeout=60)
    return done.stdout.strip() == "True"


def install(env: Env, *, display_name: str | None = None, user: bool = False, prefix: str | None = None) -> Path:
    """Install the kernelspec where Jupyter finds it; returns its folder."""
    from jupyter_client.kernelspec import KernelSpecManager

    build = env.current()
    manifest = build.manifest() if build else None
    if manifest is None:
        raise HPCAIError(f"env '{env.name}' has no finished build", f"build it first: hpcai env build RECIPE --name {env.name}")
    inside = manifest.get("inside", {}).get("packages", {})
    if not any(p["name"].lower() == "ipykernel" for p in manifest["pip"] + manifest["conda"]) and "ipykernel" not in inside:
        raise HPCAIError(f"env '{env.name}' has no ipykernel, so it cannot run a kernel",
                         "add `ipykernel` to the recipe's pip list (or to the container image) and rebuild")
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp).chmod(0o755)  # copied as is: a system-wide kernelspec must be readable by every user
        (Path(tmp) / "kernel.json").write_text(json.dumps(render(env, display_name), indent=2) + "\n")
        dest = KernelSpecManager().install_kernel_spec(tmp, kernel_name(env), user=user, prefix=prefix)
    return Path(dest)
