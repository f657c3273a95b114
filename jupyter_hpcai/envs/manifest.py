"""What a build records about itself: the typed manifest (one model per environment kind) and the lock.

Every manifest this project has written loads through these models (tests/data/manifests holds one of
each generation); keys a model does not know are kept when read and written back, so an older
jupyter-hpcai reading a newer manifest loses nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ..errors import HPCAIError
from ..paths import replace_text


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow")


class Package(_Record):
    """One installed package (conda records also carry build and channel)."""

    name: str
    version: str
    build: str | None = None
    channel: str | None = None


class StepRecord(_Record):
    step: str
    output: str
    skipped: str = ""  # why the step did not run where the env was built (a GPU-only step on a login node)


class PrefixManifest(_Record):
    """A built prefix (conda layer, python, pip layer). ``kind`` stays "conda", as every build has written."""

    kind: Literal["conda"] = "conda"
    name: str
    build_id: str
    created: str = ""
    host: str = ""
    prefix: str = ""
    recipe_hash: str
    recipe: dict[str, Any]
    locked: bool = False
    python: str | None = None
    conda: list[Package] = []
    pip: list[Package] = []
    build_env: dict[str, str] = {}
    verify: list[StepRecord] = []
    conflicts: list[str] = []
    pip_check: str = ""
    phase_seconds: dict[str, float] = {}
    builder_python: str = ""
    build_site: dict[str, Any] = {}
    installer: str = "pip"
    editables: dict[str, str] = {}  # project name -> the source folder its editable install follows


class UdockerRecord(_Record):
    """How udocker ran the import (udocker.Settings, as recorded)."""

    udocker: str
    mode: str = "P2"
    variables: dict[str, str] = {}


class Inside(_Record):
    """What the image holds, looked at when it was imported."""

    python: str = ""
    executable: str = ""
    packages: dict[str, str] = {}
    mpi: str | None = None


class ContainerManifest(_Record):
    """A udocker container made from an image."""

    kind: Literal["container"]
    name: str
    build_id: str
    source: str
    image: str
    container: str
    python: str = "python3"
    binds: list[str] = []
    udocker: UdockerRecord
    created: str = ""
    conda: list[Package] = []
    pip: list[Package] = []
    inside: Inside = Inside()


Manifest = Annotated[PrefixManifest | ContainerManifest, Field(discriminator="kind")]
_MANIFEST: TypeAdapter[PrefixManifest | ContainerManifest] = TypeAdapter(Manifest)


def _with_kind(data: Any) -> Any:
    return {"kind": "conda", **data} if isinstance(data, dict) else data


def parse_manifest(data: Any, source: str = "manifest") -> PrefixManifest | ContainerManifest:
    """A manifest from its JSON data; a clear error naming what is wrong."""
    try:
        return _MANIFEST.validate_python(_with_kind(data))
    except ValidationError as err:
        wrong = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in err.errors()[:5])
        raise HPCAIError(f"{source} is not a manifest jupyter-hpcai can read: {wrong}",
                         "rebuild the env (hpcai env build RECIPE --rebuild), or remove it") from None


class CondaLock(_Record):
    channels: list[str] = []
    specs: list[str] = []


class Lock(_Record):
    """The exact package set of a build, for ``hpcai env build --locked`` / ``--lock-file``."""

    recipe_hash: str = ""
    conda: CondaLock = CondaLock()
    pip: list[str] = []
    no_build_isolation: list[str] = []


def read_json_model(path: Path, model: type[Lock]) -> Lock:
    """A lock file, validated; a clear error for a file that is not one."""
    try:
        return model.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError) as err:
        raise HPCAIError(f"cannot read lock file {path}: {err}", "pass a lock.json written by a build") from None


def write_atomic(path: Path, model: BaseModel) -> None:
    """Write a model as JSON so that a reader sees the old file or the new one, never half of one."""
    replace_text(path, model.model_dump_json(indent=2) + "\n")
