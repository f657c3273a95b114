"""``hpcai site init`` (runs as the admin, on the hub host): the hub's config and the site config, written from the
templates shipped in the package with what this host finds out (its address on the route to the compute nodes, the
GPU partitions, a non-default SLURM_CONF), and every HPCSlurmSpawner setting listed, commented, with its help."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import pprint
import socket
import stat
import tempfile
import textwrap
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from . import network
from .errors import HPCAIError
from .scheduler import chosen
from .scheduler.durations import format_duration
from .scheduler.interface import Partition

scheduler = chosen()
environment = chosen().environment

TEMPLATES = Path(__file__).parent / "templates"
HUB_CONFIG = Path("/etc/jupyterhub/jupyterhub_config.py")
STATE_DIR = Path("/var/lib/jupyterhub")
ENV_KEEP = ["PATH", "LANG", "LC_ALL", "HPCAI_ENV_PATH", "HPCAI_CONFIG", "HPCAI_SCHEDULER"]


@dataclass(frozen=True)
class Site:
    """What goes into the two files."""

    hub_ip: str
    first_node: str
    bind_url: str
    public_url: str  # what users open: scheme://host[:port]; each user's server on <user>.host (subdomain_host)
    state_dir: Path
    partitions: list[Partition]  # those with GPUs, the default first
    env_roots: list[Path]
    slurm_conf: str | None  # SLURM_CONF when the admin's shell has one (a config outside /etc/slurm)
    allowed_groups: list[str]  # the unix groups whose members may log in (none: nobody until the admin names them)


def public_url(bind_url: str, given: str = "") -> str:
    """The hub's URL as users open it (scheme://host[:port], JupyterHub's subdomain_host): ``given``, else the
    bind URL where it names a host, else https:// and this host's full name (a loopback bind sits behind a TLS
    proxy)."""
    parts = urllib.parse.urlsplit(given or bind_url)
    host = parts.hostname or ""
    if not given:
        try:
            ipaddress.ip_address(host)
            named = False
        except ValueError:
            named = host not in ("", "localhost")
        if not named:
            return f"https://{socket.getfqdn()}"
    if parts.scheme not in ("http", "https") or not host:
        raise HPCAIError(f"the public URL {given or bind_url!r} is not https://HOST[:PORT]",
                         "give --public-url https://hub.example.org, the name users open")
    if parts.scheme == "http" and not local_name(host):
        raise HPCAIError(f"the public URL {given or bind_url!r} is plain http: the hub's cookies are Secure, so no "
                         "browser would keep them (and logins carry passwords)",
                         "give --public-url https://HOST, served by the hub (ssl_cert) or a TLS proxy in front")
    return f"{parts.scheme}://{parts.netloc}"


def local_name(host: str) -> bool:
    """Whether browsers resolve ``host`` to loopback themselves, and take Secure cookies from it over http."""
    return host == "localhost" or host.endswith(".localhost")


def origins(url: str) -> str:
    """What one origin per user needs of the site, for ``url`` (the hub's public URL)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if local_name(host):
        return f"the hub at {url}, each user's server at <user>.{host} (browsers resolve *.localhost themselves)"
    return (f"the hub at {url}, each user's server at <user>.{host}: needs DNS for {host} and *.{host} (to this "
            f"host, or its TLS proxy) and a certificate for both names (a wildcard *.{host})")


def detect(bind_url: str, state_dir: Path, env_roots: list[Path], allowed_groups: list[str],
           public: str = "") -> Site:
    """Ask Slurm for the GPU partitions and find this host's address on its route to their first node."""
    gpu = sorted((p for p in scheduler.partitions() if p.gpus_per_node), key=lambda p: not p.default)
    if not gpu:
        raise HPCAIError("sinfo lists no partition with GPUs (Gres=gpu:N)",
                         "declare the GPUs in slurm.conf and gres.conf first "
                         "(hpcai site check tells what Slurm hands out)")
    first = next((n.name for n in scheduler.nodes() if gpu[0].name in n.partitions), None)
    if first is None:
        raise HPCAIError(f"sinfo lists no node in partition {gpu[0].name}", "check the partition's Nodes= in slurm.conf")
    address = scheduler.node_address(first)
    try:
        hub_ip = network.source_address(address)
    except OSError as err:
        raise HPCAIError(f"this host has no route to node {first} ({address}): {err}",
                         "run site init on the hub host, which must reach the compute nodes") from None
    return Site(hub_ip, first, bind_url, public_url(bind_url, public), state_dir, gpu, env_roots,
                os.environ.get(environment.CONFIG), allowed_groups)


def profiles(partitions: list[Partition]) -> list[dict[str, Any]]:
    """Starting points: one whole node of each GPU partition, and two where it has two (walltime: 2 h, or less)."""
    found = []
    for p in partitions:
        walltime = format_duration(min(7200, p.max_time or 7200))
        for nodes in (1, 2)[: min(2, p.nodes)]:
            found.append({"name": f"{p.name}: {nodes} node{'s' * (nodes > 1)} x {p.gpus_per_node} GPUs",
                          "partition": p.name, "nodes": nodes, "gpus_per_node": p.gpus_per_node, "walltime": walltime})
    return found


def hub_config(site: Site) -> str:
    env_keep = ENV_KEEP + [environment.CONFIG] * bool(site.slurm_conf)
    slurm_conf = (f'os.environ.setdefault("{environment.CONFIG}", {site.slurm_conf!r})  '
                  "# the hub's Slurm commands and the jobs'" if site.slurm_conf else
                  f"# Slurm's config: the default place (set {environment.CONFIG} here for another)")
    return Template((TEMPLATES / "jupyterhub_config.py.in").read_text()).substitute(
        written=_today(), first_node=site.first_node, hub_ip=repr(site.hub_ip), bind_url=repr(site.bind_url),
        subdomain_host=repr(site.public_url), subdomain_host_text=site.public_url,
        public_host=urllib.parse.urlsplit(site.public_url).hostname,
        slurm_conf=slurm_conf, allowed_groups=repr(set(site.allowed_groups)) if site.allowed_groups else "set()",
        state_dir=repr(str(site.state_dir)), env_keep=repr(env_keep), profiles=_python(profiles(site.partitions)),
        partitions=repr([p.name for p in site.partitions]), reference=settings_reference())


def site_config(site: Site) -> str:
    return Template((TEMPLATES / "config.toml.in").read_text()).substitute(
        written=_today(), site_roots=json.dumps([str(r) for r in site.env_roots], ensure_ascii=False))


def settings_reference() -> str:
    """Every setting HPCSlurmSpawner reads (its own, batchspawner's and JupyterHub's Spawner's), commented: its help,
    its default, and for batchspawner's, what HPCSlurmSpawner does with it."""
    from .spawner import compat
    from .spawner.spawner import HPCSlurmSpawner

    lines = ["# ---- Every HPCSlurmSpawner setting: its help and default. Uncomment a line to change it. ----"]
    for name, trait in sorted(HPCSlurmSpawner.class_traits(config=True).items()):
        paragraphs = [" ".join(p.split()) for p in (trait.help or "(no help)").split("\n\n") if p.strip()]
        if name in compat.REFUSED:
            paragraphs.append(f"REFUSED here (the hub stops): use {compat.REFUSED[name]}")
        elif name in compat.USED or name in compat.SBATCH:
            paragraphs.append(f"Used: {compat.USED.get(name) or compat.SBATCH[name]}")
        lines.append("#")
        for text in paragraphs:
            lines += textwrap.wrap(text, 116, initial_indent="## ", subsequent_indent="## ")
        lines.append(f"# c.HPCSlurmSpawner.{name} = {_default(trait)}".replace("\n", "\\n"))  # one comment line
    return "\n".join(lines)


def write(path: Path, text: str, mode: int, force: bool) -> Path | None:
    """Write ``text`` to ``path`` (its folder made as needed), the whole file at once with ``mode`` from its first
    byte, never through a link. An existing file is kept unless ``force``, and then renamed aside first
    (PATH.YYYYmmdd-HHMMSS.bak, its mode and owner as they were). Returns that backup, if one was made."""
    backup = None
    if path.is_symlink():
        raise HPCAIError(f"{path} is a symbolic link; nothing was written", "write the real file's path, or remove the link")
    if path.exists():
        if not force:
            raise HPCAIError(f"{path} exists; nothing was written", "compare it with --print, or --force to replace it "
                                                                   "(the old one kept beside it as .bak)")
        backup = path.with_name(f"{path.name}.{dt.datetime.now():%Y%m%d-%H%M%S}.bak")
        os.link(path, backup)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # O_EXCL: never a planted file
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return backup


def state_folder(path: Path) -> Path:
    """The hub's state folder, made 0700; an existing one must be a real folder of this user's that nobody else
    can write (the hub's database and cookie secret live there)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        path.mkdir(mode=0o700, parents=True)
        return path
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise HPCAIError(f"{path} is not a folder of yours that only you can write (a link, another owner, or "
                         "group/world-writable)", "give --state-dir a new path, or fix that folder's owner and mode")
    path.chmod(0o700)
    return path


def _default(trait: Any) -> str:
    try:
        return trait.default_value_repr()
    except Exception:  # a default computed at run time
        return "(computed)"


def _python(value: Any) -> str:
    return pprint.pformat(value, width=116, sort_dicts=False)


def _today() -> str:
    return dt.date.today().isoformat()
