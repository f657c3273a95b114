"""A small Horovod training loop that reports images/sec; the same file runs under srun and %%horovod_run.

Run: ``python -m jupyter_hpcai.bench.train_small [--batch 32] [--warmup 100] [--steps 200]``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

from ..ranks import telemetry


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """--batch, --warmup and --steps: the options of both small training scripts."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--steps", type=int, default=200)
    return parser.parse_args(argv)


def _training_step(batch: int) -> Callable[[bool], Any]:
    """Horovod initialised, a small convnet and one compiled training step on a fixed random batch."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    if not hvd.is_initialized():
        tf.config.threading.set_intra_op_parallelism_threads(int(os.environ.get("TF_NUM_INTRAOP_THREADS", "1")))
        tf.config.threading.set_inter_op_parallelism_threads(1)
        hvd.init()
    tf.keras.utils.set_random_seed(hvd.rank())
    model = tf.keras.Sequential([tf.keras.Input((32, 32, 3)), tf.keras.layers.Conv2D(16, 3, activation="relu"),
                                 tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(10)])
    opt = tf.keras.optimizers.SGD(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    images = tf.random.uniform((batch, 32, 32, 3))
    labels = tf.random.uniform((batch,), maxval=10, dtype=tf.int64)

    @tf.function
    def step(first: bool) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        if first:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables(), root_rank=0)
        return loss

    step(True)
    return step


def _timed(step: Callable[[bool], Any], batch: int, steps: int) -> float:
    """Images per second over all ranks for ``steps`` steps."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    start = time.perf_counter()
    for _ in range(steps):
        step(False)
        telemetry.step(batch)  # the rate %hpc top shows (a counter: nothing when no sampler runs)
    rate = batch * steps / (time.perf_counter() - start)
    return float(hvd.allreduce(tf.constant(rate), op=hvd.Sum))


def main(argv: list[str] | None = None) -> float:
    args = parse_args(argv)
    import horovod.tensorflow as hvd

    step = _training_step(args.batch)
    for _ in range(args.warmup):
        step(False)
    total = _timed(step, args.batch, args.steps)
    if hvd.rank() == 0:
        print(f"images/sec total {total:.1f} per rank {total / hvd.size():.1f} ranks {hvd.size()}", flush=True)
    return total


def telemetry_on_off(rounds: int = 4, batch: int = 32, warmup: int = 100, steps: int = 45,
                     seconds: float = 1.0) -> dict[str, list[float]]:
    """Throughput with this rank's telemetry sampling every ``seconds`` and off, alternating ``rounds`` times
    on the same model, the order swapped every round (every rank switches its own sampler, in step with the
    others); and what one sample costs this rank (``sample_ms``)."""
    step = _training_step(batch)
    for _ in range(warmup):
        step(False)
    rates: dict[str, list[float]] = {"on": [], "off": [], "sample_ms": []}
    modes = [("on", seconds), ("off", 0.0)]
    for round_ in range(rounds):
        for mode, interval in modes[:: 1 if round_ % 2 == 0 else -1]:
            telemetry.set_interval(interval)
            rates[mode].append(_timed(step, batch, steps))
    telemetry.set_interval(telemetry.DEFAULT_INTERVAL)
    rates["sample_ms"] = [1e3 * telemetry.sample_cost()]
    return rates

if __name__ == "__main__":
    main()
