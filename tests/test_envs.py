"""The environment builder: conda layer first (py-rattler, local channel), then pip; verify; lock; no loss."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from condachan import index, make_package
from jupyter_hpcai.envs import Builder, EnvStore, activated, load_recipe, parse_recipe
from jupyter_hpcai.envs.check import check
from jupyter_hpcai.envs.conda import solve
from jupyter_hpcai.envs.store import Env
from jupyter_hpcai.errors import HPCAIError
from jupyter_hpcai.proc import wait_until

REPO = Path(__file__).resolve().parents[1]
HPCAI = str(Path(sys.executable).parent / "hpcai")


def _python_in(env: Env, code: str) -> str:
    build, environ = activated(env)
    out = subprocess.run([str(build.python), "-c", code], env=environ, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_build_activates_and_imports(small_env: Env) -> None:
    build = small_env.current()
    assert build is not None
    manifest = build.manifest()
    assert manifest is not None
    assert {p["name"] for p in manifest["conda"]} == {"hpcai-test-activate", "hpcai-test-lib", "hpcai-test-six"}
    assert [p["name"] for p in manifest["pip"]] == ["six"]
    assert set(manifest["phase_seconds"]) >= {"conda", "python", "pip", "verify"}
    assert [s["step"] for s in manifest["verify"]] == ["import six", "hpcai-test-tool.sh"]
    # conda-meta records exist for every conda package, as conda itself writes them
    assert len(list((build.prefix / "conda-meta").glob("hpcai-test-*.json"))) == 3
    out = _python_in(small_env, "import os, sys, ctypes, six; "
                     "print(sys.prefix, os.environ['HPCAI_TEST_ACTIVATED'], os.environ['CONDA_PREFIX'], "
                     "ctypes.CDLL('libhpcaitest.so').hpcai_answer())")
    prefix, activated, conda_prefix, answer = out.split()
    assert Path(prefix).resolve() == build.prefix.resolve() and Path(conda_prefix) == build.prefix
    assert (activated, answer) == ("yes", "42")


def test_pip_overwriting_conda_files_is_reported(small_env: Env) -> None:
    manifest = small_env.current().manifest()  # type: ignore[union-attr]
    assert manifest["conflicts"] == [
        "pip package six overwrote 1 file(s) of conda package hpcai-test-six (e.g. lib/python3.11/site-packages/six.py)"
    ]


def test_unchanged_recipe_is_up_to_date(small_env: Env, small_recipe: Path, env_store: EnvStore) -> None:
    result = Builder(load_recipe(small_recipe), store=env_store).run()
    assert result.up_to_date and result.build == small_env.current()


def test_lock_reproduces_the_same_package_set(small_env: Env, small_recipe: Path, env_store: EnvStore,
                                              bench: list[str]) -> None:
    build = small_env.current()
    assert build is not None
    first = build.manifest()
    start = time.monotonic()
    copy = Builder(load_recipe(small_recipe), store=env_store, name="small-locked", locked=build.lock()).run()
    seconds = time.monotonic() - start
    again = copy.build.manifest()
    assert again is not None and again["locked"]
    key = lambda m: ({(p["name"], p["version"], p["build"]) for p in m["conda"]},  # noqa: E731
                     {(p["name"], p["version"]) for p in m["pip"]})
    assert key(again) == key(first)
    first_seconds = sum(first["phase_seconds"].values())
    bench.append(f"env build: locked rebuild with warm caches {seconds:.1f} s / first build {first_seconds:.1f} s "
                 f"= {seconds / first_seconds:.2f}")


def test_conda_change_after_pip_is_refused_then_rebuilt(small_env: Env, small_recipe: Path, env_store: EnvStore,
                                                        tmp_path: Path) -> None:
    Builder(load_recipe(small_recipe), store=env_store, name="order").run()
    env = env_store.env("order")
    before = env.current()
    changed = tmp_path / "changed.yaml"
    changed.write_text(small_recipe.read_text().replace("hpcai-test-lib=1.0", "hpcai-test-lib=2.0"))
    with pytest.raises(HPCAIError, match="already has a pip layer") as err:
        Builder(load_recipe(changed), store=env_store, name="order").run()
    assert "--rebuild" in err.value.hint
    assert env.current() == before
    rebuilt = Builder(load_recipe(changed), store=env_store, name="order", rebuild=True).run()
    assert rebuilt.build != before
    versions = {p["name"]: p["version"] for p in rebuilt.build.manifest()["conda"]}  # type: ignore[index]
    assert versions["hpcai-test-lib"] == "2.0"
    assert [p["name"] for p in rebuilt.build.manifest()["pip"]] == ["six"]  # type: ignore[index]


def test_pip_only_change_keeps_the_conda_layer(small_env: Env, small_recipe: Path, env_store: EnvStore,
                                               tmp_path: Path) -> None:
    Builder(load_recipe(small_recipe), store=env_store, name="piponly").run()
    env = env_store.env("piponly")
    old = env.current().manifest()  # type: ignore[union-attr]
    changed = tmp_path / "pip.yaml"
    changed.write_text(small_recipe.read_text().replace("six==1.16.0", "six==1.17.0"))
    new = Builder(load_recipe(changed), store=env_store, name="piponly").run().build.manifest()
    assert new["conda"] == old["conda"]  # type: ignore[index]
    assert {p["name"]: p["version"] for p in new["pip"]}["six"] == "1.17.0"  # type: ignore[index]


# -- nothing is lost -------------------------------------------------------------------------------

BLOCKING_BACKEND = '''
import os, time
def get_requires_for_build_wheel(config_settings=None):
    return []
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    open(os.environ["HPCAI_TEST_STARTED"], "w").close()
    while True:  # blocks until the build is killed
        time.sleep(0.1)
'''


def blocking_recipe(small_recipe: Path, tmp_path: Path) -> Path:
    """The small recipe plus a local package whose build blocks (after touching $HPCAI_TEST_STARTED)."""
    project = tmp_path / "blocker"
    project.mkdir()
    (project / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                                            'backend-path = ["."]\n[project]\nname = "blocker"\nversion = "1"\n')
    (project / "backend.py").write_text(BLOCKING_BACKEND)
    recipe = tmp_path / "blocking.yaml"
    recipe.write_text(small_recipe.read_text().replace("pip: [six==1.16.0]", f"pip: [six==1.16.0, {project}]"))
    return recipe


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
def test_interrupted_build_keeps_the_previous_env(small_env: Env, small_recipe: Path, env_store: EnvStore,
                                                  tmp_path: Path, sig: signal.Signals) -> None:
    name = f"interrupt-{sig.name.lower()}"
    Builder(load_recipe(small_recipe), store=env_store, name=name).run()
    env = env_store.env(name)
    before = env.current()
    recipe = blocking_recipe(small_recipe, tmp_path)
    started = tmp_path / "started"
    build = subprocess.Popen([HPCAI, "env", "build", str(recipe), "--name", name], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True,
                             env={**os.environ, "HPCAI_ENV_ROOT": str(env_store.root), "HPCAI_TEST_STARTED": str(started)})
    try:
        wait_until(started.exists, timeout=120, what="the pip layer to reach the blocking package")
        os.killpg(build.pid, sig)
        output, _ = build.communicate(timeout=60)
    finally:
        if build.poll() is None:
            os.killpg(build.pid, signal.SIGKILL)
    assert build.returncode != 0
    assert env.current() == before, "current must not move"
    assert check(env), "the previous env still verifies"
    if sig == signal.SIGINT:
        assert "interrupted" in output and "is still current" in output and "log:" in output, output
        assert "Traceback" not in output
        assert [b.id for b in env.builds()] == [before.id]  # type: ignore[union-attr]
    else:  # a killed build leaves its prefix; the next build of the env clears it away
        assert len(env.builds()) == 2
        Builder(load_recipe(small_recipe), store=env_store, name=name).run()
        assert [b.id for b in env.builds()] == [before.id]  # type: ignore[union-attr]


def test_logs_are_private(small_env: Env) -> None:
    logs = small_env.dir / "logs"
    assert logs.stat().st_mode & 0o777 == 0o700
    assert {p.stat().st_mode & 0o777 for p in logs.iterdir()} == {0o600}


# -- bad recipes: one clear error naming the fix, no traceback ---------------------------------------

def _cli_error(recipe_text: str, tmp_path: Path, env_store: EnvStore) -> str:
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(recipe_text)
    done = subprocess.run([HPCAI, "env", "build", str(recipe)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HPCAI_ENV_ROOT": str(env_store.root), "COLUMNS": "300"})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "hint:" in done.stdout
    return " ".join(done.stdout.split())


def test_unknown_key(tmp_path: Path, env_store: EnvStore) -> None:
    out = _cli_error("name: x\npython: /usr/bin/python3\npips: [six]\n", tmp_path, env_store)
    assert "pips: unknown key (allowed: name, conda, python, pip," in out


def test_unreachable_channel(tmp_path: Path, env_store: EnvStore) -> None:
    out = _cli_error("name: x\nconda: {channels: [/nonexistent/channel], specs: [zlib]}\n", tmp_path, env_store)
    assert "cannot read a conda channel" in out and "check the channel URL or path" in out


def test_unsatisfiable_spec(tmp_path: Path, env_store: EnvStore, conda_channel: Path) -> None:
    out = _cli_error(f"name: x\nconda: {{channels: [{conda_channel}], specs: [hpcai-test-lib>=9]}}\n", tmp_path, env_store)
    assert "cannot be satisfied" in out and "hpcai-test-lib" in out and "relax or fix the specs" in out


def test_pip_failure(tmp_path: Path, env_store: EnvStore) -> None:
    out = _cli_error("name: x\npython: /usr/bin/python3\npip: [hpcai-no-such-package-anywhere==1.0]\n", tmp_path, env_store)
    assert "pip" in out and "hpcai-no-such-package-anywhere" in out and "full log:" in out
    assert "env 'x' is unchanged" in out


@pytest.mark.parametrize(("text", "message"), [
    ("name: 'bad name'\n", "name: String should match pattern"),
    ("name: x\npip: [six]\n", "the pip layer needs a python"),
    ("name: x\npython: python3\n", "must be an absolute path"),
    ("name: x\npython: /usr/bin/python3\npip: [six]\nno_build_isolation: [horovod]\n", "no_build_isolation names"),
    ("name: x\nbuild_env: {A: \"1\\n#SBATCH --x\"}\n", "build_env.A: must be one line"),
    ("name: x\nconda: {channels: [c], specs: [python=3.11]}\npython: /usr/bin/python3\n", "choose one python"),
    ("- a list\n", "must be a YAML mapping"),
    ("name: [unclosed\n", "not valid YAML"),
])
def test_recipe_validation_messages(text: str, message: str) -> None:
    with pytest.raises(HPCAIError) as err:
        parse_recipe(text)
    assert message in str(err.value)


# -- shipped recipes ---------------------------------------------------------------------------------

NCCL_STAND_INS = {  # name: (version, depends) -- stand-ins of the conda-forge packages, empty inside
    "python": ("3.11.9", ("pip",)), "pip": ("24.0", ()), "cuda-version": ("12.2", ()),
    "cuda-nvcc": ("12.2.140", ("cuda-version",)), "cuda-cudart-dev": ("12.2.140", ("cuda-version",)),
    "cudnn": ("8.9.7.29", ()), "nccl": ("2.18.5.1", ()), "openmpi": ("4.1.6", ()), "mpi4py": ("3.1.5", ("openmpi",)),
    "cmake": ("3.27.9", ()), "gxx_linux-64": ("12.3.0", ()),
}


def test_nccl_recipe_parses_and_solves_against_stand_ins(tmp_path: Path) -> None:
    recipe = load_recipe(REPO / "recipes" / "tf-horovod-nccl.yaml")
    assert recipe.build_env["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert recipe.no_build_isolation == ["horovod"] and recipe.conda is not None
    channel = tmp_path / "forge"
    for name, (version, depends) in NCCL_STAND_INS.items():
        make_package(channel, name, version, {}, depends=depends)
    make_package(channel, "nccl", "2.12.1", {})  # too old for the recipe: must not be picked
    index(channel)
    solved = {r["name"]: r["version"] for r in solve([str(channel)], list(recipe.conda.specs))}
    assert solved == {n: v for n, (v, _) in NCCL_STAND_INS.items()}


def test_cpu_recipe_parses() -> None:
    recipe = load_recipe(REPO / "recipes" / "tf-horovod-cpu.yaml")
    isolated, later = recipe.pip_installs()
    assert later == ["horovod==0.28.1"] and "tensorflow-cpu==2.15.1" in isolated
    assert f"-e {REPO}" in isolated  # jupyter_hpcai itself, editable from this checkout


@pytest.mark.slow
def test_tf_horovod_cpu_env_verifies_gloo_and_mpi(tf_env: Env) -> None:
    manifest = tf_env.current().manifest()  # type: ignore[union-attr]
    check_build = next(s["output"] for s in manifest["verify"] if s["step"] == "horovodrun --check-build")
    for line in ("[X] TensorFlow", "[X] MPI", "[X] Gloo"):
        assert line in check_build
    assert {"tensorflow-cpu": "2.15.1", "horovod": "0.28.1"}.items() <= {
        p["name"]: p["version"] for p in manifest["pip"]}.items()
    assert [s.step for s in check(tf_env)][-1] == "horovodrun --check-build"
