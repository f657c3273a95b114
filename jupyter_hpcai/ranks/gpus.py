"""Which GPU a rank uses, as NVML knows it, and its readings: from the rank's ``CUDA_VISIBLE_DEVICES`` entry.

CUDA takes three forms of entry (and Slurm's gres and cgroup plugins, or a site's prolog, may set any of them):
an index (``2``), a GPU UUID (``GPU-5d5ba0d6-...``) and a MIG instance (``MIG-<uuid>`` since driver R470,
``MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>`` before). NVML ignores ``CUDA_VISIBLE_DEVICES``: an
index is NVML's index (the PCI bus order, which CUDA also follows when ``CUDA_DEVICE_ORDER=PCI_BUS_ID``), a UUID
is looked up with ``nvmlDeviceGetHandleByUUID``, and an old-form MIG entry is found among its GPU's MIG devices
by its instance ids. NVML gives a MIG instance's memory but not its utilisation (``Not Supported`` for a MIG
handle, and for a GPU in MIG mode): those readings stay blank with the reason. A device NVML does not know is
never replaced by another: its reading is blank, with why. ``nvml`` is the ``pynvml`` module (or a stand-in).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MIG_NO_UTIL = "utilisation: NVML does not report it per MIG instance"


@dataclass(frozen=True)
class Device:
    """A rank's GPU: its ``CUDA_VISIBLE_DEVICES`` entry and NVML handle, or why there is none (``why``)."""

    entry: str
    handle: Any = None
    uuid: str = ""
    mig: bool = False
    why: str = ""


@dataclass(frozen=True)
class Reading:
    """Utilisation (percent) and memory used (bytes); ``note`` says why what is blank is blank."""

    util: float | None = None
    mem: int | None = None
    note: str = ""


def entries(value: str) -> list[str]:
    """The devices a ``CUDA_VISIBLE_DEVICES`` value lists, in order (spaces and empty items dropped)."""
    return [item.strip() for item in value.split(",") if item.strip()]


def rank_entry(environ: Mapping[str, str]) -> str | None:
    """The entry of this rank's GPU (the first visible: the one CUDA calls device 0); ``"0"`` when the variable is
    unset (CUDA then sees every GPU and uses the first); None when it hides every GPU (empty)."""
    if "CUDA_VISIBLE_DEVICES" not in environ:
        return "0"
    listed = entries(environ["CUDA_VISIBLE_DEVICES"])
    return listed[0] if listed else None


def resolve(entry: str, nvml: Any) -> Device:
    """The NVML device an entry names, or a Device that says why it cannot be read (never another device)."""
    try:
        if entry.isdigit():
            handle = nvml.nvmlDeviceGetHandleByIndex(int(entry))
        elif entry.startswith("MIG-GPU-"):
            handle = _old_mig(entry, nvml)
        elif entry.startswith(("GPU-", "MIG-")):
            handle = nvml.nvmlDeviceGetHandleByUUID(entry)
        else:
            return Device(entry, why=f"unavailable: {entry!r} is no index, GPU UUID or MIG identifier")
        mig = bool(nvml.nvmlDeviceIsMigDeviceHandle(handle))
        return Device(entry, handle, _text(nvml.nvmlDeviceGetUUID(handle)), mig)
    except nvml.NVMLError as error:
        return Device(entry, why=f"unavailable: NVML cannot find {entry} ({error})")
    except LookupError as error:
        return Device(entry, why=f"unavailable: {error.args[0]}")


def _old_mig(entry: str, nvml: Any) -> Any:
    """``MIG-GPU-<gpu uuid>/<gi>/<ci>``: the MIG device of that GPU with those GPU and compute instance ids."""
    parent_uuid, _, ids = entry.removeprefix("MIG-").partition("/")
    gi, _, ci = ids.partition("/")
    if not (gi.isdigit() and ci.isdigit()):
        raise LookupError(f"{entry!r} is no MIG identifier (MIG-GPU-<uuid>/<gpu instance>/<compute instance>)")
    parent = nvml.nvmlDeviceGetHandleByUUID(parent_uuid)
    for index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, index)
        except nvml.NVMLError:  # an empty slot
            continue
        if (nvml.nvmlDeviceGetGpuInstanceId(mig), nvml.nvmlDeviceGetComputeInstanceId(mig)) == (int(gi), int(ci)):
            return mig
    raise LookupError(f"{parent_uuid} has no MIG instance with GPU instance {gi} and compute instance {ci}")


def read(device: Device, nvml: Any) -> Reading:
    """The device's utilisation and memory used now; what NVML cannot give stays blank, with the reason."""
    if device.handle is None:
        return Reading(note=device.why)
    notes = []
    try:
        util: float | None = float(nvml.nvmlDeviceGetUtilizationRates(device.handle).gpu)
    except nvml.NVMLError as error:
        util = None
        notes.append(MIG_NO_UTIL if device.mig else f"utilisation: {error}")
    try:
        mem: int | None = int(nvml.nvmlDeviceGetMemoryInfo(device.handle).used)
    except nvml.NVMLError as error:
        mem = None
        notes.append(f"memory: {error}")
    return Reading(util, mem, "; ".join(notes))


def rank_device(environ: Mapping[str, str], nvml: Any) -> Device:
    """This rank's GPU (``rank_entry``), resolved; ``nvml`` already initialised."""
    entry = rank_entry(environ)
    if entry is None:
        return Device("", why="no GPU: CUDA_VISIBLE_DEVICES is empty")
    return resolve(entry, nvml)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
