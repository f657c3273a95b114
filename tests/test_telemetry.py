"""The telemetry sampler and its readers in this process (the ranks' side runs in test_engines.py)."""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from helpers.gpus import check_reading
from jupyter_hpcai.ranks import telemetry
from jupyter_hpcai.proc import wait_until


def sample(rank: int, rates: list[float], at: float | None = None) -> telemetry.Sample:
    return telemetry.Sample(rank, "n1", 100 + rank, time.time() if at is None else at, 2.0, 50.0, 2**30,
                            rate=rates[-1] if rates else None, rate_history=rates)


def test_a_sampler_writes_whole_samples_and_reports_the_rate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry, "_sampler", None)
    telemetry.start_sampling({telemetry.FOLDER_VAR: str(tmp_path), telemetry.INTERVAL_VAR: "0.2",
                              "SLURM_PROCID": "3", "SLURMD_NODENAME": "n2"})
    try:
        first = wait_until(lambda: telemetry.read(tmp_path) or None, timeout=10, what="a first sample")[0]
        assert (first.rank, first.host, first.rate) == (3, "n2", None)  # no steps yet
        check_reading(first.gpu_util, first.gpu_mem, first.gpu_note, "0")  # no CUDA_VISIBLE_DEVICES: CUDA's first GPU
        assert first.rss > 2**20 and first.fresh()
        end = time.time() + 1
        while time.time() < end:  # about 1000 items a second
            telemetry.step(10)
            time.sleep(0.01)
        rated = wait_until(lambda: [s for s in telemetry.read(tmp_path) if s.rate is not None and s.rate > 100] or None,
                           timeout=10, what="a sample with the rate")[0]
        assert rated.rate < 2000 and len(rated.cpu_history) >= 2
        assert json.loads((tmp_path / "telemetry-3.json").read_text())["rank"] == 3
        assert telemetry.set_interval(0)  # off: the file goes and no new one comes
        assert wait_until(lambda: not (tmp_path / "telemetry-3.json").exists(), timeout=5, what="the file to go")
        time.sleep(telemetry.PAUSED_CHECK + 0.5)
        assert telemetry.read(tmp_path) == []
    finally:
        telemetry.set_interval(0)


def test_set_interval_without_a_sampler_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry, "_sampler", None)
    assert telemetry.set_interval(1.0) is False


def test_stragglers_are_judged_on_recent_rates_against_the_median() -> None:
    steady = [sample(r, [100.0] * 5) for r in (0, 2, 3)]
    assert telemetry.stragglers([*steady, sample(1, [100.0, 100.0, 100.0, 100.0, 10.0])]) == set()  # one slow sample
    assert telemetry.stragglers([*steady, sample(1, [40.0] * 5)]) == {1}
    assert telemetry.stragglers([*steady, sample(1, [40.0] * 5)], ratio=0.3) == set()
    assert telemetry.stragglers([sample(0, [100.0]), sample(1, [])]) == set()  # one rank reporting: no median
    assert telemetry.stragglers([sample(0, [0.0]), sample(1, [0.0])]) == set()  # all stopped: nobody is slower


def test_rows_say_what_is_blank_stale_or_slow() -> None:
    rows = telemetry.rows([*(sample(r, [100.0] * 5) for r in (0, 2)), sample(1, [20.0] * 5),
                           sample(3, [100.0] * 5, at=time.time() - 60)])
    by_rank = {row[0]: row for row in rows}
    assert by_rank["0"][2:] == ("50", "1.0 GiB", "-", "-", "100.0", "")
    assert by_rank["1"][-1].startswith("straggler")
    assert by_rank["3"][-1] == "no sample for 60 s"


def test_read_skips_what_is_not_a_sample(tmp_path: Path) -> None:
    (tmp_path / "telemetry-0.json").write_text("{half")
    (tmp_path / "telemetry-1.json").write_text(json.dumps({"rank": 1}))
    good = sample(2, [5.0])
    (tmp_path / "telemetry-2.json").write_text(json.dumps(good.__dict__))
    assert [s.rank for s in telemetry.read(tmp_path)] == [2]


def test_the_straggler_share_is_a_setting() -> None:
    assert telemetry.straggler_share({}) == 0.67
    assert telemetry.straggler_share({telemetry.STRAGGLER_VAR: "0.5"}) == 0.5
    for bad in ("half", "0", "1.5", "-1"):  # not a share: the default, not an error in every refresh
        assert telemetry.straggler_share({telemetry.STRAGGLER_VAR: bad}) == 0.67


def test_the_torch_hook_counts_each_forward_pass_by_its_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry, "_steps", 0)

    class Batch:
        shape = (16, 3, 32, 32)

    class Module:  # what torch_hook needs of an nn.Module (the torch env's own test trains with it)
        hooks: list = []

        def register_forward_hook(self, hook):  # type: ignore[no-untyped-def]
            self.hooks.append(hook)
            return "handle"

    module = Module()
    assert telemetry.torch_hook(module) == "handle"
    for _ in range(3):
        module.hooks[0](module, (Batch(),), None)
    assert telemetry._steps == 48


@pytest.mark.slurm
def test_the_keras_callback_counts_each_batch(tf_env) -> None:  # type: ignore[no-untyped-def]
    """In the TensorFlow env: model.fit with the callback reports batch size x batches."""
    code = ("import numpy as np, tensorflow as tf\nfrom jupyter_hpcai.ranks import telemetry\n"
            "m = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])\nm.compile('sgd', 'mse')\n"
            "m.fit(np.zeros((40, 4)), np.zeros(40), batch_size=8, epochs=2, verbose=0,"
            " callbacks=[telemetry.keras_callback(8)])\nprint('steps', telemetry._steps)")
    out = subprocess.run([str(tf_env.current_link / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=300)
    assert "steps 80" in out.stdout, out.stderr[-2000:]


TORCH_LOOP = """import json, statistics, sys, tempfile, time
import torch
from torch import nn
from jupyter_hpcai.ranks import telemetry

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
images, labels = torch.rand(BATCH, 3, 32, 32), torch.randint(0, 10, (BATCH,))
with tempfile.TemporaryDirectory() as folder:
    telemetry.start_sampling({telemetry.FOLDER_VAR: folder, telemetry.INTERVAL_VAR: "0.25", "HPCAI_RANK": "0"})
    handle = telemetry.torch_hook(model)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < SECONDS:
        opt.zero_grad()
        nn.functional.cross_entropy(model(images), labels).backward()
        opt.step()
        steps += 1
    loop_rate = BATCH * steps / (time.perf_counter() - start)
    time.sleep(0.6)  # two more samples: the rate falls to 0 once the loop stops
    handle.remove()
    model(images)  # after remove(): not counted
    sample = telemetry.read(telemetry.Path(folder))[0]
    print(json.dumps({"steps": steps, "items": telemetry._steps, "loop_rate": loop_rate,
                      "rates": sample.rate_history}))
"""


def test_the_torch_hook_reports_a_real_training_loops_rate(torch_env) -> None:  # type: ignore[no-untyped-def]
    """In the torch env, in a plain process: a real model trained with torch_hook on it; the telemetry counts every
    forward pass by its batch (exactly the loop's steps x batch) and its sampled rate, over the samples taken wholly
    inside the loop, is the loop's own images/s."""
    batch, seconds = 16, 4.0
    code = TORCH_LOOP.replace("BATCH", str(batch)).replace("SECONDS", str(seconds))
    done = subprocess.run([str(torch_env.current_link / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["steps"] > 20 and found["items"] == batch * found["steps"], found
    inside = found["rates"][1:-3]  # the first sample began before the loop; the last ones straddle or follow its end
    assert len(inside) >= 8 and found["rates"][-1] == 0.0, found
    assert abs(statistics.median(inside) / found["loop_rate"] - 1) < 0.2, found
