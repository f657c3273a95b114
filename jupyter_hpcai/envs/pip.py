"""The pip layer: installed into the prefix after the conda layer, never before it, by uv (default) or the
prefix's own pip; what is installed is read back with pip inspect."""

from __future__ import annotations

import fcntl
import functools
import json
import os
import platform
import re
import struct
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, ClassVar

from ..errors import HPCAIError
from ..paths import replace_text
from ..proc import run, run_logged
from . import conda
from .recipe import requirement_name


# What pip or uv prints when the index cannot be reached at all (no route, no DNS), as opposed to a missing package.
UNREACHABLE = ("Failed to establish a new connection", "Temporary failure in name resolution", "Network is unreachable",
               "dns error", "tcp connect error")  # pip's, then uv's


_PIP_TO_UV = {  # pip's option (config file or PIP_*) -> uv pip install's, for the ones a site sets
    "index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
    "constraint": "--constraint", "trusted-host": "--allow-insecure-host",
}
_TRUE = ("1", "true", "yes", "on")
# The wheels `python -m venv` installs through ensurepip (its bundled ones, or a distribution's folder of them).
_ENSUREPIP_WHEELS = """
import ensurepip, pathlib
folders = [pathlib.Path(d) for d in [getattr(ensurepip, "_WHEEL_PKG_DIR", None)] if d]
folders.append(pathlib.Path(ensurepip.__file__).parent / "_bundled")
names = getattr(ensurepip, "_PACKAGE_NAMES", ("pip",))
for folder in folders:
    found = [sorted(folder.glob(f"{name}-*.whl")) for name in names]
    if all(found):
        print(*(str(f[-1]) for f in found))
        break
"""


def pip_settings(python: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The site's and user's pip configuration as ``python``'s pip sees it (config files and PIP_* variables):
    option -> value, the environment's winning over the files'. pip runs isolated here as everywhere (``-I``): no
    module from the current folder, no PYTHON* variable, reaches it (root runs this too, for the dev cluster)."""
    done = run([str(python), "-I", "-m", "pip", "config", "list"], env=dict(env), check=False, timeout=60)
    found: dict[str, tuple[int, str]] = {}
    for line in done.stdout.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        scope, _, option = key.rpartition(".")
        rank = 2 if scope == ":env:" else 1 if scope in ("install", "global") else 0
        if option not in found or rank >= found[option][0]:
            found[option] = (rank, value.strip().strip("'\""))
    return {k: v for k, (_, v) in found.items()}


class Installer:
    """How the pip layer is installed into a prefix; the kinds differ by their command (INSTALLERS)."""

    name: ClassVar[str]
    unreachable_note: ClassVar[str] = ""  # how it treats an index it cannot reach, where that differs from pip

    def __init__(self, python: Path, env: Mapping[str, str]) -> None:
        self.python, self.env = python, dict(env)

    def command(self, *, no_build_isolation: bool, no_deps: bool, find_links: Path | None) -> tuple[list[str], dict[str, str]]:
        """The install command line (requirements file appended) and its environment."""
        raise NotImplementedError

    def make_venv(self, base_python: str, prefix: Path, log: Path) -> None:
        """A new virtual environment at ``prefix`` (with pip) on ``base_python``."""
        run_logged([base_python, "-m", "venv", prefix], log=log, timeout=300)

    def check(self) -> str:
        """What the installer's consistency check says of the prefix (broken requirements)."""
        return run([str(self.python), "-I", "-m", "pip", "check"], env=self.env, check=False, timeout=300).stdout.strip()

    def install(self, requirements: list[str], *, log: Path, no_build_isolation: bool = False, no_deps: bool = False,
                find_links: Path | None = None, on_output: Callable[[str], None] | None = None) -> None:
        """Install requirement lines into the prefix ``python`` belongs to (upgrading only what must be)."""
        with tempfile.NamedTemporaryFile("w", suffix="-requirements.txt", dir=log.parent) as reqs:
            reqs.write("".join(f"{line}\n" for line in requirements))
            reqs.flush()
            with open(log, "a") as out:
                out.write(f"requirements ({self.name}): {requirements}\n")
            cmd, env = self.command(no_build_isolation=no_build_isolation, no_deps=no_deps, find_links=find_links)
            try:
                run_logged([*cmd, "-r", reqs.name], log=log, timeout=3600, env=env, on_output=on_output)
            except HPCAIError as err:
                if any(sign in err.message for sign in UNREACHABLE):
                    raise HPCAIError(err.message, f"{platform.node()} cannot reach the package index (compute nodes "
                                     "often cannot): set PIP_INDEX_URL to a mirror it reaches, or PIP_FIND_LINKS to a "
                                     "wheelhouse on a shared filesystem with PIP_NO_INDEX=1, or build on the login node "
                                     f"(--here){self.unreachable_note}" + (f"; {err.hint}" if err.hint else "")) from None
                raise


class Pip(Installer):
    """The prefix's own pip. It writes no bytecode: the build does that after either installer (compile_bytecode,
    on every core), where pip compiled the layer one file at a time."""

    name = "pip"

    def command(self, *, no_build_isolation: bool, no_deps: bool, find_links: Path | None) -> tuple[list[str], dict[str, str]]:
        cmd = [str(self.python), "-I", "-m", "pip", "install", "--upgrade-strategy", "only-if-needed", "--progress-bar", "off",
               "--no-compile"]
        cmd += ["--no-build-isolation"] * no_build_isolation + ["--no-deps"] * no_deps
        return cmd + (["--find-links", str(find_links)] if find_links else []), self.env


class Uv(Installer):
    """uv (from PyPI, beside this python): files hardlinked from its cache, so a rebuild copies nothing. It reads
    no pip configuration, so the site's (index, mirrors, wheelhouse, constraints) is handed to it."""

    name = "uv"
    unreachable_note = ("; uv stops at any index it cannot reach, where pip goes on with the others (--installer pip "
                        "keeps pip's way)")

    def command(self, *, no_build_isolation: bool, no_deps: bool, find_links: Path | None) -> tuple[list[str], dict[str, str]]:
        from uv import find_uv_bin

        settings = self.site_settings
        cmd = [find_uv_bin(), "pip", "install", "--python", str(self.python), "--link-mode", "hardlink"]
        for option, flag in _PIP_TO_UV.items():
            cmd += [arg for value in settings.get(option, "").split() for arg in (flag, value)]
        if settings.get("extra-index-url"):  # pip picks the best version from all indexes; uv only when told
            cmd += ["--index-strategy", "unsafe-best-match"]
        cmd += ["--no-index"] * (settings.get("no-index", "").lower() in _TRUE)
        cmd += ["--no-build-isolation"] * no_build_isolation + ["--no-deps"] * no_deps
        cmd += ["--find-links", str(find_links)] if find_links else []
        return cmd, self._environ(settings)

    @functools.cached_property
    def site_settings(self) -> dict[str, str]:
        """The site's pip configuration, asked once per installer (a build's installs share it)."""
        return pip_settings(self.python, self.env)

    def _environ(self, settings: dict[str, str]) -> dict[str, str]:
        env = {**self.env, "UV_NO_PROGRESS": "1", "NO_COLOR": "1"}
        if "cert" in settings:
            env.setdefault("SSL_CERT_FILE", settings["cert"])
        if "timeout" in settings or "default-timeout" in settings:
            env.setdefault("UV_HTTP_TIMEOUT", settings.get("timeout") or settings["default-timeout"])
        return env

    def make_venv(self, base_python: str, prefix: Path, log: Path) -> None:
        """The venv ``python -m venv`` makes, in a tenth of the time: without pip, then the very pip (and setuptools)
        wheels its ensurepip would install, installed by uv (ensurepip runs pip to install pip: most of venv's 3 s).
        Where the interpreter has no such wheels, its own ensurepip."""
        from uv import find_uv_bin

        run_logged([base_python, "-m", "venv", "--without-pip", prefix], log=log, timeout=300)
        wheels = run([base_python, "-c", _ENSUREPIP_WHEELS], check=False, timeout=60).stdout.split()
        python = prefix / "bin" / "python"
        if wheels:
            run_logged([find_uv_bin(), "pip", "install", "--python", python, "--link-mode", "hardlink", "--no-index",
                        *wheels], log=log, timeout=300, env={**self.env, "UV_NO_PROGRESS": "1"})
        else:
            run_logged([python, "-m", "ensurepip", "--default-pip"], log=log, timeout=300)

    def check(self) -> str:
        from uv import find_uv_bin

        done = run([find_uv_bin(), "pip", "check", "--python", str(self.python)], env=self.env, check=False, timeout=300)
        return (done.stdout + done.stderr).strip()


INSTALLERS: dict[str, type[Installer]] = {"uv": Uv, "pip": Pip}


def compile_bytecode(python: Path, prefix: Path, previous: Path | None, log: Path) -> int:
    """Write the .pyc files of the prefix's site-packages, as pip does at install (uv does not): without them every
    import compiles again where they cannot be written (a site env, PYTHONDONTWRITEBYTECODE), and each kernel and
    rank starts seconds later. A source hardlinked from the same cache file as one of ``previous`` (the build
    before) takes that build's .pyc, linked (Python points a cached code object at the file it loads it for); the
    rest are compiled. Only .pyc files of ``python``'s own version count (a wheel may ship others, and uv links one
    source for every version). Returns how many were reused."""
    tag = run([str(python), "-c", "import sys; print(sys.implementation.cache_tag)"], timeout=60).stdout.strip()
    before: dict[tuple[int, int], list[Path]] = {}  # a source's inode -> its .pyc files in the build before
    for folder, sources, compiled in _python_folders(previous, tag) if previous else ():
        for name in sources:
            st = os.stat(folder / name)
            before[(st.st_dev, st.st_ino)] = [folder / "__pycache__" / c for c in compiled.get(name[:-3], [])]
    reused, missing = 0, []
    for folder, sources, compiled in _python_folders(prefix, tag):
        for name in sources:
            if name[:-3] in compiled:
                continue
            st = os.stat(folder / name)
            found = before.get((st.st_dev, st.st_ino), [])
            if found:
                (folder / "__pycache__").mkdir(exist_ok=True)
            for pyc in found:
                os.link(pyc, folder / "__pycache__" / pyc.name)
                reused += 1
            if not found:
                missing.append(str(folder / name))
    if missing:
        with tempfile.NamedTemporaryFile("w", suffix="-sources.txt", dir=log.parent) as listing:
            listing.write("\n".join(missing) + "\n")
            listing.flush()
            try:
                run_logged([python, "-m", "compileall", "-q", "-j", "0", "-i", listing.name], log=log, timeout=1800)
            except HPCAIError:  # sources this python cannot compile (a newer python's syntax): skipped, as pip does
                with open(log, "a") as out:
                    out.write("compileall: the files named above were not compiled (they still import where valid)\n")
    return reused


def _python_folders(prefix: Path, tag: str) -> Iterator[tuple[Path, list[str], dict[str, list[str]]]]:
    """(folder, its .py files, module name -> its .pyc files for the interpreter ``tag`` names, e.g. cpython-311)
    for every folder of the prefix's site-packages."""
    for site in prefix.glob("lib/python*/site-packages"):
        for folder, dirs, files in os.walk(site):
            sources = [f for f in files if f.endswith(".py")]
            if not sources:
                continue
            compiled: dict[str, list[str]] = {}
            if "__pycache__" in dirs:
                for pyc in os.listdir(os.path.join(folder, "__pycache__")):
                    if f".{tag}." in pyc:
                        compiled.setdefault(pyc.split(".", 1)[0], []).append(pyc)
            yield Path(folder), sources, compiled


@contextmanager
def compiled_wheels(python: Path, requirements: list[str], *, folder: Path, env: Mapping[str, str], log: Path,
                    prefix: Path) -> Iterator[Path]:
    """Wheels of packages compiled against ``prefix`` (no build isolation: Horovod against TensorFlow), in the folder
    this yields to install them from. ``folder`` is the caller's cache for one key (build variables, frameworks,
    toolchain, conda layer): a pinned line with its wheel there is not built again, unless one of those wheels holds
    the path of the prefix it was built in (an rpath into a build deleted later); then every line is built for this
    prefix alone, in a folder deleted after the install. A build into the cache, and the install from it, hold the
    key's lock (where the cache's file system has locks): two builds of one key that the cache serves compile
    once. pip's own cache is not used (it knows only the source)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "a") as lock:
        _lock(lock, log)
        if not any(holds_where_built(w) for line in requirements for w in _wheels(folder, line)):
            missing = [line for line in requirements if not _wheels(folder, line)]
            if missing:
                _build_wheels(python, missing, folder=folder, env=env, log=log, prefix=prefix)
            yield folder
            return
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f"{folder.name}-for-") as own:
        _build_wheels(python, requirements, folder=Path(own), env=env, log=log, prefix=prefix)
        yield Path(own)


def _lock(lock: IO[str], log: Path) -> None:
    """Take ``lock``; the log says so while another build holds it, and goes on without it where the file system
    has no locks (some parallel file systems)."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        with open(log, "a") as out:
            out.write(f"waiting for another build compiling the same wheels (it holds {lock.name})\n")
    except OSError as err:
        with open(log, "a") as out:
            out.write(f"compiled wheels: no lock on {lock.name} ({err.strerror}); going on without\n")
        return
    fcntl.flock(lock, fcntl.LOCK_EX)


def _wheels(folder: Path, line: str) -> list[Path]:
    """The wheels in ``folder`` of a pinned requirement line (none for an unpinned one)."""
    name, _, version = line.partition("==")
    if not version:
        return []
    project = re.sub(r"[-_.]+", "_", requirement_name(name))
    return sorted(folder.glob(f"{project}-{version.split(';')[0].strip()}-*.whl"))


def _build_wheels(python: Path, requirements: list[str], *, folder: Path, env: Mapping[str, str], log: Path,
                  prefix: Path) -> None:
    """Build the lines' wheels aside, then move each into ``folder`` after its record of where it was built."""
    folder.mkdir(parents=True, exist_ok=True)
    where = "\n".join(dict.fromkeys([str(prefix), os.path.realpath(prefix)])) + "\n"
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".building-") as aside:
        run_logged([python, "-I", "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-cache-dir",
                    "--progress-bar", "off", "--wheel-dir", aside, *requirements], log=log, timeout=3600, env=env)
        for wheel in Path(aside).glob("*.whl"):
            record = Path(f"{wheel}.built-in")
            record.write_text(where)
            os.replace(record, folder / record.name)
            os.replace(wheel, folder / wheel.name)


def holds_where_built(wheel: Path) -> bool:
    """Whether ``wheel`` holds the path of the prefix it was built in (recorded beside it, as given and resolved; a
    wheel with no record counts as holding it) where a process would follow it: in the paths of an
    ELF file's dynamic section (rpath, runpath, needed libraries), or anywhere in any other file. The rest of an
    ELF file is not searched, by choice: its debug info names the headers it was compiled with (Horovod:
    TensorFlow's, in the prefix), which only a debugger reads; a path compiled into its data (a dlopen of an absolute
    path) is missed. A wheel that cannot be read whole counts as holding it."""
    try:
        where = [line.encode() for line in Path(f"{wheel}.built-in").read_text().splitlines() if line]
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.infolist():
                data = b"" if member.is_dir() else archive.read(member)
                found = _search_paths(data) if data.startswith(b"\x7fELF") else [data]
                if any(path in text for path in where for text in found):
                    return True
    except Exception:  # noqa: BLE001 - unreadable, not whole, or not a zip archive: built again
        return True
    return not where


# the dynamic section's entries that name files or folders the loader follows: DT_NEEDED, DT_RPATH, DT_RUNPATH,
# DT_DEPAUDIT, DT_AUDIT, DT_AUXILIARY, DT_FILTER
_DYNAMIC_PATHS = frozenset({1, 15, 29, 0x6ffffefb, 0x6ffffefc, 0x7ffffffd, 0x7fffffff})


def _search_paths(elf: bytes) -> list[bytes]:
    """The paths a 64-bit little-endian ELF file's dynamic section names (_DYNAMIC_PATHS); all of the file where it
    is another kind, has no dynamic section found through its section headers, or does not parse, so that any
    mention counts."""
    if elf[4:6] != b"\x02\x01":
        return [elf]
    try:
        shoff, = struct.unpack_from("<Q", elf, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
        # each section header: name, type, flags, addr, offset, size, link (for .dynamic: its string table), ...
        sections = [struct.unpack_from("<IIQQQQI", elf, shoff + i * shentsize) for i in range(shnum)]
        paths, dynamic = [], False
        for _, kind, _, _, offset, size, link in sections:
            if kind != 6:  # SHT_DYNAMIC
                continue
            dynamic, strings = True, sections[link][4]
            for entry in range(offset, offset + size, 16):
                tag, value = struct.unpack_from("<qQ", elf, entry)
                if tag in _DYNAMIC_PATHS:
                    start = strings + value
                    paths.append(elf[start:elf.index(b"\0", start)])
        return paths if dynamic else [elf]
    except (struct.error, IndexError, ValueError, OverflowError):
        return [elf]


def known_installer(name: str) -> str:
    """``name`` if an installer has it; else a clear error (a site config's typo) before anything is made."""
    if name not in INSTALLERS:
        raise HPCAIError(f"unknown pip-layer installer '{name}'", f"use one of: {', '.join(INSTALLERS)} (--installer, "
                         "HPCAI_PIP_INSTALLER or envs.installer in the site config)")
    return name


def installer(name: str, python: Path, env: Mapping[str, str]) -> Installer:
    return INSTALLERS[known_installer(name)](python, env)


def inspect(python: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    """Every distribution in the prefix: name, version, installer, direct URL, files."""
    report = json.loads(run([str(python), "-I", "-m", "pip", "inspect", "--local"], env=env, timeout=300).stdout)
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
    return [d for d in dists if d["installer"] in INSTALLERS and d["name"] not in ("pip", "setuptools", "wheel")]


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


def editables(dists: list[dict[str, Any]]) -> dict[str, str]:
    """Editable installs: project name -> the source folder it follows."""
    return {d["name"]: d["url"].removeprefix("file://") for d in dists if d["editable"] and d["url"]}


def repoint_editable(dist: dict[str, Any], source: Path) -> bool:
    """Point an editable install at another copy of its project (another checkout) by rewriting the path in its
    .pth files and direct_url.json, each atomically. False when no .pth names the old path (a backend that
    installs a finder module instead): then it must be reinstalled."""
    old = dist["url"].removeprefix("file://")
    info = Path(dist["location"])
    files = [line.split(",", 1)[0] for line in (info / "RECORD").read_text().splitlines()]
    changed = False
    for pth in (info.parent / f for f in files if f.endswith(".pth")):
        lines = pth.read_text().splitlines()
        if old in lines:
            replace_text(pth, "".join(f"{str(source) if ln == old else ln}\n" for ln in lines))
            changed = True
    if changed:
        direct = json.loads((info / "direct_url.json").read_text())
        replace_text(info / "direct_url.json", json.dumps({**direct, "url": source.as_uri()}))
    return changed

