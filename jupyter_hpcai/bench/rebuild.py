"""How fast an env rebuilds, against its first build in the same run: from its lock, with one pip package added,
and the pip layer by uv against pip.

    python -m jupyter_hpcai.bench.rebuild RECIPE --root DIR [--times 3] [--add PACKAGE]

The first build goes into DIR with a build cache of its own (so Horovod, or any no_build_isolation package,
compiles), while downloads come from the usual caches. The other builds alternate, several times each, and
the ratios use their medians (the machine is noisy). Every build is a real one: it verifies, and `current` moves.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..envs import Builder, EnvStore, load_recipe
from ..envs.pip import installer
from .stamp import stamp


def _timed(build: Builder) -> float:
    start = time.perf_counter()
    build.run()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", type=Path)
    parser.add_argument("--root", type=Path, required=True, help="A folder for the benchmark's envs and build cache.")
    parser.add_argument("--times", type=int, default=3)
    parser.add_argument("--add", default="tabulate", help="The pip package added to the recipe.")
    args = parser.parse_args(argv)
    os.environ["HPCAI_CACHE_DIR"] = str(args.root / "cache")  # no compiled wheel from earlier builds
    store = EnvStore(args.root / "envs", site=[])
    recipe = load_recipe(args.recipe)
    grown_path = args.root / f"{recipe.name}-plus-{args.add}.yaml"
    grown_path.write_text(args.recipe.read_text().replace("\npip:\n", f"\npip:\n  - {args.add}\n", 1))
    grown = load_recipe(grown_path)
    grown = grown.model_copy(update={"base_dir": recipe.base_dir})  # its local paths as the original's
    if args.add not in grown.pip:
        raise SystemExit(f"cannot add {args.add}: the recipe has no block-style `pip:` list")

    first = _timed(Builder(recipe, store=store))
    env = store.env(recipe.name)
    locked, added, removed = [], [], []
    for _ in range(args.times):
        current = env.current()
        assert current is not None
        locked.append(_timed(Builder(recipe, store=store, locked=current.lock())))
        added.append(_timed(Builder(grown, store=store)))
        removed.append(_timed(Builder(recipe, store=store)))

    current = env.current()
    assert current is not None and current.lock() is not None
    lines = [ln for ln in current.lock().pip  # type: ignore[union-attr]
             if not ln.startswith("-e ") and ln.split("==")[0] not in recipe.no_build_isolation]
    seconds: dict[str, list[float]] = {"uv": [], "pip": []}
    with tempfile.TemporaryDirectory(dir=args.root) as tmp:
        for round_ in range(args.times + 1):  # round 0 warms both caches and is not counted
            for name in ("uv", "pip"):
                prefix = Path(tmp) / f"{name}-{round_}"
                subprocess.run([str(recipe.python or sys.executable), "-m", "venv", str(prefix)], check=True,
                               timeout=300)
                start = time.perf_counter()
                installer(name, prefix / "bin" / "python", dict(os.environ)).install(
                    lines, log=Path(tmp) / f"{name}.log")
                if round_:
                    seconds[name].append(time.perf_counter() - start)
                subprocess.run(["rm", "-rf", str(prefix)], check=True, timeout=300)

    def each(values: list[float]) -> str:
        return ", ".join(f"{v:.1f}" for v in values) + " s"

    med = statistics.median
    out = [
        f"env rebuilds of {recipe.name} ({stamp()}): first build {first:.1f} s (no_build_isolation packages compiled, "
        "downloads cached)",
        f"  rebuild from the lock, warm caches / first build = {med(locked) / first:.3f} ({each(locked)})",
        f"  one pip package ({args.add}) added / first build = {med(added) / first:.3f} ({each(added)}; removed again: "
        f"{each(removed)})",
        f"  the pip layer ({len(lines)} packages) into an empty prefix, warm caches, no bytecode: uv / pip = "
        f"{med(seconds['uv']) / med(seconds['pip']):.3f} (uv {each(seconds['uv'])}; pip {each(seconds['pip'])})",
    ]
    print("\n".join(out), flush=True)
    return out


if __name__ == "__main__":
    main()
