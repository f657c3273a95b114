"""Every path the project uses by default, each overridable by an environment variable; private files and folders.

Nothing here points into the source checkout: run-time state lives outside it.
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from importlib import metadata
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote

from .errors import HPCAIError


def devcluster_dir() -> Path:
    """State of the local dev cluster (configs, spool, logs). ``HPCAI_DEVCLUSTER_DIR``."""
    return Path(os.environ.get("HPCAI_DEVCLUSTER_DIR", "/var/lib/hpcai/devcluster"))


def slurm_prefix() -> str:
    """Where the Slurm the dev cluster runs is installed (its bin/ and sbin/), "" for the system's. ``HPCAI_SLURM``."""
    return os.environ.get("HPCAI_SLURM", "")


def hub_dir() -> Path:
    """The demo hub's state (database, secrets, pid files, log). ``HPCAI_HUB_DIR``."""
    return Path(os.environ.get("HPCAI_HUB_DIR", "/var/lib/hpcai/hub"))


SITE_CONFIG = Path("/etc/jupyter-hpcai/config.toml")
SITE_ENV_ROOT = Path("/opt/hpcai/envs")


def env_root() -> Path:
    """The user's own environments, one folder per name: where ``hpcai env build`` puts them. ``HPCAI_ENV_ROOT``."""
    default = Path.home() / ".local" / "share" / "hpcai" / "envs"
    return Path(os.environ.get("HPCAI_ENV_ROOT", default))


def site_config() -> dict[str, Any]:
    """The site's settings for the CLI and the kernels, a TOML file the admins edit (``HPCAI_CONFIG``, default
    /etc/jupyter-hpcai/config.toml); {} when there is none."""
    path = Path(os.environ.get("HPCAI_CONFIG", SITE_CONFIG))
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise HPCAIError(f"cannot read the site config {path}: {err}",
                         "fix its TOML syntax, or ask the admins (see docs/howto/site-envs.md)") from None


def site_env_roots() -> list[Path]:
    """The site's shared environments, searched after the user's own: ``HPCAI_ENV_PATH`` (colon-separated),
    else ``[envs] site_roots`` in the site config, else /opt/hpcai/envs."""
    if "HPCAI_ENV_PATH" in os.environ:
        return [Path(p) for p in os.environ["HPCAI_ENV_PATH"].split(":") if p]
    roots = site_config().get("envs", {}).get("site_roots")
    if roots is None:
        return [SITE_ENV_ROOT]
    if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
        raise HPCAIError("site config: envs.site_roots must be a list of folders", 'e.g. site_roots = ["/opt/hpcai/envs"]')
    return [Path(r) for r in roots]


def cache_dir() -> Path:
    """Download caches (conda packages). ``HPCAI_CACHE_DIR``; pip keeps its own cache."""
    return Path(os.environ.get("HPCAI_CACHE_DIR", Path.home() / ".cache" / "hpcai"))


def kernel_template() -> Path:
    """The kernel.json template: shipped inside the wheel, or the checkout's kernels/ folder."""
    package = Path(__file__).parent
    shipped = package / "kernels" / "kernel.json"
    return shipped if shipped.exists() else package.parent / "kernels" / "kernel.json"


def recipes_dir() -> Path:
    """The recipes the product ships: inside the wheel, or the checkout's recipes/ folder."""
    package = Path(__file__).parent
    shipped = package / "recipes"
    return shipped if shipped.is_dir() else package.parent / "recipes"


def product_requirement(recipe_dir: Path | None = None) -> str:
    """The pip line that installs this product into an env (a recipe's ``${HPCAI_PRODUCT}``): ``HPCAI_PRODUCT``,
    else the checkout whose recipes/ holds the recipe (``-e CHECKOUT``, where it is this user's or root's alone),
    else ``[envs] product`` in the site config (a wheel's path, or a URL on the site's own index), else where this
    install came from (its PEP 610 record: the checkout it is editable from, or the wheel file, while it is there and
    nobody else can have put it there). Never a bare name: pip would take whatever a public index serves under it."""
    if os.environ.get("HPCAI_PRODUCT"):
        return os.environ["HPCAI_PRODUCT"]
    if recipe_dir is not None and _is_checkout(recipe_dir.parent) and ours(recipe_dir.parent):
        return f"-e {recipe_dir.parent.resolve()}"  # resolved: a link someone repoints later changes nothing
    named = site_config().get("envs", {}).get("product")
    if named:
        return str(named)
    origin = _install_origin()
    if origin and ours(Path(origin.removeprefix("-e "))):
        path = Path(origin.removeprefix("-e ")).resolve()
        return f"-e {path}" if origin.startswith("-e ") else str(path)
    found = (f"it came from {origin}, which someone other than you or root owns or may change"
             if origin else "it was installed from an index, or its wheel has moved")
    raise HPCAIError(f"a recipe installs ${{HPCAI_PRODUCT}}, and this install of jupyter-hpcai cannot say which: "
                     f"{found}",
                     'set product = "/shared/software/dist/jupyter_hpcai-VERSION-py3-none-any.whl" (the wheel the '
                     "hub was installed from, or its URL on your own index) under [envs] in the site config, or "
                     "HPCAI_PRODUCT for one build")


def _install_origin() -> str:
    """``-e CHECKOUT`` or a wheel's path, from the install's direct_url.json; "" when it says neither."""
    try:
        record = json.loads(metadata.distribution("jupyter-hpcai").read_text("direct_url.json") or "{}")
    except (metadata.PackageNotFoundError, ValueError):
        return ""
    url = str(record.get("url", ""))
    if not url.startswith("file://"):
        return ""
    path = Path(unquote(url.removeprefix("file://")))
    if record.get("dir_info", {}).get("editable") and _is_checkout(path):
        return f"-e {path}"
    return str(path) if path.suffix == ".whl" and path.is_file() else ""


def _is_checkout(folder: Path) -> bool:
    """A source tree of this product (its pyproject.toml names it)."""
    try:
        with open(folder / "pyproject.toml", "rb") as f:
            return tomllib.load(f).get("project", {}).get("name") == "jupyter-hpcai"
    except (OSError, tomllib.TOMLDecodeError):
        return False


def ours(path: Path) -> bool:
    """``path`` and every folder above it are this user's or root's, and nobody else may change them (a folder with
    the sticky bit, as /tmp, keeps what is ours ours): what installs from there installs what we put there."""
    mine = {0, os.geteuid()}
    try:
        path = path.resolve(strict=True)
        for place in (path, *path.parents):
            st = place.stat()
            shared = st.st_mode & 0o022 and not (place != path and st.st_mode & stat.S_ISVTX)
            if st.st_uid not in mine or shared:
                return False
    except OSError:
        return False
    return True


def private_dir(path: Path) -> Path:
    """A folder only its owner can enter: created 0700 (never readable by others, not even for an instant)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def open_private(path: Path, mode: str = "w") -> IO[str]:
    """Open a file for writing (``w``) or appending (``a``) that is 0600 from its first byte; never through a link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)  # a file that existed keeps its mode under O_CREAT
    return os.fdopen(fd, mode)


def replace_text(path: Path, text: str) -> None:
    """Replace a file's text so that a reader sees the old text or the new, never half of it."""
    tmp = path.with_name(f".{path.name}.hpcai-tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_private(path: Path, text: str) -> None:
    """Write a secret (a password, a token) into a file only its owner can read."""
    with open_private(path) as out:
        out.write(text)
