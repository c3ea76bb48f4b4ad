"""AllReduceTrainer's step against one process's step at the same global batch.

Times distkeras's JAX step (`executor.replica.ModelReplica`) on a zoo model: in one
process at batch ``2 * batch``, then in two processes on 127.0.0.1 at ``batch`` each,
joined by ``jax.distributed`` (gloo) under Keras's ``DataParallel``, as AllReduceTrainer's
workers run it. Prints ms per step and samples per second of the global batch.

    python benchmarks/allreduce_step.py [--models mlp cnn] [--batch 32] [--steps 150]
"""

import argparse
import os
import socket
import subprocess
import sys
import time


def child(kind, process_id, processes, port, batch, steps):
    """One process's timing; process 0 prints it."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax
    import numpy as np

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if processes > 1:
        jax.distributed.initialize(f"127.0.0.1:{port}", processes, process_id)
    import keras

    sys.path.insert(0, os.path.dirname(__file__))
    from zoo import build_model

    from distkeras.executor.replica import ModelReplica

    keras.utils.set_random_seed(1)
    if processes > 1:
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(devices=jax.devices()))
    shape = {"mlp": (784,), "cnn": (28, 28, 1), "lstm": (28, 28)}[kind]
    rows = (steps + 5) * batch
    x = np.random.rand(rows, *shape).astype("float32")
    y = np.eye(10, dtype="float32")[np.random.randint(0, 10, rows)]
    model = build_model(kind)
    model.compile("adam", "categorical_crossentropy", metrics=["accuracy"])
    replica = ModelReplica(model, lambda logs, size: None)
    for step in range(steps + 5):
        if step == 5:  # compiled and warm
            replica.get_weights()
            start = time.perf_counter()
        replica.train_on_batch(x[step * batch:(step + 1) * batch],
                               y[step * batch:(step + 1) * batch])
    replica.get_weights()  # waits for the last step
    seconds = (time.perf_counter() - start) / steps
    if process_id == 0:
        print(f"{kind}: {processes} process(es) x batch {batch}: {seconds * 1000:.1f} ms a "
              f"step, {batch * processes / seconds:.0f} samples/s", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, process_id, processes, port = args.child
        child(kind, int(process_id), int(processes), int(port), args.batch, args.steps)
        return
    for kind in args.models:
        command = [sys.executable, __file__, "--batch", str(2 * args.batch), "--steps",
                   str(args.steps), "--child", kind, "0", "1", "0"]
        subprocess.run(command, check=True, stderr=subprocess.DEVNULL)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        both = [subprocess.Popen([sys.executable, __file__, "--batch", str(args.batch),
                                  "--steps", str(args.steps), "--child", kind, str(index),
                                  "2", str(port)], stderr=subprocess.DEVNULL,
                                 stdout=None if index == 0 else subprocess.DEVNULL)
                for index in range(2)]
        for process in both:
            process.wait()


if __name__ == "__main__":
    main()
