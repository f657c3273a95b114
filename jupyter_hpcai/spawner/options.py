"""Spawn options: admin profiles, limits merged from the scheduler and admin config, validated user input.

Every value that reaches a batch script passes a model here first: types, ranges, choices and
patterns that allow no newline, no space and no shell metacharacter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import HPCAIError
from ..scheduler.durations import format_duration, parse_duration
from ..scheduler.interface import Associations, Partition
from . import associations

FIELDS = ("profile", "partition", "nodes", "gpus_per_node", "walltime", "account", "qos", "environment")
Word = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
WALLTIME = r"^(\d{1,3}-)?\d{1,3}(:\d{2}){0,2}$"


class Profile(BaseModel):
    """An admin-defined starting point for the form."""

    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, Field(min_length=1, max_length=80, pattern=r"^[^\n\r<>]*$")]
    partition: Word
    nodes: int = Field(default=1, ge=1)
    gpus_per_node: int = Field(default=1, ge=0)
    walltime: Annotated[str, Field(pattern=WALLTIME)] = "01:00:00"
    account: Annotated[str, Field(pattern=r"^([A-Za-z0-9_.-]{1,64})?$")] = ""
    qos: Annotated[str, Field(pattern=r"^([A-Za-z0-9_.-]{1,64})?$")] = ""
    environment: str = ""
    # Seconds before the walltime at which Slurm signals the job (the walltime guard); None: the spawner's
    # walltime_warning; 0: no signal.
    walltime_warning: int | None = Field(default=None, ge=0, le=86400)
    # The job lives on when one of its nodes fails (sbatch --no-kill): a cell run with --elastic goes on with the
    # ranks left (%%torchrun --elastic MIN); without it Slurm ends the whole job with the node.
    no_kill: bool = False
    # The job starts one engine per GPU beside the server and its first kernel takes them (engines/warm.py), so that
    # the first distributed cell finds them ready; off: they start at %hpc start or the first distributed cell.
    start_engines: bool = False
    # The job's nodes run no other user's jobs meanwhile (sbatch --exclusive=user): torch's rendezvous store takes
    # no key, and another user's job on a node of the world can reach it. None (the default): on for a job of more
    # than one node; a one-node job shares its node as the site allows (hpcai site check warns where it does).
    exclusive_user: bool | None = None
    # Each rank's CPUs and memory, one rank per GPU (sbatch --cpus-per-task and --mem-per-gpu, asked for only when
    # the job has GPUs); None: the site's defaults (DefCpuPerGPU, DefMemPerGPU...).
    cpus_per_gpu: int | None = Field(default=None, ge=1, le=1024)
    mem_per_gpu: Annotated[str, Field(pattern=r"^[1-9][0-9]*[KMGT]?$")] | None = None

    def exclusive(self, nodes: int) -> bool:
        """Whether a job of ``nodes`` nodes from this profile asks for nodes of its user's alone."""
        return nodes > 1 if self.exclusive_user is None else self.exclusive_user
    # Extra sbatch options set by the admin (users cannot change them), e.g. ["--qos=interactive"].
    extra_sbatch: list[Annotated[str, Field(pattern=r"^--[a-z][a-z-]*(=[A-Za-z0-9_.,:=/+-]+)?$")]] = []


class SpawnOptions(BaseModel):
    """A user's validated request: safe to write into a batch script."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    profile: Annotated[str, Field(max_length=80, pattern=r"^[^\n\r<>]*$")]
    partition: Word
    nodes: int = Field(ge=1, le=1024)
    gpus_per_node: int = Field(ge=0, le=64)
    walltime: Annotated[str, Field(pattern=WALLTIME)]
    account: Annotated[str, Field(pattern=r"^([A-Za-z0-9_.-]{1,64})?$")] = ""
    qos: Annotated[str, Field(pattern=r"^([A-Za-z0-9_.-]{1,64})?$")] = ""
    environment: Annotated[str, Field(pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]{0,63})?$")] = ""

    @field_validator("nodes", "gpus_per_node", mode="before")
    @classmethod
    def _whole_number(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip().lstrip("-").isdigit():
            raise ValueError("must be a whole number")
        return value

    @property
    def walltime_seconds(self) -> int:
        return parse_duration(self.walltime) or 0


@dataclass(frozen=True)
class Limit:
    """What one partition allows: the scheduler's numbers, narrowed by the admin's."""

    partition: str
    max_nodes: int
    max_gpus_per_node: int
    max_walltime: int | None  # seconds
    idle_nodes: int = 0
    idle_gpus: int = 0

    def describe(self) -> str:
        time = format_duration(self.max_walltime) if self.max_walltime else "no limit"
        return (f"{self.partition}: {self.idle_nodes}/{self.max_nodes} nodes idle, {self.idle_gpus} GPUs free, "
                f"up to {self.max_gpus_per_node} GPUs per node, max time {time}")


def merge_limits(partitions: list[Partition], admin: Mapping[str, Mapping[str, Any]],
                 allowed: list[str] | None = None) -> dict[str, Limit]:
    """Scheduler limits narrowed by admin overrides (``{"gpu": {"max_nodes": 2, "max_walltime": "08:00:00"}}``)."""
    limits = {}
    for p in partitions:
        if allowed and p.name not in allowed:
            continue
        extra = admin.get(p.name, {})
        admin_time = parse_duration(str(extra["max_walltime"])) if "max_walltime" in extra else None
        times = [t for t in (p.max_time, admin_time) if t]
        limits[p.name] = Limit(
            partition=p.name,
            max_nodes=min(p.nodes, int(extra.get("max_nodes", p.nodes))),
            max_gpus_per_node=min(p.gpus_per_node, int(extra.get("max_gpus_per_node", p.gpus_per_node))),
            max_walltime=min(times) if times else None,
            idle_nodes=p.idle_nodes, idle_gpus=p.idle_gpus,
        )
    return limits


class OptionsError(HPCAIError):
    """Invalid spawn options: one message per bad field."""

    def __init__(self, errors: dict[str, str]) -> None:
        self.errors = errors
        super().__init__("invalid options: " + "; ".join(f"{k}: {v}" for k, v in errors.items()),
                         "fix the fields named and submit again")


def validate(raw: Mapping[str, Any], profiles: list[Profile], limits: Mapping[str, Limit],
             environments: Mapping[str, str], found: Associations | None = None,
             site_qos: str = "") -> tuple[SpawnOptions, Profile]:
    """Check raw options (form, URL query or REST body) against the model, the limits and, where the site keeps
    accounting, the user's associations (``found``; ``site_qos``: the QOS the site sets for every server)."""
    if not profiles:
        raise OptionsError({"profile": "the admin has configured no profiles"})
    values = {k: (v[0] if isinstance(v, list) and len(v) == 1 else v) for k, v in raw.items()}
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise OptionsError({k: f"unknown option (allowed: {', '.join(FIELDS)})" for k in unknown})
    shapes = {k: _shape(v) for k, v in values.items() if v is not None and not isinstance(v, (str, int))
              or isinstance(v, bool)}
    if shapes:  # a REST body's object, list or true/false: the field's name and what to send instead
        raise OptionsError({k: f"must be text or a whole number, not {shape}" for k, shape in shapes.items()})
    by_name = {p.name: p for p in profiles}
    name = values.get("profile") or profiles[0].name
    if name not in by_name:
        raise OptionsError({"profile": f"unknown profile {str(name)[:80]!r} (choose from: {', '.join(by_name)})"})
    profile = by_name[name]
    merged = {**profile.model_dump(include=set(FIELDS)), "profile": name,
              **{k: v for k, v in values.items() if v not in ("", None)}}
    merged = associations.filled(merged, found, site_qos or _qos(profile))
    try:
        options = SpawnOptions(**merged)
    except ValidationError as err:
        raise OptionsError({str(e["loc"][0]): _say(e) for e in err.errors()}) from None
    errors = _check_limits(options, limits, environments)
    if found is None and options.qos:
        errors["qos"] = ("no QOS to choose: the site keeps no accounting, or its accounting did not answer the hub "
                         "(leave it empty)")
    if found is not None:
        errors = {**associations.problems(options.account, options.qos, options.partition, options.nodes,
                                          options.gpus_per_node, options.walltime_seconds, found,
                                          site_qos or _qos(profile)), **errors}
    if errors:
        raise OptionsError(errors)
    return options, profile


def _qos(profile: Profile) -> str:
    """The QOS a profile's own sbatch options set, or ""."""
    return next((o.split("=", 1)[1] for o in profile.extra_sbatch if o.startswith("--qos=")), "")


def _shape(value: Any) -> str:
    """What a JSON value is, in words (never the value itself: it is the user's to write)."""
    return {dict: "an object", list: "a list", bool: "true or false", float: "a fraction"}.get(type(value),
                                                                                            type(value).__name__)


def _say(error: Mapping[str, Any]) -> str:
    """The form's own words for a field the model refused."""
    kind, ctx, given = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "string_pattern_mismatch":
        return "contains characters that are not allowed (letters, digits, '.', '_' and '-' only; no spaces or newlines)" \
            if error["loc"][0] != "walltime" else "must look like HH:MM:SS, MM or D-HH:MM:SS"
    if kind == "greater_than_equal":
        return f"must be {ctx['ge']} or more, not {given}"
    if kind == "less_than_equal":
        return f"must be {ctx['le']} or less, not {given}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return "must be a whole number"
    if kind == "string_too_long":
        return f"is too long (at most {ctx.get('max_length')} characters)"
    return str(error["msg"]).removeprefix("Value error, ")


def _check_limits(o: SpawnOptions, limits: Mapping[str, Limit], environments: Mapping[str, str]) -> dict[str, str]:
    errors: dict[str, str] = {}
    limit = limits.get(o.partition)
    if limit is None:
        errors["partition"] = f"unknown partition '{o.partition}' (choose from: {', '.join(limits) or 'none'})"
    else:
        if o.nodes > limit.max_nodes:
            errors["nodes"] = f"{o.nodes} is more than the {limit.max_nodes} allowed on {o.partition}"
        if o.gpus_per_node > limit.max_gpus_per_node:
            errors["gpus_per_node"] = f"{o.gpus_per_node} is more than the {limit.max_gpus_per_node} per node on {o.partition}"
        if o.walltime_seconds < 60:
            errors["walltime"] = "must be at least one minute"
        elif limit.max_walltime and o.walltime_seconds > limit.max_walltime:
            errors["walltime"] = f"{o.walltime} is longer than {format_duration(limit.max_walltime)}, the limit on {o.partition}"
    if o.environment and environments and o.environment not in environments:
        errors["environment"] = f"unknown environment '{o.environment}' (choose from: {', '.join(environments)})"
    return errors
