"""The conda layer, solved and installed with py-rattler (no conda needed), its files hardlinked from
rattler's package cache where the cache and the prefix share a filesystem.

The install runs in a child process: py-rattler has been seen to abort the interpreter at exit
after an install, and a crash there must not take the build with it. The child writes its result
to a file before it exits; the parent trusts that file and the conda-meta records, not the exit code.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import HPCAIError
from ..proc import run_logged


def channel_url(channel: str) -> str:
    """A channel name, URL or local path as rattler takes it (local paths become file:// URLs)."""
    return Path(channel).absolute().as_uri() if channel.startswith(("/", "./", "../")) else channel


def pinned_specs(records: list[dict[str, Any]]) -> list[str]:
    """Exact specs (`name ==version build`) reproducing an installed package set."""
    return [f"{r['name']} =={r['version']} {r['build']}" for r in records]


def installed(prefix: Path) -> list[dict[str, Any]]:
    """The conda packages installed in ``prefix``, from its conda-meta records."""
    meta = prefix / "conda-meta"
    return sorted((json.loads(p.read_text()) for p in meta.glob("*.json")), key=lambda r: r["name"]) if meta.is_dir() else []


def owned_files(prefix: Path) -> dict[str, str]:
    """Every file a conda package installed: relative path -> package name."""
    return {f: r["name"] for r in installed(prefix) for f in r.get("files", [])}


def install(prefix: Path, channels: list[str], specs: list[str], *, cache: Path, log: Path, timeout: float = 3600,
            on_output: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Solve ``specs`` against ``channels`` and install the result into ``prefix``."""
    result = prefix.parent / f".{prefix.name}.conda-result.json"
    request = prefix.parent / f".{prefix.name}.conda-request.json"
    request.write_text(json.dumps({"prefix": str(prefix), "channels": [channel_url(c) for c in channels],
                                   "specs": specs, "cache": str(cache), "result": str(result)}))
    try:
        run_logged([sys.executable, "-m", __name__, request], log=log, timeout=timeout, on_output=on_output)
    except HPCAIError:
        if not result.exists():
            raise
    try:
        outcome = json.loads(result.read_text())
    except (OSError, ValueError):
        raise HPCAIError("the conda layer failed without a result", f"see the log: {log}") from None
    finally:
        result.unlink(missing_ok=True)
        request.unlink(missing_ok=True)
    if "error" in outcome:
        raise HPCAIError(outcome["error"], outcome["hint"])
    records = installed(prefix)
    missing = set(outcome["names"]) - {r["name"] for r in records}
    if missing:
        raise HPCAIError(f"the conda layer did not install {', '.join(sorted(missing))}", f"see the log: {log}")
    return records


def solve(channels: list[str], specs: list[str]) -> list[dict[str, Any]]:
    """Solve without installing: the packages (name, version, build, channel) an install would get."""
    import rattler

    records = asyncio.run(_solve(rattler, [channel_url(c) for c in channels], specs))
    return [{"name": r.name.normalized, "version": str(r.version), "build": r.build, "channel": str(r.channel)}
            for r in records]


async def _solve(rattler: Any, channels: list[str], specs: list[str]) -> list[Any]:
    try:
        return await rattler.solve(
            channels, specs, platforms=[rattler.Subdir.current(), "noarch"],
            virtual_packages=rattler.VirtualPackage.detect(), add_pip_as_python_dependency=True,
        )
    except Exception as err:  # rattler raises its own exception types, one per failure kind
        raise _explain(err, channels, specs) from None


def _explain(err: Exception, channels: list[str], specs: list[str]) -> HPCAIError:
    kind, text = type(err).__name__, str(err).strip()
    if kind == "SolverError":
        return HPCAIError(f"the conda specs cannot be satisfied from {', '.join(channels)}:\n{text}",
                          "relax or fix the specs named above, or add the channel that has them")
    if kind in ("GatewayError", "FetchRepoDataError", "IoError") or "channel" in text.lower():
        return HPCAIError(f"cannot read a conda channel ({', '.join(channels)}):\n{text}",
                          "check the channel URL or path, and that this machine can reach it (or use a local mirror)")
    if kind in ("InvalidMatchSpecError", "ParseMatchSpecError") or "matchspec" in text.lower():
        return HPCAIError(f"bad conda spec in {specs}: {text}", "write specs like `numpy>=1.26` or `nccl=2.18`")
    return HPCAIError(f"the conda layer failed ({kind}): {text}", "see the message above")


async def _install(request: dict[str, Any]) -> list[str]:
    import rattler

    records = await _solve(rattler, request["channels"], request["specs"])
    print(f"conda layer: solved {len(records)} packages", flush=True)
    await rattler.install(records, target_prefix=request["prefix"], cache_dir=Path(request["cache"]), show_progress=False)
    return [r.name.normalized for r in records]


def _main(argv: list[str]) -> None:
    request = json.loads(Path(argv[0]).read_text())
    print(f"conda layer: solving {request['specs']} from {request['channels']}", flush=True)
    try:
        outcome: dict[str, Any] = {"names": asyncio.run(_install(request))}
        print(f"conda layer: installed {', '.join(outcome['names'])}", flush=True)
    except HPCAIError as err:
        outcome = {"error": err.message, "hint": err.hint}
        print(f"conda layer failed: {err}", flush=True)
    Path(request["result"]).write_text(json.dumps(outcome))
    sys.exit(0 if "names" in outcome else 2)


if __name__ == "__main__":
    _main(sys.argv[1:])
