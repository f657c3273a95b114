"""Which GPU each rank gets and reads (ranks/gpus.py, identity.pin, the telemetry sampler), from recorded
``nvidia-smi`` answers (tests/data/gpus/) for every form of CUDA_VISIBLE_DEVICES: indices, GPU UUIDs and MIG
instances (new and old form); a device NVML cannot find is read as blank, with the reason, never as another's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from helpers.gpus import check_reading, real_gpus, smi_reading
from helpers.nvml_record import RecordedNvml
from jupyter_hpcai.ranks import gpus, telemetry
from jupyter_hpcai.ranks.identity import pin

MIB = 2**20


def ranks_devices(visible: str, ranks: int, nvml: RecordedNvml) -> list[gpus.Device]:
    """Each local rank's device, as pin and the resolver give it on one node with ``visible`` set by Slurm."""
    devices = []
    for local in range(ranks):
        env = {"CUDA_VISIBLE_DEVICES": visible, "SLURM_LOCALID": str(local), "SLURM_TASKS_PER_NODE": str(ranks)}
        pin(env, 8)
        devices.append(gpus.rank_device(env, nvml))
    return devices


def test_the_entries_of_cuda_visible_devices() -> None:
    assert gpus.entries(" GPU-a , MIG-b,,3 ") == ["GPU-a", "MIG-b", "3"]
    assert gpus.rank_entry({"CUDA_VISIBLE_DEVICES": "2,3"}) == "2"
    assert gpus.rank_entry({}) == "0"  # unset: CUDA sees every GPU and uses the first
    assert gpus.rank_entry({"CUDA_VISIBLE_DEVICES": ""}) is None  # empty: CUDA sees none


def test_indices_give_each_rank_its_own_gpu() -> None:
    nvml = RecordedNvml("plain-4xa100")
    devices = ranks_devices("0,1,2,3", 4, nvml)
    assert [d.uuid for d in devices] == [g.uuid for g in nvml.gpus]
    readings = [gpus.read(d, nvml) for d in devices]
    assert [(r.util, r.mem) for r in readings] == [(97, 61233 * MIB), (42, 20417 * MIB), (0, 4 * MIB),
                                                   (88, 79105 * MIB)]
    assert all(r.note == "" for r in readings)


def test_gpu_uuids_resolve_by_uuid_not_by_position() -> None:
    """Slurm may hand a node's GPUs as UUIDs, in any order: rank 0 gets GPU 2, and reads GPU 2's figures."""
    nvml = RecordedNvml("plain-4xa100")
    third, first = nvml.gpus[2].uuid, nvml.gpus[0].uuid
    devices = ranks_devices(f"{third},{first}", 2, nvml)
    assert [d.uuid for d in devices] == [third, first] and not any(d.mig for d in devices)
    assert [(r.util, r.mem) for r in (gpus.read(d, nvml) for d in devices)] == [(0, 4 * MIB), (97, 61233 * MIB)]


@pytest.mark.parametrize("machine", ["a100-mig", "h100-mig"])
def test_mig_uuids_give_each_rank_its_instance_and_its_memory(machine: str) -> None:
    nvml = RecordedNvml(machine)
    instances = list(nvml.gpus[0].mig_devices.values())
    devices = ranks_devices(",".join(m.uuid for m in instances), len(instances), nvml)
    assert [d.uuid for d in devices] == [m.uuid for m in instances] and all(d.mig for d in devices)
    readings = [gpus.read(d, nvml) for d in devices]
    assert [r.mem for r in readings] == [m.memory_mib * MIB for m in instances]
    assert len({r.mem for r in readings}) == len(instances)  # a control: each instance's figure is its own
    assert all(r.util is None and r.note == gpus.MIG_NO_UTIL for r in readings), readings


def test_the_old_mig_form_resolves_by_its_instance_ids() -> None:
    """``MIG-GPU-<uuid>/<gi>/<ci>`` (drivers before R470): the instance with those ids, not the first."""
    nvml = RecordedNvml("a100-mig-r450")
    second = nvml.gpus[0].mig_devices[1]
    device = gpus.resolve(second.uuid, nvml)
    assert device.handle is second and device.mig
    assert gpus.read(device, nvml) == gpus.Reading(None, 1903 * MIB, gpus.MIG_NO_UTIL)


@pytest.mark.parametrize(("machine", "entry", "why"), [
    ("plain-4xa100", "GPU-00000000-0000-0000-0000-000000000000",
     "unavailable: NVML cannot find GPU-00000000-0000-0000-0000-000000000000 (Not Found)"),
    ("h100-mig", "MIG-00000000-0000-0000-0000-000000000000",
     "unavailable: NVML cannot find MIG-00000000-0000-0000-0000-000000000000 (Not Found)"),
    ("plain-4xa100", "7", "unavailable: NVML cannot find 7 (Invalid Argument)"),
    ("a100-mig-r450", "MIG-GPU-e91edf3b-b297-37c1-a2a7-7601c3238fa2/9/0",
     "unavailable: GPU-e91edf3b-b297-37c1-a2a7-7601c3238fa2 has no MIG instance with GPU instance 9 and compute "
     "instance 0"),
    ("a100-mig-r450", "MIG-GPU-e91edf3b-b297-37c1-a2a7-7601c3238fa2/1",
     "unavailable: 'MIG-GPU-e91edf3b-b297-37c1-a2a7-7601c3238fa2/1' is no MIG identifier "
     "(MIG-GPU-<uuid>/<gpu instance>/<compute instance>)"),
    ("plain-4xa100", "NoDevFiles", "unavailable: 'NoDevFiles' is no index, GPU UUID or MIG identifier"),
], ids=["unknown-gpu-uuid", "unknown-mig-uuid", "index-out-of-range", "old-mig-unknown-instance", "old-mig-malformed",
        "not-a-device"])
def test_a_device_nvml_cannot_find_is_unavailable_with_the_reason(machine: str, entry: str, why: str) -> None:
    nvml = RecordedNvml(machine)
    device = gpus.resolve(entry, nvml)
    assert (device.handle, device.why) == (None, why)
    assert gpus.read(device, nvml) == gpus.Reading(None, None, why)


def test_a_gpu_in_mig_mode_has_memory_but_no_utilisation() -> None:
    nvml = RecordedNvml("a100-mig")
    assert gpus.read(gpus.resolve("0", nvml), nvml) == gpus.Reading(None, 11520 * MIB, "utilisation: Not Supported")
    assert gpus.read(gpus.resolve("1", nvml), nvml) == gpus.Reading(73, 30211 * MIB, "")  # a control: GPU 1 is whole


def test_the_sampler_reads_the_ranks_own_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the telemetry sampler, with NVML answering from the record: a rank pinned to GPU 3 by UUID
    writes GPU 3's figures, and one whose UUID NVML does not know writes blanks with the reason."""
    nvml = RecordedNvml("plain-4xa100")
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    for visible, expected in ((nvml.gpus[3].uuid, (88.0, 79105 * MIB, "")),
                              ("GPU-ffffffff-0000-0000-0000-000000000000",
                               (None, None, "unavailable: NVML cannot find GPU-ffffffff-0000-0000-0000-000000000000 "
                                            "(Not Found)"))):
        sampler = telemetry.Sampler(tmp_path, 0, "n1", 2.0, {"CUDA_VISIBLE_DEVICES": visible})
        sampler.take(None)
        taken = telemetry.read(tmp_path)[0]
        assert (taken.gpu_util, taken.gpu_mem, taken.gpu_note) == expected
    assert telemetry.rows([taken])[0][-3:] == ("-", "-", expected[2])  # %hpc top says why the GPU columns are blank


def test_without_nvidia_ml_py_the_reading_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert telemetry._Gpu({}).read() == gpus.Reading(
        None, None, "no GPU readings: nvidia-ml-py is not installed in this env")


def test_the_machine_checks_hold_for_the_right_reading_and_fail_for_a_wrong_one() -> None:
    """tests/helpers/gpus.py, which the sampler and engine tests use: here, without GPUs, a blank reading with a
    reason is right and figures (or a blank without a reason) are wrong; with GPUs, nvidia-smi's figures are right
    and a blank is wrong."""
    if real_gpus():
        util, mem = smi_reading("0")  # type: ignore[misc]
        check_reading(util, mem, "", "0")
        with pytest.raises(AssertionError):
            check_reading(None, None, "no GPU readings: NVML: Driver Not Loaded", "0")
    else:
        check_reading(None, None, "no GPU readings: NVML: NVML Shared Library Not Found", "0")
        with pytest.raises(AssertionError):
            check_reading(50.0, 2**30, "", "0")
        with pytest.raises(AssertionError):
            check_reading(None, None, "", "0")
