"""`hpcai bench resnet50` end to end at tiny sizes (1 and 2 ranks, 2 steps): outputs parse; numbers are not asserted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyter_hpcai.bench.stamp import gpus

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


@pytest.mark.slurm
@pytest.mark.slow
def test_resnet50_tiny_end_to_end(devcluster, tf_env, tmp_path: Path, bench: list[str]) -> None:  # type: ignore[no-untyped-def]
    results = tmp_path / "results"
    done = subprocess.run([str(Path(sys.executable).parent / "hpcai"), "bench", "resnet50", "--env", tf_env.name,
                           "--nodes", "2", "--gpus-per-node", "1", "--ranks", "1,2", "--batch", "2", "--steps", "2",
                           "--warmup", "1", "--results", str(results)],
                          capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "HPCAI_ENV_ROOT": str(tf_env.root.path), "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    data = json.loads((results / "results.json").read_text())
    assert sorted((r["mode"], r["ranks"]) for r in data["rows"]) == [
        ("horovod_run", 1), ("horovod_run", 2), ("srun", 1), ("srun", 2)]
    assert all(r["images_per_sec"] > 0 and r["efficiency"] > 0 for r in data["rows"])
    table = (results / "results.md").read_text()
    assert "| launch | ranks | images/sec total |" in table and table.count("\n| ") == 5
    head = subprocess.run(["git", "-C", str(ARTIFACTS.parent), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, timeout=30).stdout.strip()
    made = table.splitlines()[0]  # stamped: when, at which commit, on what machine
    assert time.strftime("%Y-%m-%d", time.gmtime()) in made and f"commit {head}" in made, made
    assert f"{os.cpu_count()} cores, {gpus()})" in made and "job " in made, made
    assert (results / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ARTIFACTS.mkdir(exist_ok=True)
    for name in ("results.md", "scaling.png", "results.json"):
        shutil.copy(results / name, ARTIFACTS / f"bench-{name}")
    two = next(r for r in data["rows"] if r["mode"] == "horovod_run" and r["ranks"] == 2)
    bench.append(f"ResNet-50 tiny (batch 2, 2 steps): %%horovod_run / srun at 2 ranks = {two['magic_over_srun']:.2f}")


@pytest.mark.slurm
@pytest.mark.slow
def test_resnet50_torch_backend_tiny(devcluster, torch_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    results = tmp_path / "results"
    done = subprocess.run([str(Path(sys.executable).parent / "hpcai"), "bench", "resnet50", "--env", torch_env.name,
                           "--framework", "torch", "--nodes", "2", "--gpus-per-node", "1", "--ranks", "1,2",
                           "--batch", "2", "--steps", "2", "--warmup", "1", "--image-size", "64",
                           "--results", str(results)],
                          capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "HPCAI_ENV_ROOT": str(torch_env.root.path), "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    data = json.loads((results / "results.json").read_text())
    assert sorted((r["mode"], r["ranks"]) for r in data["rows"]) == [("srun", 1), ("srun", 2), ("torchrun", 1),
                                                                      ("torchrun", 2)]
    assert {r["parameters"] for r in data["rows"]} == {25_557_032}  # ResNet-50's parameter count
    assert "| torchrun | 2 |" in (results / "results.md").read_text()


@pytest.mark.slurm
@pytest.mark.slow
def test_overhead_ratios_in_one_job(devcluster, tf_env, tmp_path: Path, bench: list[str]) -> None:  # type: ignore[no-untyped-def]
    results = tmp_path / "overhead"
    done = subprocess.run([str(Path(sys.executable).parent / "hpcai"), "bench", "overhead", "--env", tf_env.name,
                           "--nodes", "2", "--gpus-per-node", "1", "--breakdown", "--results", str(results)],
                          capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "HPCAI_ENV_ROOT": str(tf_env.root.path), "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    found = json.loads((results / "overhead.json").read_text())
    assert found["ranks"] == 2 and all(len(runs) == 3 and min(runs) > 0 for runs in found["samples"].values())
    assert all(len(runs) == 20 for runs in found["dispatch_samples"].values())
    phases = found["breakdown"]  # the median run's phases, each when its last rank ended it
    causal = ["launcher started", "srun step start (rank processes exist)", "python start",
              "imports (pin, network, ipyparallel)", "all registered", "rank table + preflight data",
              "first %%horovod_run done (Horovod ready)"]
    assert [phases[name] for name in causal] == sorted(phases[name] for name in causal), phases  # each after its cause
    done = phases["first %%horovod_run done (Horovod ready)"]
    assert phases["controller up"] <= phases["all registered"] and phases["framework import + init (on the ranks, at boot)"] <= done
    assert abs(done - found["engines_ready_s"]) < 0.5 * found["engines_ready_s"]
    table = (results / "overhead.md").read_text()
    assert "provisioner / plain ipykernel" in table and "ipyparallel's MPI launcher" in table
    assert "| controller up |" in table  # --breakdown
    bench.append("bench overhead, where the time to Horovod-ready engines goes: " + ", ".join(
        f"{phase} {at:.2f} s" for phase, at in phases.items()))
    bench.append("bench overhead: " + " ; ".join(
        f"{line.split('|')[1].strip()} = {line.split('|')[4].strip()}" for line in table.splitlines()[2:6]))


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a first build compiles Horovod (4-5 minutes here), then 6 builds and 6 pip layers
def test_env_rebuild_benchmark(tf_env, tmp_path: Path, bench: list[str]) -> None:  # type: ignore[no-untyped-def]
    """tf-horovod-cpu: a first build (Horovod compiled), then, alternating, rebuilds from the lock and with one pip
    package added, and uv against pip for its pip layer. Printed as ratios; each build is real (it verifies)."""
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "tf-horovod-cpu.yaml"
    done = subprocess.run([sys.executable, "-m", "jupyter_hpcai.bench.rebuild", str(recipe), "--root", str(tmp_path),
                           "--times", "2"], capture_output=True, text=True, timeout=1700)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [ln.strip() for ln in done.stdout.splitlines() if "=" in ln or ln.startswith("env rebuilds")]
    assert len(lines) == 4 and lines[0].startswith("env rebuilds of tf-horovod-cpu"), done.stdout
    from jupyter_hpcai.envs import EnvStore

    built = EnvStore.at(tmp_path / "envs").get("tf-horovod-cpu")
    assert built.manifest.recipe_hash == EnvStore.at(tf_env.root.path).get("tf-horovod-cpu").manifest.recipe_hash
    bench.extend(lines)
