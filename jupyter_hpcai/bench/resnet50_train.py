"""Synthetic-data (or image-folder) ResNet-50 training with Horovod; the same file runs under srun and the engines.

Rank 0 prints one line ``HPCAI_BENCH {json}`` with images/sec in total and per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="resnet50_train")
    p.add_argument("--batch", type=int, default=32, help="images per rank per step")
    p.add_argument("--steps", type=int, default=50, help="timed steps")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    p.add_argument("--mixed-precision", action="store_true")
    p.add_argument("--xla", action="store_true")
    p.add_argument("--data-dir", help="a folder of class subfolders of images (real-data mode)")
    p.add_argument("--image-size", type=int, default=224)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    import horovod.tensorflow as hvd
    import tensorflow as tf

    if not hvd.is_initialized():
        threads = int(os.environ.get("TF_NUM_INTRAOP_THREADS", "0"))
        if threads:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        for gpu in tf.config.list_physical_devices("GPU"):
            tf.config.experimental.set_memory_growth(gpu, True)
        hvd.init()
    if args.mixed_precision:
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
    model = tf.keras.applications.ResNet50(weights=None, input_shape=(args.image_size, args.image_size, 3))
    opt = tf.keras.optimizers.SGD(0.01 * hvd.size())
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
    if args.data_dir:
        data = tf.keras.utils.image_dataset_from_directory(args.data_dir, batch_size=args.batch, shuffle=True,
                                                           image_size=(args.image_size, args.image_size))
        data = data.shard(hvd.size(), hvd.rank()).repeat().prefetch(tf.data.AUTOTUNE)
        batches = iter(data)
    else:
        images = tf.random.uniform((args.batch, args.image_size, args.image_size, 3))
        labels = tf.random.uniform((args.batch,), maxval=1000, dtype=tf.int64)
        batches = iter(lambda: (images, labels), None)

    @tf.function(jit_compile=args.xla)
    def step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    step(*next(batches))
    hvd.broadcast_variables(model.variables, root_rank=0)
    hvd.broadcast_variables(opt.variables(), root_rank=0)
    for _ in range(args.warmup):
        step(*next(batches))
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step(*next(batches))
    float(loss)  # wait for the last step
    rate = args.batch * args.steps / (time.perf_counter() - start)
    total = float(hvd.allreduce(tf.constant(rate), op=hvd.Sum))
    result = {"ranks": hvd.size(), "images_per_sec": total, "per_rank": total / hvd.size(), "batch": args.batch,
              "steps": args.steps, "gpus": len(tf.config.list_physical_devices("GPU"))}
    if hvd.rank() == 0:
        print("HPCAI_BENCH " + json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
