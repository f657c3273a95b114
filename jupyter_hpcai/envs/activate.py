"""Activation: the environment variables an env needs, computed as `conda activate` would set them.

A bash child loads the recipe's modules (Lmod or Environment Modules), sets PATH, CONDA_PREFIX and
CONDA_DEFAULT_ENV, and sources the env's etc/conda/activate.d scripts; then the recipe's `activate:`
variables are expanded in Python (no shell sees them). The difference between the environment
before and after is the activation. It is computed once per build and cached in the build's
.hpcai/activation.json; a change to activate.d, the modules or the variables invalidates it.

Variables that grew around their old value (PATH=/env/bin:$PATH) are kept as a prefix and a
suffix, so the activation applies on top of any environment, e.g. a Slurm job's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import HPCAIError
from ..proc import run

if TYPE_CHECKING:
    from .recipe import Recipe

# Positional arguments: $1 prefix, $2 env name, $3... modules. Activation output goes to fd 3 only.
_ACTIVATE_SH = r"""
exec 3>&1 1>&2
env -0 >&3; printf '\0--hpcai-activated--\0' >&3
prefix=$1; name=$2; shift 2
if [ $# -gt 0 ]; then
  if ! type module >/dev/null 2>&1; then
    for init in "${LMOD_PKG:-/usr/share/lmod/lmod}/init/bash" /usr/share/modules/init/bash /etc/profile.d/modules.sh; do
      [ -r "$init" ] && { . "$init"; break; }
    done
  fi
  type module >/dev/null 2>&1 || { echo "hpcai-step: modules: no module command (Lmod or Environment Modules) on this node" ; exit 4; }
  for m in "$@"; do
    module load "$m" || { echo "hpcai-step: module load $m failed"; exit 4; }
    # Lmod reports a missing module on stderr but may still exit 0: check it is loaded.
    module is-loaded "$m" 2>/dev/null || { echo "hpcai-step: module load $m: no such module"; exit 4; }
  done
fi
export CONDA_PREFIX="$prefix" CONDA_DEFAULT_ENV="$name" CONDA_SHLVL=1 PATH="$prefix/bin:$PATH"
for f in "$prefix"/etc/conda/activate.d/*.sh; do
  [ -f "$f" ] || continue
  . "$f" || { echo "hpcai-step: activate script $f failed (exit $?)"; exit 5; }
done
env -0 >&3
"""
_DROP = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV")  # another env's
_VOLATILE = {"_", "SHLVL", "PWD", "OLDPWD", "BASH_FUNC_module%%", "BASH_FUNC_ml%%"}
_EXPAND = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass
class Activation:
    """What activating an env does to an environment."""

    set: dict[str, str] = field(default_factory=dict)
    wrap: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (before old value, after it)
    unset: list[str] = field(default_factory=list)

    def apply(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` with this activation applied."""
        env = {k: v for k, v in base.items() if k not in self.unset}
        env.update(self.set)
        for name, (before, after) in self.wrap.items():
            old = base.get(name, "")
            env[name] = f"{before}{old}{after}" if old else f"{before}{after}".strip(":")
        return env


def _diff(before: dict[str, str], after: dict[str, str]) -> Activation:
    act = Activation()
    for key, new in after.items():
        if key in _VOLATILE or key.startswith("BASH_FUNC_") or before.get(key) == new:
            continue
        old = before.get(key)
        if old and old in new:
            i = new.index(old)
            act.wrap[key] = (new[:i], new[i + len(old):])
        else:
            act.set[key] = new
    act.unset = sorted(k for k in before if k not in after and k not in _VOLATILE)
    return act


def _parse_env0(blob: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in blob.split("\0") if "=" in item)


def expand(value: str, env: dict[str, str]) -> str:
    """Expand $VAR and ${VAR} from ``env`` (unknown variables become empty), as a shell would."""
    return _EXPAND.sub(lambda m: env.get(m.group(1) or m.group(2), ""), value)


def compute(prefix: Path, name: str, modules: list[str], variables: dict[str, str], base: dict[str, str]) -> Activation:
    """Activate ``prefix`` in a bash child starting from ``base`` and return the difference."""
    if not prefix.is_dir():
        raise HPCAIError(f"env '{name}': its prefix {prefix} does not exist", f"rebuild it: hpcai env build RECIPE --name {name}")
    done = run(["bash", "--noprofile", "--norc", "-c", _ACTIVATE_SH, "hpcai-activate", str(prefix), name, *modules],
               env=base, check=False, timeout=120)
    if done.returncode != 0:
        steps = [ln.split("hpcai-step: ", 1)[1] for ln in done.stderr.splitlines() if "hpcai-step: " in ln]
        detail = steps[-1] if steps else done.stderr.strip()[-500:]
        raise HPCAIError(f"activating env '{name}' failed: {detail}",
                         "fix or remove the failing activate.d script or module, then `hpcai env check " + name + "`")
    before_blob, after_blob = done.stdout.split("\0--hpcai-activated--\0", 1)
    before, after = _parse_env0(before_blob), _parse_env0(after_blob)
    for key, value in variables.items():
        after[key] = expand(value, after)
    return _diff(before, after)


def _cache_key(prefix: Path, modules: list[str], variables: dict[str, str]) -> str:
    h = hashlib.sha256(json.dumps([str(prefix), modules, variables], sort_keys=True).encode())
    scripts = prefix / "etc" / "conda" / "activate.d"
    if scripts.is_dir():
        for f in sorted(scripts.iterdir()):
            st = f.stat()
            h.update(f"{f.name}:{st.st_mtime_ns}:{st.st_size}".encode())
    return h.hexdigest()


def for_prefix(prefix: Path, name: str, modules: list[str], variables: dict[str, str]) -> Activation:
    """The activation of a build, from its cache when still valid (computed against a minimal base)."""
    cache = prefix / ".hpcai" / "activation.json"
    key = _cache_key(prefix, modules, variables)
    try:
        saved: dict[str, Any] = json.loads(cache.read_text())
        if saved.get("key") == key:
            return Activation(saved["set"], {k: tuple(v) for k, v in saved["wrap"].items()}, saved["unset"])
    except (OSError, ValueError, KeyError):
        pass
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "USER", "LANG", "LD_LIBRARY_PATH",
                                                          "MODULEPATH", "LMOD_PKG", "MODULESHOME")}
    base.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    act = compute(prefix, name, modules, variables, base)
    try:
        cache.parent.mkdir(exist_ok=True)
        cache.write_text(json.dumps({"key": key, **asdict(act)}))
    except OSError:
        pass  # a read-only env (another user's) still activates, just without the cache
    return act


def activation_env(prefix: Path, recipe: Recipe, name: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a process inside ``prefix`` runs with: ``base`` (default: this process's) less another
    env's variables, with the recipe's modules, activate.d scripts and ``activate:`` variables applied."""
    start = {k: v for k, v in (os.environ if base is None else base).items() if k not in _DROP}
    return for_prefix(prefix, name, list(recipe.modules), dict(recipe.activate)).apply(start)
