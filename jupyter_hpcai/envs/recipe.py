"""Recipes: YAML files that say what an environment holds, read into a validated model."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated
from urllib.parse import unquote

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import HPCAIError
from ..paths import ours, product_requirement, recipes_dir
from .store import NAME_PATTERN

VAR_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
PRODUCT = "jupyter-hpcai"
PRODUCT_VARIABLE = "${HPCAI_PRODUCT}"  # a pip entry: this product, from where the site installed it (paths.py)
NoNewline = Annotated[str, Field(pattern=r"^[^\n\r\x00]*$", min_length=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CondaLayer(_Strict):
    """Conda packages, installed first."""

    channels: list[NoNewline] = Field(min_length=1)
    specs: list[NoNewline] = Field(min_length=1)

    def python_spec(self) -> str | None:
        return next((s for s in self.specs if re.match(r"^python(\W|$)", s)), None)


class VerifyCommand(_Strict):
    """A command run inside the activated env; each ``expect`` string must appear in its output."""

    run: NoNewline
    expect: list[NoNewline] = []
    timeout: float = Field(default=300, gt=0, le=3600)
    needs_gpu: bool = False  # skipped, with the reason printed, where no GPU is visible (a login node)


class Verify(_Strict):
    imports: list[Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*$")]] = []
    commands: list[VerifyCommand] = []


class BuildSite(_Strict):
    """Where and with what the env is built (``hpcai env build --on-partition``, the toolchain preflight)."""

    partition: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")] | None = None
    gpus: int = Field(default=0, ge=0, le=16)
    time: Annotated[str, Field(pattern=r"^(\d{1,3}-)?\d{1,3}(:\d{2}){0,2}$")] = "02:00:00"
    min_gcc: Annotated[str, Field(pattern=r"^\d+(\.\d+){0,2}$")] | None = None


class Recipe(_Strict):
    """What an environment holds and how it is built: conda layer first, then pip."""

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    conda: CondaLayer | None = None
    python: NoNewline | None = None
    pip: list[NoNewline] = []
    build_env: dict[Annotated[str, Field(pattern=VAR_NAME)], NoNewline] = {}
    no_build_isolation: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]] = []
    modules: list[Annotated[str, Field(pattern=r"^[\w./+-]+$")]] = []
    activate: dict[Annotated[str, Field(pattern=VAR_NAME)], NoNewline] = {}
    verify: Verify = Verify()
    build: BuildSite = BuildSite()
    # Set by load_recipe, not by the file: where relative paths in `pip` are resolved.
    base_dir: Path = Field(default=Path("."), exclude=True)

    @field_validator("python")
    @classmethod
    def _python_is_absolute(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_absolute():
            raise ValueError("must be an absolute path to an interpreter, e.g. /usr/bin/python3")
        return value

    @model_validator(mode="after")
    def _one_python(self) -> Recipe:
        conda_python = self.conda.python_spec() if self.conda else None
        if conda_python and self.python:
            raise ValueError(f"choose one python: conda spec '{conda_python}' or `python: {self.python}`, not both")
        if self.pip and not (conda_python or self.python):
            raise ValueError("the pip layer needs a python: add `python` to conda.specs, or set `python:` to an interpreter")
        options = [r for r in self.pip if r.startswith("-") and not r.startswith(("-r ", "-e "))]
        if options:
            raise ValueError(f"pip entries are requirements, `-r FILE` or `-e PATH`, not options: {', '.join(options)}")
        for entry in (r for r in self.pip if r != PRODUCT_VARIABLE):
            if reason := unsafe_requirement(entry):
                raise ValueError(f"`{entry}` {reason}" + (f": {PRODUCT_FIX}" if names_the_product_bare(entry) else ""))
        unknown = {requirement_name(n) for n in self.no_build_isolation} - {requirement_name(r) for r in self.pip}
        if unknown:
            raise ValueError(f"no_build_isolation names packages that `pip` does not list: {', '.join(sorted(unknown))}")
        return self

    def pip_requirements(self) -> list[str]:
        """The pip layer as requirement-file lines, local paths resolved against the recipe's folder."""
        out = []
        for req in self.pip:
            req = self._product() if req == PRODUCT_VARIABLE else req
            option, _, path = req.partition(" ") if req.startswith(("-r ", "-e ")) else ("", "", req)
            if option or path.startswith(("./", "../", "/")) or path in (".", ".."):
                path = str((self.base_dir / path.strip()).resolve())
            out.append(f"{option} {path}".strip())
        return out

    def _product(self) -> str:
        """What ${HPCAI_PRODUCT} installs here, checked as a recipe's own line is."""
        product = product_requirement(self.base_dir)
        if reason := unsafe_requirement(product):
            raise HPCAIError(f"${{HPCAI_PRODUCT}} is `{product}`, which {reason}",
                             "set HPCAI_PRODUCT, or product under [envs] in the site config, to the wheel the hub was "
                             "installed from (its path) or its URL on your own index")
        return product

    def requirement_files(self) -> None:
        """Refuse a ``-r`` file (or one it includes) that asks for the product by bare name, read as pip reads it:
        lines continued with ``\\`` joined, comments and a requirement's own options left out."""
        pending = [Path(line[3:].strip()) for line in self.pip_requirements() if line.startswith("-r ")]
        seen: set[Path] = set()
        while pending:
            path = pending.pop()
            if path in seen:
                continue
            seen.add(path)
            for entry in re.sub(r"\\\n", " ", path.read_text()).splitlines():
                words = re.sub(r"(^|\s)#.*", "", entry).split(" --")[0].strip()
                included = re.match(r"(-r|--requirement)[\s=]+(\S+)", words)
                if included:
                    pending.append((path.parent / included.group(2)).resolve())
                elif names_the_product_bare(words):
                    raise HPCAIError(f"{path}: `{entry.strip()}` would install jupyter-hpcai from a public index, "
                                     "where anyone may publish that name", PRODUCT_FIX)

    def builds_horovod(self) -> bool:
        return any(requirement_name(r) == "horovod" for r in self.pip)

    def pip_installs(self) -> tuple[list[str], list[str]]:
        """Requirement lines for two installs: with build isolation, then the no_build_isolation packages."""
        self.requirement_files()
        no_isolation = {requirement_name(n) for n in self.no_build_isolation}
        lines = self.pip_requirements()
        later = [r for r in lines if requirement_name(r) in no_isolation]
        return [r for r in lines if r not in later], later

    def editables(self) -> list[Path]:
        """The folders of the ``-e PATH`` lines, resolved."""
        return [Path(line[3:].strip()) for line in self.pip_requirements() if line.startswith("-e ")]

    def digest(self) -> str:
        """A hash of what the recipe says a build holds, not of where it sits: the recipe as written (local paths
        relative to its file), the files of ``-r`` requirement files, and the sources of local (non-editable)
        packages. Of editable packages (``-e PATH``) only the project metadata is hashed (dependencies, entry
        points): the env follows their code as it changes, so the same recipe in two checkouts is the same build."""
        h = hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode())
        for line in self.pip_requirements():
            option, _, rest = line.partition(" ") if line.startswith(("-r ", "-e ")) else ("", "", line)
            path = Path(rest.strip())
            if option == "-r" and path.is_file():
                h.update(path.read_bytes())
            elif option == "-e":
                for meta in ("pyproject.toml", "setup.cfg", "setup.py"):
                    if (path / meta).is_file():
                        h.update((path / meta).read_bytes())
            elif path.is_absolute() and path.is_file():  # a wheel or an sdist
                h.update(path.read_bytes())
            elif path.is_absolute() and path.is_dir():
                for f in sorted(_source_files(path)):
                    h.update(str(f.relative_to(path)).encode())
                    h.update(f.read_bytes())
        return h.hexdigest()[:16]


def _source_files(src: Path) -> list[Path]:
    """The files of a local source tree that can change what pip installs from it (not tests or docs)."""
    skip = {".git", ".venv", "node_modules", "__pycache__", "build", "dist", ".pytest_cache", "test-artifacts",
            "tests", "test", "docs", "examples", ".ci", ".github", "recipes"}
    return [
        p for p in src.rglob("*")
        if p.is_file() and not skip & set(p.relative_to(src).parts) and not p.name.endswith((".pyc", ".md"))
        and ".egg-info" not in str(p)
    ]


PRODUCT_FIX = ("write ${HPCAI_PRODUCT} instead (the wheel the hub was installed from, or [envs] product in the "
               "site config), or `jupyter-hpcai @ URL` on your own index")


def names_the_product_bare(line: str) -> bool:
    """Whether a requirement line asks for jupyter-hpcai by name (however spelt: ``Jupyter.HPCAI[hub]; marker``),
    which pip takes from an index, rather than by URL or path. A line the parser refuses is judged by its first
    word, as pip and uv may still read it."""
    try:
        requirement = Requirement(line)
    except InvalidRequirement:
        first = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line.strip())
        return bool(first) and canonicalize_name(first.group()) == PRODUCT and "@" not in line
    return canonicalize_name(requirement.name) == PRODUCT and requirement.url is None


def unsafe_requirement(line: str) -> str:
    """Why a pip line may not be installed as written; "" when it may. Refused: what pip or uv read otherwise than a
    requirement's words (a comment, a variable, a line continued, an option of its own), the product by name, and a
    local file someone other than root or this user could have put there."""
    if line != line.strip() or any(c in line for c in "\n\r\x00\t"):
        return "has spaces around it, a tab or a line break"
    if re.search(r"\s#|\$|\\|\s--?[a-z]", line) and not line.startswith(("-e ", "-r ")):
        return "has a comment, a variable, a continuation or an option of its own (pip reads it otherwise)"
    if names_the_product_bare(line):
        return "would install jupyter-hpcai from a public index, where anyone may publish that name"
    url = re.search(r"@\s*(\S+)", line)
    if url and url.group(1).startswith("file:") and not ours(Path(unquote(url.group(1).removeprefix("file://")))):
        return "names a local file someone other than you or root owns or may change"
    if url and not url.group(1).startswith(("file:///", "https://", "http://")) and "://" not in url.group(1):
        return "names a relative URL (uv reads it against the folder it runs in)"
    return ""


def requirement_name(req: str) -> str:
    """The normalised project name of a requirement line (`Horovod[tensorflow]==0.28.1` -> `horovod`);
    local paths and options come back as they are."""
    return re.split(r"[\s<>=!~\[;@]", req, maxsplit=1)[0].lower().replace("_", "-")


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(recipe)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (allowed: name, conda, python, pip, build_env, no_build_isolation, modules, activate, verify, build)" \
                if len(e["loc"]) == 1 else "unknown key"
        elif e["type"] == "string_pattern_mismatch" and "\\n" in str(e.get("ctx", {}).get("pattern", "")):
            msg = "must be one line (no newlines)"
        lines.append(f"  {where}: {msg.removeprefix('Value error, ')}")
    return "\n".join(lines)


def parse_recipe(text: str, *, source: str = "<recipe>", base_dir: Path = Path(".")) -> Recipe:
    """Read a recipe from YAML text, with one clear error listing every bad key or value."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise HPCAIError(f"{source} is not valid YAML: {err}", "fix the syntax at the line shown") from None
    if not isinstance(data, dict):
        raise HPCAIError(f"{source} must be a YAML mapping with at least `name:`", "see recipes/ for examples")
    try:
        return Recipe(**data, base_dir=base_dir)
    except ValidationError as err:
        raise HPCAIError(f"{source} is not a valid recipe:\n{_format_errors(err)}", "fix the keys named above; see recipes/ for examples") from None
    except TypeError as err:  # non-string keys
        raise HPCAIError(f"{source} is not a valid recipe: {err}", "keys must be strings") from None


def recipe_file(path: str | Path) -> Path:
    """A recipe file's path: the recipe the product ships under a bare name (``tf-horovod-nccl``, whatever lies in
    the current folder: an admin building from someone else's folder gets the shipped one), else ``path`` (a file of
    that name is read by its path with a folder, ``/x/tf-horovod-nccl``, or with a suffix)."""
    path = Path(path)
    shipped = recipes_dir() / f"{path.name}.yaml"
    return shipped if path.name == str(path) and not path.suffix and shipped.is_file() else path


def load_recipe(path: str | Path) -> Recipe:
    """Read a recipe file, or a shipped recipe by its name."""
    path = recipe_file(path)
    try:
        text = path.read_text()
    except OSError as err:
        names = ", ".join(sorted(p.stem for p in recipes_dir().glob("*.yaml")))
        raise HPCAIError(f"cannot read recipe {path}: {err.strerror}",
                         f"give the path of a recipe YAML file, or the name of one shipped: {names}") from None
    return parse_recipe(text, source=str(path), base_dir=path.resolve().parent)
