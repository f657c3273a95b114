"""The pip layer: installed with the prefix's own python, after the conda layer, never before it."""

from __future__ import annotations

import json
import platform
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import HPCAIError
from ..proc import run, run_logged
from . import conda


# What pip prints when the index cannot be reached at all (no route, no DNS), as opposed to a missing package.
UNREACHABLE = ("Failed to establish a new connection", "Temporary failure in name resolution", "Network is unreachable")


def install(python: Path, requirements: list[str], *, env: dict[str, str], log: Path, no_build_isolation: bool = False,
            no_deps: bool = False, on_output: Callable[[str], None] | None = None) -> None:
    """pip install requirement lines into the prefix that ``python`` belongs to (upgrade only if needed)."""
    with tempfile.NamedTemporaryFile("w", suffix="-requirements.txt", dir=log.parent) as reqs:
        reqs.write("".join(f"{line}\n" for line in requirements))
        reqs.flush()
        with open(log, "a") as out:
            out.write(f"requirements: {requirements}\n")
        cmd = [str(python), "-m", "pip", "install", "--upgrade-strategy", "only-if-needed", "--progress-bar", "off"]
        cmd += ["--no-build-isolation"] * no_build_isolation + ["--no-deps"] * no_deps
        try:
            run_logged([*cmd, "-r", reqs.name], log=log, timeout=3600, env=env, on_output=on_output)
        except HPCAIError as err:
            if any(sign in err.message for sign in UNREACHABLE):
                raise HPCAIError(err.message, f"{platform.node()} cannot reach the package index (compute nodes often "
                                 "cannot): set PIP_INDEX_URL to a mirror it reaches, or PIP_FIND_LINKS to a wheelhouse "
                                 "on a shared filesystem with PIP_NO_INDEX=1, or build on the login node (--here)"
                                 + (f"; {err.hint}" if err.hint else "")) from None
            raise


def inspect(python: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """Every distribution in the prefix: name, version, installer, direct URL, files."""
    report = json.loads(run([str(python), "-m", "pip", "inspect", "--local"], env=env, timeout=300).stdout)
    dists = []
    for item in report["installed"]:
        meta = item["metadata"]
        direct = item.get("direct_url") or {}
        dists.append({"name": meta["name"], "version": meta["version"], "installer": item.get("installer", ""),
                      "url": direct.get("url"), "editable": direct.get("dir_info", {}).get("editable", False),
                      "location": item.get("metadata_location", "")})
    return sorted(dists, key=lambda d: d["name"].lower())


def pip_installed(dists: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The distributions pip installed (not conda's, not the interpreter's own)."""
    return [d for d in dists if d["installer"] == "pip" and d["name"] not in ("pip", "setuptools", "wheel")]


def lock_lines(dists: list[dict[str, Any]]) -> list[str]:
    """Requirement lines that reinstall exactly these distributions."""
    def line(d: dict[str, Any]) -> str:
        if d["editable"]:
            return f"-e {d['url'].removeprefix('file://')}"
        return f"{d['name']} @ {d['url']}" if d["url"] else f"{d['name']}=={d['version']}"

    return [line(d) for d in pip_installed(dists)]


def snapshot(prefix: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file a conda package owns, to see later what pip overwrote."""
    out = {}
    for rel in conda.owned_files(prefix):
        try:
            st = (prefix / rel).stat()
            out[rel] = (st.st_size, st.st_mtime_ns)
        except OSError:
            continue
    return out


def overwritten(prefix: Path, before: dict[str, tuple[int, int]], dists: list[dict[str, Any]]) -> list[str]:
    """Conda-owned files that the pip layer changed or removed, grouped by pip and conda package."""
    owners = conda.owned_files(prefix)
    changed = {rel for rel, sig in before.items() if not (prefix / rel).exists()
               or ((prefix / rel).stat().st_size, (prefix / rel).stat().st_mtime_ns) != sig}
    if not changed:
        return []
    by_pip: dict[str, str] = {}
    for d in pip_installed(dists):
        record = Path(d["location"]) / "RECORD"
        if record.exists():
            site = Path(d["location"]).parent
            for line in record.read_text().splitlines():
                rel = line.split(",", 1)[0]
                full = (site / rel).resolve()
                if full.is_relative_to(prefix.resolve()):
                    by_pip[str(full.relative_to(prefix.resolve()))] = d["name"]
    reports: dict[tuple[str, str], list[str]] = {}
    for rel in sorted(changed):
        reports.setdefault((by_pip.get(rel, "an unknown pip package"), owners[rel]), []).append(rel)
    return [f"pip package {pip_name} overwrote {len(files)} file(s) of conda package {conda_name} (e.g. {files[0]})"
            for (pip_name, conda_name), files in sorted(reports.items())]
