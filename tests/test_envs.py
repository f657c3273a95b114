"""The environment builder: conda layer first (py-rattler, local channel), then pip; verify; lock; no loss."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import pytest

from helpers.channel import index, make_package
from helpers.envs import shipped_env_held
from jupyter_hpcai.envs import Builder, EnvDir, EnvStore, Event, PrefixEnv, load_recipe, open_env, parse_recipe
from jupyter_hpcai.envs.manifest import Lock, PrefixManifest
from jupyter_hpcai.envs import pip
from jupyter_hpcai.envs.conda import solve
from jupyter_hpcai.errors import HPCAIError
from jupyter_hpcai.proc import wait_until

REPO = Path(__file__).resolve().parents[1]
HPCAI = str(Path(sys.executable).parent / "hpcai")
ANSI_CODES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _python_in(env: EnvDir, code: str) -> str:
    opened = open_env(env)
    out = subprocess.run([str(opened.build.python), "-c", code], env=opened.environ(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_build_activates_and_imports(small_env: EnvDir) -> None:
    build = small_env.current()
    assert build is not None
    manifest = build.manifest()
    assert manifest is not None
    assert {p.name for p in manifest.conda} == {"hpcai-test-activate", "hpcai-test-lib", "hpcai-test-six"}
    assert [p.name for p in manifest.pip] == ["six"]
    assert set(manifest.phase_seconds) >= {"conda", "python", "pip", "verify"}
    assert [s.step for s in manifest.verify] == ["import six", "hpcai-test-tool.sh"]
    # conda-meta records exist for every conda package, as conda itself writes them
    assert len(list((build.prefix / "conda-meta").glob("hpcai-test-*.json"))) == 3
    out = _python_in(small_env, "import os, sys, ctypes, six; "
                     "print(sys.prefix, os.environ['HPCAI_TEST_ACTIVATED'], os.environ['CONDA_PREFIX'], "
                     "ctypes.CDLL('libhpcaitest.so').hpcai_answer())")
    prefix, activated, conda_prefix, answer = out.split()
    assert Path(prefix).resolve() == build.prefix.resolve() and Path(conda_prefix) == build.prefix
    assert (activated, answer) == ("yes", "42")


def test_pip_overwriting_conda_files_is_reported(small_env: EnvDir) -> None:
    manifest = small_env.current().manifest()  # type: ignore[union-attr]
    assert manifest.conflicts == [
        "pip package six overwrote 1 file(s) of conda package hpcai-test-six (e.g. lib/python3.11/site-packages/six.py)"
    ]


def test_unchanged_recipe_is_up_to_date(small_env: EnvDir, small_recipe: Path, env_store: EnvStore) -> None:
    result = Builder(load_recipe(small_recipe), store=env_store).run()
    assert result.up_to_date and result.build == small_env.current()


def test_lock_reproduces_the_same_package_set(small_env: EnvDir, small_recipe: Path, env_store: EnvStore,
                                              bench: list[str]) -> None:
    build = small_env.current()
    assert build is not None
    first = build.manifest()
    start = time.monotonic()
    copy = Builder(load_recipe(small_recipe), store=env_store, name="small-locked", locked=build.lock()).run()
    seconds = time.monotonic() - start
    again = copy.build.manifest()
    assert again is not None and again.locked
    key = lambda m: ({(p.name, p.version, p.build) for p in m.conda},  # noqa: E731
                     {(p.name, p.version) for p in m.pip})
    assert key(again) == key(first)
    first_seconds = sum(first.phase_seconds.values())
    bench.append(f"env build: locked rebuild with warm caches {seconds:.1f} s / first build {first_seconds:.1f} s "
                 f"= {seconds / first_seconds:.2f}")


def test_conda_change_after_pip_is_refused_then_rebuilt(small_env: EnvDir, small_recipe: Path, env_store: EnvStore,
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
    versions = {p.name: p.version for p in rebuilt.build.manifest().conda}  # type: ignore[index]
    assert versions["hpcai-test-lib"] == "2.0"
    assert [p.name for p in rebuilt.build.manifest().pip] == ["six"]  # type: ignore[index]


def test_pip_only_change_keeps_the_conda_layer(small_env: EnvDir, small_recipe: Path, env_store: EnvStore,
                                               tmp_path: Path) -> None:
    Builder(load_recipe(small_recipe), store=env_store, name="piponly").run()
    env = env_store.env("piponly")
    old = env.current().manifest()  # type: ignore[union-attr]
    changed = tmp_path / "pip.yaml"
    changed.write_text(small_recipe.read_text().replace("six==1.16.0", "six==1.17.0"))
    new = Builder(load_recipe(changed), store=env_store, name="piponly").run().build.manifest()
    assert new.conda == old.conda  # type: ignore[index]
    assert {p.name: p.version for p in new.pip}["six"] == "1.17.0"  # type: ignore[index]


def test_adding_a_pip_package_keeps_the_old_build_until_current_moves(small_recipe: Path, env_store: EnvStore,
                                                                     tmp_path: Path) -> None:
    """One package added: a new build next to the old one (uv, from its cache); the old build is current and
    works until the new one verified; then `current` moves."""
    Builder(load_recipe(small_recipe), store=env_store, name="grow").run()
    env = env_store.env("grow")
    old = env.current()
    assert old is not None
    grown = tmp_path / "grown.yaml"
    grown.write_text(small_recipe.read_text().replace("pip: [six==1.16.0]", "pip: [six==1.16.0, idna]"))
    seen: list[tuple[Path, str]] = []

    def during(event: Event) -> None:
        if event.phase == "verify" and event.state == "started":  # the new build is installed, not yet current
            opened = open_env(env)
            done = subprocess.run(opened.argv(["python", "-c", "import six, sys; print(sys.prefix)"]),
                                  env=opened.environ(), capture_output=True, text=True, timeout=60)
            seen.append((Path(done.stdout.strip()), done.stderr))

    result = Builder(load_recipe(grown), store=env_store, name="grow", progress=during).run()
    assert seen and seen[0][0].resolve() == old.prefix.resolve(), seen
    assert env.current() == result.build != old
    manifest = result.build.manifest()
    assert isinstance(manifest, PrefixManifest) and manifest.installer == "uv"
    assert {p.name for p in manifest.pip} == {"six", "idna"}
    assert old.prefix.exists(), "the previous build is kept (prune keeps two)"


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_the_pip_layer_is_compiled_by_the_build_for_either_installer(small_recipe: Path, env_store: EnvStore,
                                                                    installer: str) -> None:
    """The layer's bytecode is the build's step, whichever installer ran (pip is told not to write its own): the
    first build compiles it; a rebuild from the lock by uv takes the build before's .pyc files, linked."""
    said: list[str] = []

    def heard(event: Event) -> None:
        if event.message.startswith("bytecode:"):
            said.append(event.message)

    name = f"bytecode-{installer}"
    first = Builder(load_recipe(small_recipe), store=env_store, name=name, installer=installer, progress=heard).run()
    lock = first.build.lock()
    assert lock is not None
    again = Builder(load_recipe(small_recipe), store=env_store, name=name, installer=installer, locked=lock,
                    progress=heard).run()
    for result in (first, again):
        [six] = result.build.prefix.glob("lib/python3*/site-packages/six.py")
        assert list(six.parent.glob("__pycache__/six.cpython-*.pyc")), f"{installer}: six.py was not compiled"
        assert result.log is not None
        installs = [ln for ln in result.log.read_text().splitlines() if ln.startswith("$ ") and " install " in ln]
        assert installs and all("--no-compile" in ln for ln in installs if " -m pip install " in ln), installs
    reused = [int(m[1]) for m in (re.match(r"bytecode: (\d+) ", s) for s in said) if m]
    assert len(reused) == 2 and reused[0] == 0, said
    assert reused[1] > 0 if installer == "uv" else reused[1] == 0, said  # pip copies files: nothing to link


COMPILED_SETUP = """import os, sys, time
from setuptools import setup
home = os.environ["HPCAI_TEST_LIB_HOME"]
with open("hpcai_test_compiled.py", "w") as module:  # with the prefix's path in it where the test says so
    module.write(f"HOME = {home!r}\\n" if os.environ.get("HPCAI_TEST_EMBED") else "HOME = None\\n")
if "bdist_wheel" in sys.argv:  # one line per time it is built, with the prefix it was built against
    with open(os.environ["HPCAI_TEST_COMPILES"], "a") as out:
        out.write(home + "\\n")
    time.sleep(float(os.environ.get("HPCAI_TEST_COMPILE_SECONDS", "0")))  # as long as a compiler would take
setup(name="hpcai-test-compiled", version="1.0", py_modules=["hpcai_test_compiled"])
"""


def test_bytecode_of_another_python_does_not_count(tmp_path: Path) -> None:
    """A .pyc for another interpreter (a wheel that ships one, or the build before on an older python) is neither
    taken as this one's nor linked: the source is compiled for this python."""
    site = tmp_path / "prefix" / "lib" / "python3.11" / "site-packages"
    (site / "__pycache__").mkdir(parents=True)
    (site / "mod.py").write_text("x = 1\n")
    (site / "__pycache__" / "mod.cpython-39.pyc").write_bytes(b"not this python's")
    before = tmp_path / "before" / "lib" / "python3.11" / "site-packages"
    (before / "__pycache__").mkdir(parents=True)
    os.link(site / "mod.py", before / "mod.py")  # the same source, as uv links it into both builds
    (before / "__pycache__" / "mod.cpython-39.pyc").write_bytes(b"an older python's")
    log = tmp_path / "build.log"
    log.write_text("")
    assert pip.compile_bytecode(Path(sys.executable), tmp_path / "prefix", tmp_path / "before", log) == 0
    assert (site / "__pycache__" / f"mod.{sys.implementation.cache_tag}.pyc").exists()


def _compiled_recipe(conda_channel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> str:
    """A recipe with a no_build_isolation package whose build variable names the prefix (as Horovod's
    HOROVOD_NCCL_HOME: ${CONDA_PREFIX}), from a local sdist; each time it is built, a line in compiles.txt."""
    sdists = tmp_path / "sdists"
    sdists.mkdir(exist_ok=True)
    source = tmp_path / "hpcai-test-compiled-1.0"
    source.mkdir(exist_ok=True)
    (source / "setup.py").write_text(COMPILED_SETUP)
    subprocess.run(["tar", "-czf", str(sdists / "hpcai-test-compiled-1.0.tar.gz"), "-C", str(tmp_path), source.name],
                   check=True, timeout=60)
    monkeypatch.setenv("PIP_FIND_LINKS", str(sdists))
    monkeypatch.setenv("HPCAI_TEST_COMPILES", str(tmp_path / "compiles.txt"))
    monkeypatch.setenv("HPCAI_CACHE_DIR", str(tmp_path / "cache"))
    return f"""name: {name}
conda:
  channels: [{conda_channel}]
  specs: [hpcai-test-lib=1.0]
python: /usr/bin/python3
pip: [wheel, six==1.16.0, hpcai-test-compiled==1.0]
build_env:
  HPCAI_TEST_LIB_HOME: ${{CONDA_PREFIX}}
no_build_isolation: [hpcai-test-compiled]
verify:
  commands:
    - run: python -c "import hpcai_test_compiled as m, sys; print(m.HOME in (None, sys.prefix))"
      expect: ["True"]
"""


@pytest.mark.parametrize("embeds", [False, True], ids=["relocatable", "holds-its-prefix"])
def test_a_package_built_against_the_prefix_is_compiled_again_only_where_it_must(
        conda_channel: Path, env_store: EnvStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        embeds: bool) -> None:
    """The stand-in for Horovod: a pip-only change takes the wheel compiled before, though each build has a prefix
    of its own, unless that wheel holds its prefix's path (as an rpath would, into a build deleted later); a changed
    conda layer compiles it again."""
    if embeds:
        monkeypatch.setenv("HPCAI_TEST_EMBED", "1")
    name = f"compiled-{embeds}".lower()
    text = _compiled_recipe(conda_channel, tmp_path, monkeypatch, name)

    def build(recipe_text: str, rebuild: bool = False) -> Path:
        recipe = tmp_path / f"{name}.yaml"
        recipe.write_text(recipe_text)
        return Builder(load_recipe(recipe), store=env_store, rebuild=rebuild).run().build.prefix

    first = build(text)
    second = build(text.replace("six==1.16.0", "six==1.17.0"))  # the pip layer changes, the conda layer stays
    compiles = tmp_path / "compiles.txt"
    assert compiles.read_text().split() == ([str(first), str(second)] if embeds else [str(first)])
    third = build(text.replace("hpcai-test-lib=1.0", "hpcai-test-lib=2.0"), rebuild=True)
    assert compiles.read_text().split()[-1] == str(third)
    cache = tmp_path / "cache" / "compiled-wheels"
    assert not [p.name for p in cache.iterdir() if p.is_dir() and "-for-" in p.name]  # each build's own is gone
    assert len(list(cache.glob("*/*.whl"))) == 2  # the first build's, then the new conda layer's


def test_two_builds_at_once_compile_once(conda_channel: Path, env_store: EnvStore, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Two envs from one recipe built side by side (two terminals of one user) share the compiled-wheel key: the
    second waits for the first's wheel instead of compiling it too, or writing over it."""
    results: dict[str, Path | BaseException] = {}
    for name in ("twin-a", "twin-b"):
        (tmp_path / f"{name}.yaml").write_text(_compiled_recipe(conda_channel, tmp_path, monkeypatch, name))
    monkeypatch.setenv("HPCAI_TEST_COMPILE_SECONDS", "8")  # the second reaches the pip phase while the first compiles

    def build(name: str) -> None:
        recipe = tmp_path / f"{name}.yaml"
        try:
            results[name] = Builder(load_recipe(recipe), store=env_store).run().log  # type: ignore[assignment]
        except BaseException as err:  # noqa: BLE001 - reported by the assertion below
            results[name] = err

    threads = [threading.Thread(target=build, args=(name,), daemon=True) for name in ("twin-a", "twin-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert all(isinstance(r, Path) for r in results.values()) and len(results) == 2, results
    assert len((tmp_path / "compiles.txt").read_text().split()) == 1
    waited = [r for r in results.values() if "waiting for another build compiling the same wheels" in r.read_text()]
    assert len(waited) == 1, "the two builds did not meet at the compile: the test saw nothing"


def test_a_wheel_holds_its_prefix_only_where_a_process_follows_it(tmp_path: Path) -> None:
    """Real shared objects from gcc: the prefix in the debug info (the headers it was compiled with, as Horovod's
    name TensorFlow's) does not tie the wheel to its prefix; an rpath into it, or any other file naming it, does."""
    prefix = tmp_path / "builds" / "20261206-000000-abcd"
    (prefix / "include").mkdir(parents=True)
    (prefix / "include" / "answer.h").write_text("static inline int answer(void) { return 42; }\n")
    (tmp_path / "lib.c").write_text('#include "answer.h"\nint hpcai_answer(void) { return answer(); }\n')

    def wheel(name: str, files: dict[str, bytes]) -> Path:
        path = tmp_path / f"{name}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as archive:
            for member, data in files.items():
                archive.writestr(member, data)
        Path(f"{path}.built-in").write_text(str(prefix))
        return path

    def shared_object(*flags: str) -> bytes:
        out = tmp_path / "lib.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-g", f"-I{prefix / 'include'}", *flags, "-o", str(out),
                        str(tmp_path / "lib.c")], check=True, timeout=60)
        return out.read_bytes()

    debug_only = shared_object()
    assert str(prefix).encode() in debug_only  # gcc wrote the header's path into the debug info
    assert not pip.holds_where_built(wheel("debug", {"pkg/lib.so": debug_only, "pkg/__init__.py": b"x = 1\n"}))
    assert pip.holds_where_built(wheel("rpath", {"pkg/lib.so": shared_object(f"-Wl,-rpath,{prefix / 'lib'}")}))
    assert pip.holds_where_built(wheel("text", {"pkg/paths.py": f"HOME = {str(prefix)!r}\n".encode()}))
    truncated = debug_only[:0x40] + str(prefix).encode()  # its section table cut off: read as any other file
    assert pip.holds_where_built(wheel("truncated", {"pkg/lib.so": truncated}))
    no_sections = debug_only[:0x3C] + b"\0\0" + debug_only[0x3E:]  # no section headers: no dynamic section found
    assert pip.holds_where_built(wheel("no-sections", {"pkg/lib.so": no_sections}))
    (prefix / "lib").mkdir()
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(prefix / "lib" / "libdep.so"), str(tmp_path / "lib.c"),
                    f"-I{prefix / 'include'}"], check=True, timeout=60)  # no soname: needed by its path
    needing = shared_object("-Wl,--no-as-needed", str(prefix / "lib" / "libdep.so"))
    assert pip.holds_where_built(wheel("needed", {"pkg/lib.so": needing}))
    cut = wheel("cut", {"pkg/__init__.py": b""})
    cut.write_bytes(cut.read_bytes()[:20])  # not whole: built again
    assert pip.holds_where_built(cut)
    unrecorded = wheel("unrecorded", {"pkg/__init__.py": b""})
    Path(f"{unrecorded}.built-in").unlink()
    assert pip.holds_where_built(unrecorded)  # no record of where it was built: built again, to be safe


def test_progress_shows_bars_with_counts_and_a_summary(small_recipe: Path, env_store: EnvStore, tmp_path: Path) -> None:
    """On a terminal, `hpcai env build` shows a bar per phase with packages or steps done of known totals, then one
    line with each phase's time."""
    import pty

    recipe = tmp_path / "bars.yaml"
    recipe.write_text(small_recipe.read_text().replace("name: small", "name: bars"))
    out = bytearray()

    def read(fd: int) -> bytes:
        data = os.read(fd, 65536)
        out.extend(data)
        return data

    status = pty.spawn(["env", f"HPCAI_ENV_ROOT={env_store.root}", "COLUMNS=160", "TERM=xterm", HPCAI, "env", "build",
                        str(recipe)], read)
    text = ANSI_CODES.sub("", out.decode(errors="replace"))
    assert os.waitstatus_to_exitcode(status) == 0, text[-3000:]
    assert re.search(r"pip ━+ 1/1", text), text[-3000:]  # a bar with packages done of the total
    assert re.search(r"verify ━+ 2/2", text), text[-3000:]  # the recipe's two verify steps
    summary = re.search(r"phases: preflight [\d.]+ s · conda [\d.]+ s · python [\d.]+ s · pip [\d.]+ s · "
                        r"verify [\d.]+ s · record [\d.]+ s \(total [\d.]+ s\)", text)
    assert summary, text[-3000:]


@pytest.mark.parametrize("written", sorted(p.name for p in (REPO / "tests" / "data" / "manifests").glob("*.json")
                                           if not p.name.endswith(".lock.json")))
def test_manifests_written_by_earlier_code_load(written: str, tmp_path: Path) -> None:
    """Each generation of manifest this project has written (copied from real builds) opens as its kind."""
    data = json.loads((REPO / "tests" / "data" / "manifests" / written).read_text())
    root = tmp_path / "envs"
    build = root / data["name"] / "builds" / data["build_id"]
    (build / ".hpcai").mkdir(parents=True)
    (build / ".hpcai" / "manifest.json").write_text(json.dumps(data))
    (root / data["name"] / "current").symlink_to(Path("builds") / data["build_id"])
    opened = EnvStore.at(root).get(data["name"])
    assert opened.kind == ("container" if data["kind"] == "container" else "prefix")
    described = opened.describe()
    assert described["python"] != "-" and described["packages"]
    if isinstance(opened, PrefixEnv):
        assert opened.recipe.name == data["recipe"]["name"] and opened.manifest.recipe_hash == data["recipe_hash"]
        assert [p.name for p in opened.manifest.pip] == [p["name"] for p in data["pip"]]
    else:
        assert opened.manifest.inside.packages == data["inside"]["packages"]
    assert json.loads(opened.manifest.model_dump_json())["build_id"] == data["build_id"]


def test_lock_written_by_earlier_code_loads() -> None:
    lock = Lock.model_validate_json((REPO / "tests" / "data" / "manifests" / "prefix-2026-12.lock.json").read_text())
    assert "horovod==0.28.1" in lock.pip and lock.no_build_isolation == ["horovod"]


def test_recipe_hash_is_where_independent(small_recipe: Path, tmp_path: Path) -> None:
    """The same recipe with a relative editable path, in two folders: the same hash (what it says, not where it
    sits); a changed line: another."""
    hashes = []
    for where in ("one", "two"):
        project = tmp_path / where / "project"
        project.mkdir(parents=True)
        (project / "pyproject.toml").write_text('[project]\nname = "p"\nversion = "1"\n')
        (tmp_path / where / "recipes").mkdir()
        recipe = tmp_path / where / "recipes" / "r.yaml"
        recipe.write_text("name: r\npython: /usr/bin/python3\npip: [six, -e ../project]\n")
        hashes.append(load_recipe(recipe).digest())
    assert hashes[0] == hashes[1]
    recipe.write_text("name: r\npython: /usr/bin/python3\npip: [six==1.17.0, -e ../project]\n")
    assert load_recipe(recipe).digest() != hashes[0]


def test_conda_layer_is_hardlinked_from_the_package_cache(small_env: EnvDir) -> None:
    """rattler links the conda packages' files from its cache: a rebuild copies nothing."""
    build = small_env.current()
    assert build is not None
    lib = build.prefix / "lib" / "libhpcaitest.so"
    assert lib.stat().st_nlink > 1, "a copy, not a link into the package cache"


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
def test_interrupted_build_keeps_the_previous_env(small_env: EnvDir, small_recipe: Path, env_store: EnvStore,
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
    assert open_env(env).check().passed, "the previous env still verifies"
    if sig == signal.SIGINT:
        assert "interrupted" in output and "is still current" in output and "log:" in output, output
        assert "Traceback" not in output
        assert [b.id for b in env.builds()] == [before.id]  # type: ignore[union-attr]
    else:  # a killed build leaves its prefix; the next build of the env clears it away
        assert len(env.builds()) == 2
        Builder(load_recipe(small_recipe), store=env_store, name=name).run()
        assert [b.id for b in env.builds()] == [before.id]  # type: ignore[union-attr]


def test_logs_are_private(small_env: EnvDir) -> None:
    logs = small_env.path / "logs"
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


@pytest.mark.parametrize(("entry", "words"), [
    ("jupyter-hpcai", "would install jupyter-hpcai from a public index"),
    ("Jupyter_HPCAI==0.1.0", "would install jupyter-hpcai from a public index"),
    ("jupyter.hpcai[hub]>=0.1", "would install jupyter-hpcai from a public index"),
    ("jupyter--hpcai", "would install jupyter-hpcai from a public index"),
    ("jupyter-hpcai; platform_release != '@'", "would install jupyter-hpcai from a public index"),
    ("jupyter-hpcai==0.1 # @x", "has a comment"),
    (" jupyter-hpcai", "has spaces around it"),
    (" --extra-index-url https://evil.example/simple", "has spaces around it"),
    ("jupyter-hpcai\t# note", "has spaces around it, a tab"),
    ("jupyter-hpcai --hash=sha256:0123", "has a comment, a variable, a continuation or an option of its own"),
    ("jupyter-hpcai;", "would install jupyter-hpcai from a public index"),
    ("${PKG}", "has a comment, a variable, a continuation or an option of its own"),
    ("jupyter-hpcai @ ./jupyter_hpcai-9.9-py3-none-any.whl", "names a relative URL"),
    ("jupyter-hpcai @ file:///tmp/jupyter_hpcai-9.9-py3-none-any.whl", "names a local file someone other than"),
])
def test_a_recipe_asking_for_the_product_by_bare_name_is_refused(entry: str, words: str) -> None:
    """Anyone may publish jupyter-hpcai on a public index: a name, however spelt, would put their code into every
    site env; so would a line pip reads otherwise than the check (a comment, spaces before an option)."""
    with pytest.raises(HPCAIError) as err:
        parse_recipe(f"name: x\npython: /usr/bin/python3\npip: [six, {json.dumps(entry)}]\n")
    assert f"`{entry}` {words}" in str(err.value)
    assert "write ${HPCAI_PRODUCT} instead" in str(err.value) or not words.startswith("would install")
    pinned = parse_recipe("name: x\npython: /usr/bin/python3\npip: ['jupyter-hpcai @ https://pypi.site.example/"
                          "jupyter_hpcai-0.1.0-py3-none-any.whl']\n")  # the site's own index, by URL
    assert pinned.pip_requirements() == ["jupyter-hpcai @ https://pypi.site.example/jupyter_hpcai-0.1.0-py3-none-any.whl"]


def test_the_product_by_bare_name_in_a_requirements_file_or_as_the_product_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "more.txt").write_text("six \\\n  --hash=sha256:0123\n-r base.txt  # the rest\n")
    (tmp_path / "base.txt").write_text("numpy\nJupyter.HPCAI\t--hash=sha256:0123  # the notebook side\n")
    recipe = parse_recipe("name: x\npython: /usr/bin/python3\npip: [-r more.txt]\n", base_dir=tmp_path)
    with pytest.raises(HPCAIError, match="base.txt: `Jupyter.HPCAI\t--hash=sha256:0123  # the notebook side` would "
                                         "install jupyter-hpcai"):
        recipe.pip_installs()  # found in the file the first one includes, read as pip reads it
    monkeypatch.setenv("HPCAI_PRODUCT", "jupyter-hpcai")
    product = parse_recipe("name: x\npython: /usr/bin/python3\npip: ['${HPCAI_PRODUCT}']\n", base_dir=tmp_path)
    with pytest.raises(HPCAIError, match=r"\$\{HPCAI_PRODUCT\} is `jupyter-hpcai`, which would install"):
        product.pip_requirements()


def test_a_lock_with_the_product_by_bare_name_is_refused(small_env: EnvDir, small_recipe: Path,
                                                         env_store: EnvStore) -> None:
    current = small_env.current()
    assert current is not None and current.lock() is not None
    for line, words in (("jupyter.hpcai==0.1.0", "would install jupyter-hpcai from a public index"),
                        ("--index-url https://evil.example/simple", "is an option"),
                        ("six==1.16.0\njupyter-hpcai==0.9", "has spaces around it, a tab or a line break")):
        lock = current.lock().model_copy(update={"pip": [*current.lock().pip, line]})  # type: ignore[union-attr]
        with pytest.raises(HPCAIError) as err:
            Builder(load_recipe(small_recipe), store=env_store, locked=lock).run()
        assert f"the lock's line `{line}` {words}" in str(err.value)
    assert small_env.current() == current  # nothing lost


def test_the_product_in_a_recipe_is_the_sites_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """${HPCAI_PRODUCT}: HPCAI_PRODUCT, else the checkout whose recipes/ holds the recipe, else the site config's
    [envs] product, else where this install came from (here: the checkout, editable). The wheel case is the
    site-install test's."""
    from jupyter_hpcai import paths

    text = "name: x\npython: /usr/bin/python3\npip: [six, '${HPCAI_PRODUCT}']\n"
    monkeypatch.setenv("HPCAI_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.delenv("HPCAI_PRODUCT", raising=False)
    assert load_recipe(REPO / "recipes" / "torch-cpu.yaml").pip_requirements()[-1] == f"-e {REPO}"
    recipe = parse_recipe(text, base_dir=tmp_path)  # a recipe outside any checkout
    assert recipe.pip_requirements() == ["six", f"-e {REPO}"]  # this install's origin
    wheel = tmp_path / "jupyter_hpcai-0.1.0-py3-none-any.whl"
    (tmp_path / "site.toml").write_text(f'[envs]\nproduct = "{wheel}"\n')
    monkeypatch.setenv("HPCAI_CONFIG", str(tmp_path / "site.toml"))
    assert recipe.pip_requirements() == ["six", str(wheel)]
    monkeypatch.setenv("HPCAI_PRODUCT", "/elsewhere/jupyter_hpcai-0.2.0-py3-none-any.whl")
    assert recipe.pip_requirements()[-1] == "/elsewhere/jupyter_hpcai-0.2.0-py3-none-any.whl"
    assert paths.recipes_dir() == REPO / "recipes"


def test_a_build_imports_nothing_from_the_folder_it_was_started_in(small_recipe: Path, tmp_path: Path) -> None:
    """An admin builds from a user's folder: the modules planted there (a yaml, a venv, a jupyter_hpcai) never run in
    the build's pythons."""
    planted = tmp_path / "theirs"
    (planted / "jupyter_hpcai").mkdir(parents=True)
    marker = tmp_path / "ran"
    for module in ("yaml.py", "venv.py", "six.py", "jupyter_hpcai/__init__.py"):
        (planted / module).write_text(f"open({str(marker)!r}, 'a').write({module!r} + '\\n')\n")
    done = subprocess.run([HPCAI, "env", "build", str(small_recipe), "--name", "planted"], capture_output=True,
                          text=True, timeout=600, cwd=planted,
                          env={**os.environ, "HPCAI_ENV_ROOT": str(tmp_path / "envs"), "PYTHONPATH": ""})
    assert done.returncode == 0, done.stdout + done.stderr
    assert not marker.exists(), marker.read_text()


def test_the_product_comes_only_from_places_nobody_else_controls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout another user owns (an admin building a user's recipe for the site) or a wheel another user could
    have put where the install's wheel was (a deleted /tmp file made again) is never what ${HPCAI_PRODUCT} installs."""
    from jupyter_hpcai import paths

    monkeypatch.setenv("HPCAI_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.delenv("HPCAI_PRODUCT", raising=False)
    nobody = pwd.getpwnam("nobody").pw_uid
    theirs = tmp_path / "theirs"
    (theirs / "recipes").mkdir(parents=True)
    (theirs / "pyproject.toml").write_text('[project]\nname = "jupyter-hpcai"\n')
    tmp_path.chmod(0o755)
    os.chown(theirs, nobody, -1)
    assert paths.product_requirement(theirs / "recipes") == f"-e {REPO}"  # not theirs: this install's own
    os.chown(theirs, 0, -1)
    assert paths.product_requirement(theirs / "recipes") == f"-e {theirs}"  # root's own checkout: followed
    wheel = tmp_path / "jupyter_hpcai-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    assert paths.ours(wheel)
    os.chown(wheel, nobody, -1)
    assert not paths.ours(wheel)
    os.chown(wheel, 0, -1)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # anyone may replace what lies in it
    (shared / wheel.name).write_bytes(b"")
    assert not paths.ours(shared / wheel.name)
    shared.chmod(0o1777)  # /tmp's way: nobody may replace root's file
    assert paths.ours(shared / wheel.name)


def test_a_shipped_recipe_is_found_by_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`hpcai env build tf-horovod-nccl` reads the recipe the product ships, whatever lies in the current folder (an
    admin building from another user's folder); a name it does not ship lists those."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tf-horovod-nccl").write_text("name: planted\npython: /usr/bin/python3\n")
    assert load_recipe("tf-horovod-nccl").name == "tf-horovod-nccl"
    assert load_recipe(tmp_path / "tf-horovod-nccl").name == "planted"  # a file, named with its folder
    done = subprocess.run([HPCAI, "env", "build", "tf-horovod-ncl"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "the name of one shipped: tf-horovod-cpu, tf-horovod-nccl, torch-cpu, torch-cuda" in done.stdout + done.stderr


def test_cpu_recipe_parses() -> None:
    recipe = load_recipe(REPO / "recipes" / "tf-horovod-cpu.yaml")
    isolated, later = recipe.pip_installs()
    assert later == ["horovod==0.28.1"] and "tensorflow-cpu==2.15.1" in isolated
    assert f"-e {REPO}" in isolated  # jupyter_hpcai itself, editable from this checkout


@pytest.mark.slow
def test_tf_horovod_cpu_env_verifies_gloo_and_mpi(tf_env: EnvDir) -> None:
    manifest = tf_env.current().manifest()  # type: ignore[union-attr]
    built = next(s.output for s in manifest.verify if s.step.startswith("python -c \"import horovod.tensorflow"))
    assert built == "mpi True gloo True"
    assert {"tensorflow-cpu": "2.15.1", "horovod": "0.28.1"}.items() <= {
        p.name: p.version for p in manifest.pip}.items()
    check_build = subprocess.run([str(tf_env.current_link / "bin" / "horovodrun"), "--check-build"],
                                 env=open_env(tf_env).environ(), capture_output=True, text=True, timeout=300)
    for line in ("[X] TensorFlow", "[X] MPI", "[X] Gloo"):  # what the recipe's one-process check stands for
        assert line in check_build.stdout, check_build.stdout + check_build.stderr
    assert open_env(tf_env).check().passed[-1].startswith("python -c \"import horovod.tensorflow")


@pytest.mark.slow
def test_a_second_checkout_reuses_the_build(tf_env: EnvDir) -> None:
    """The same recipe in another clone of the project is up to date at once: its editable jupyter_hpcai is pointed
    at the clone (so the env runs the clone's code); building from this checkout again points it back.

    The shipped env is shared with the run's other process, whose kernels (the hub users' too) start from it while it
    follows the clone: the clone is a copy of this working tree, in a folder every user reads, kept after the test
    (a kernel started meanwhile may still import from it) and removed by the next run's."""
    for earlier in Path("/var/tmp").glob("hpcai-second-checkout-*"):
        shutil.rmtree(earlier)
    clone = Path(tempfile.mkdtemp(prefix="hpcai-second-checkout-", dir="/var/tmp"))
    clone.chmod(0o755)
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True,
                             timeout=60).stdout.decode().split("\0")
    for name in (n for n in tracked if n and (REPO / n).is_file()):  # the working tree as it is, changes included
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, clone / name)
    shutil.copytree(REPO / "jupyter_hpcai" / "labextension", clone / "jupyter_hpcai" / "labextension",
                    dirs_exist_ok=True)  # the built extension (not tracked)
    before = tf_env.current()

    def build_from(checkout: Path) -> str:
        done = subprocess.run([HPCAI, "env", "build", str(checkout / "recipes" / "tf-horovod-cpu.yaml")],
                              capture_output=True, text=True, timeout=600,
                              env={**os.environ, "HPCAI_ENV_ROOT": str(tf_env.root.path), "COLUMNS": "300"})
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def follows() -> Path:
        opened = open_env(tf_env)
        done = subprocess.run(opened.argv(["python", "-c", "import jupyter_hpcai; print(jupyter_hpcai.__file__)"]),
                              env=opened.environ(), capture_output=True, text=True, timeout=120, cwd="/")
        return Path(done.stdout.strip()).parents[1]

    with shipped_env_held(tf_env.name):  # the other process's first use of the env waits until it follows REPO again
        try:
            out = build_from(clone)
            assert "is up to date" in out and f"now follows {clone}" in out, out
            assert tf_env.current() == before, "no new build"
            assert follows() == clone
            assert tf_env.current().manifest().editables == {"jupyter-hpcai": str(clone)}  # type: ignore[union-attr]
        finally:
            out = build_from(REPO)
    assert "is up to date" in out and f"now follows {REPO}" in out and follows() == REPO


@pytest.mark.slow
def test_the_gpu_recipe_builds_here(tmp_path: Path) -> None:
    """recipes/torch-cuda.yaml (PyPI's CUDA torch with its nvidia-* wheels) builds on this machine: the CUDA build,
    NCCL and the CUDA libraries are checked; the GPU-only steps run where a GPU is, else are skipped saying why."""
    from jupyter_hpcai.envs.verify import gpus_visible

    warnings: list[str] = []
    result = Builder(load_recipe(REPO / "recipes" / "torch-cuda.yaml"), store=EnvStore(tmp_path, site=[]),
                     progress=lambda e: warnings.append(e.message) if e.state == "warning" else None).run()
    manifest = result.build.manifest()
    assert isinstance(manifest, PrefixManifest)
    steps = {s.step.split(";")[0]: s for s in manifest.verify}
    assert steps['python -c "import torch, torch.distributed as d'].output == "cuda build True nccl True"
    assert steps['python -c "import ctypes, torch'].output == "libcudart and libnccl load"
    assert any(p.name.startswith("nvidia-nccl") for p in manifest.pip), "NCCL comes as a wheel"
    gpu_steps = [s for s in manifest.verify if "cuda.is_available" in s.step or "all_reduce" in s.step]
    assert len(gpu_steps) == 2
    if why := gpus_visible():
        assert all(s.skipped == f"needs a GPU: {why}" and not s.output for s in gpu_steps), gpu_steps
        assert sum("skipped, needs a GPU" in w for w in warnings) == 2, warnings
    else:
        assert [s.output.split()[:2] for s in gpu_steps] == [["cuda", "True"], ["nccl", "all_reduce"]], gpu_steps
