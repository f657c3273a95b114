"""What is right on the machine a test runs on: whether it has real GPUs (``nvidia-smi -L`` lists one), and what
``nvidia-smi`` reads for a rank's device, to check our GPU readings against (blank, with a reason, without GPUs)."""

from __future__ import annotations

import shutil
import subprocess
from functools import cache

UTIL_TOLERANCE = 25.0  # percentage points: the two reads are moments apart on a GPU that may be busy
MEM_TOLERANCE = 512 * 2**20  # bytes: allocator growth between the two reads


@cache
def real_gpus() -> tuple[str, ...]:
    """``nvidia-smi -L``'s GPU lines here; none without nvidia-smi, or where it fails or lists none."""
    if shutil.which("nvidia-smi") is None:
        return ()
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    return tuple(line for line in done.stdout.splitlines() if line.startswith("GPU ")) if done.returncode == 0 else ()


def smi(device: str, fields: str) -> list[str] | None:
    """``nvidia-smi --query-gpu=FIELDS -i DEVICE`` (an index or a UUID), or None where it knows no such device."""
    if not real_gpus():
        return None
    done = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", device],
                          capture_output=True, text=True, timeout=60)
    return [v.strip() for v in done.stdout.strip().split(",")] if done.returncode == 0 and done.stdout.strip() else None


def smi_reading(device: str) -> tuple[float | None, int | None] | None:
    """nvidia-smi's utilisation (percent) and memory used (bytes) of ``device``; None where it knows none; a value
    it prints as ``[N/A]`` (a GPU in MIG mode) is None."""
    values = smi(device, "utilization.gpu,memory.used")
    if values is None:
        return None
    util, mem = (None if v.startswith("[") else float(v) for v in values)
    return util, None if mem is None else int(mem * 2**20)


def check_reading(util: float | None, mem: int | None, note: str, device: str) -> None:
    """Our reading of a rank's ``device`` is right for this machine: blank with a reason where nvidia-smi knows no
    such GPU (none here, or a device this machine lacks), else nvidia-smi's figures within the tolerances."""
    expected = smi_reading(device)
    if expected is None:
        assert util is None and mem is None and note, (util, mem, note, device)
        return
    smi_util, smi_mem = expected
    assert (util is None) == (smi_util is None) and (mem is None) == (smi_mem is None), (util, mem, expected)
    assert util is None or abs(util - smi_util) <= UTIL_TOLERANCE, (device, util, smi_util)  # type: ignore[operator]
    assert mem is None or abs(mem - smi_mem) <= MEM_TOLERANCE, (device, mem, smi_mem)  # type: ignore[operator]


def distinct_real_gpus(devices: list[str]) -> bool:
    """The devices that are real GPUs here (nvidia-smi knows them) are different GPUs (their UUIDs differ)."""
    uuids = [values[0] for values in (smi(d, "uuid") for d in devices) if values]
    return len(uuids) == len(set(uuids))
