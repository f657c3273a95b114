"""An NVML stand-in that answers from recorded ``nvidia-smi`` output (tests/data/gpus/): the calls ranks/gpus.py
makes, with the errors the real library raises (``Not Found``, ``Invalid Argument``, ``Not Supported``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

DATA = Path(__file__).resolve().parents[1] / "data" / "gpus"
GPU_LINE = re.compile(r"^GPU (\d+): (.+) \(UUID: (GPU-[0-9a-f-]+)\)$")
MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-\S+)\)$")
MAX_MIG = 7  # what NVML answers for an A100 or H100 in MIG mode
ERRORS = {2: "Invalid Argument", 3: "Not Supported", 6: "Not Found"}


class NVMLError(Exception):
    """pynvml.NVMLError: ``value`` is NVML's return code, ``str`` its message."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return ERRORS[self.value]


@dataclass
class Handle:
    uuid: str
    name: str
    mig: bool = False
    memory_mib: int = 0
    util: int | None = None  # None: NVML says Not Supported
    instance_ids: tuple[int, int] | None = None  # (GPU instance, compute instance) of a MIG device
    mig_devices: dict[int, Handle] = field(default_factory=dict)


class RecordedNvml:
    """``pynvml`` as the machine recorded in ``tests/data/gpus/NAME.*`` would answer it."""

    NVMLError = NVMLError

    def __init__(self, name: str) -> None:
        self.gpus: list[Handle] = []
        readings = {}
        for line in (DATA / f"{name}.query.csv").read_text().splitlines():
            _, uuid, util, memory = (part.strip() for part in line.split(","))
            readings[uuid] = (None if util.startswith("[") else int(util), int(memory))
        mig_memory = {}
        if (DATA / f"{name}.mig.csv").exists():
            mig_memory = {uuid: int(mib) for uuid, mib in
                          (line.split(", ") for line in (DATA / f"{name}.mig.csv").read_text().splitlines())}
        for line in (DATA / f"{name}.L.txt").read_text().splitlines():
            if gpu := GPU_LINE.match(line):
                util, memory = readings[gpu[3]]
                self.gpus.append(Handle(gpu[3], gpu[2], memory_mib=memory, util=util))
            elif mig := MIG_LINE.match(line):
                ids = re.search(r"/(\d+)/(\d+)$", mig[3])
                self.gpus[-1].mig_devices[int(mig[2])] = Handle(
                    mig[3], f"MIG {mig[1]}", mig=True, memory_mib=mig_memory[mig[3]],
                    instance_ids=(int(ids[1]), int(ids[2])) if ids else None)
            else:
                raise ValueError(f"not an nvidia-smi -L line: {line!r}")

    def devices(self) -> list[Handle]:
        """Every GPU and MIG device recorded."""
        return [h for gpu in self.gpus for h in (gpu, *gpu.mig_devices.values())]

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        if not 0 <= index < len(self.gpus):
            raise NVMLError(2)
        return self.gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Handle:
        """GPU UUIDs and (R470 and later) MIG UUIDs; the old ``MIG-GPU-.../gi/ci`` form is not a UUID NVML takes."""
        for handle in self.devices():
            if handle.uuid == uuid and "/" not in uuid:
                return handle
        raise NVMLError(6)

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        return handle.uuid

    def nvmlDeviceIsMigDeviceHandle(self, handle: Handle) -> int:
        return int(handle.mig)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:
        return MAX_MIG if handle.mig_devices else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, index: int) -> Handle:
        if index not in handle.mig_devices:
            raise NVMLError(6)
        return handle.mig_devices[index]

    def nvmlDeviceGetGpuInstanceId(self, handle: Handle) -> int:
        if handle.instance_ids is None:
            raise NVMLError(3)
        return handle.instance_ids[0]

    def nvmlDeviceGetComputeInstanceId(self, handle: Handle) -> int:
        if handle.instance_ids is None:
            raise NVMLError(3)
        return handle.instance_ids[1]

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> SimpleNamespace:
        """Not Supported for a MIG device and for a GPU in MIG mode, as on the real library."""
        if handle.mig or handle.util is None:
            raise NVMLError(3)
        return SimpleNamespace(gpu=handle.util, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> SimpleNamespace:
        return SimpleNamespace(used=handle.memory_mib * 2**20)
