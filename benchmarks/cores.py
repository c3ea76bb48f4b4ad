"""How JAX training processes share this machine's cores, without Spark.

Runs the worker's compiled training step (784-500-500-10 MLP, batch 32, Adam, a window of
12 steps per call) in 1 or 2 processes at once, each either free to use every core or
pinned to its own core (as `distkeras.executor.affinity` pins workers), and reports samples per
second and the CPU each process used per second of wall time. This is the evidence behind
pinning workers, and the ceiling any trainer meets on this machine.

    python benchmarks/cores.py [--samples 30720]
"""

import argparse
import json
import os
import subprocess
import sys
import textwrap

sys.path.insert(0, os.path.dirname(__file__))

import distkeras  # noqa: E402,F401  (JAX as the Keras backend, as in every distkeras process)

_STEPS = textwrap.dedent("""
    import json, os, resource, sys, time
    cores = json.loads(sys.argv[2])
    if cores:
        os.sched_setaffinity(0, cores)  # before JAX starts its threads: they inherit it
    import numpy as np
    sys.path.insert(0, sys.argv[3])
    from fashion_mnist import build_mlp
    from distkeras.datasets import load_fashion_mnist_numpy
    from distkeras.executor.replica import ModelReplica
    samples = int(sys.argv[1])
    images, labels = load_fashion_mnist_numpy("train")
    x = images[:samples].reshape(samples, -1).astype("float32") / 255.0
    y = np.eye(10, dtype="float32")[labels[:samples]]
    model = build_mlp()
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    replica = ModelReplica(model, lambda logs, size: None, lambda logs, size, count: None)
    windows = [[(x[i + j * 32:i + (j + 1) * 32], y[i + j * 32:i + (j + 1) * 32])
                for j in range(12)] for i in range(0, samples - 383, 384)]
    replica.train_on_window(windows[0])
    replica.get_weights()  # compiled and finished before the clock starts
    print("ready", flush=True)
    sys.stdin.readline()
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for window in windows:
        replica.train_on_window(window)
    replica.get_weights()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(json.dumps({"rate": len(windows) * 384 / wall, "cpu_per_wall": cpu / wall}))
""")


def run_together(samples, core_sets):
    """Starts one process per entry of ``core_sets`` (None: unpinned), times them together."""
    examples = os.path.join(os.path.dirname(__file__), "..", "examples")
    env = dict(os.environ, KERAS_BACKEND="jax")
    processes = [subprocess.Popen(
        [sys.executable, "-c", _STEPS, str(samples), json.dumps(cores), examples],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        for cores in core_sets]
    for process in processes:
        line = process.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"A step process failed to start: {line!r}")
    for process in processes:  # start every process at once
        process.stdin.write("\n")
        process.stdin.flush()
    results = [json.loads(process.stdout.readline()) for process in processes]
    for process in processes:
        process.wait()
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30720)
    args = parser.parse_args()
    import report

    cores = sorted(os.sched_getaffinity(0))
    cases = [
        ("1 process, every core", [None]),
        ("1 process, pinned to 1 core", [[cores[0]]]),
        ("2 processes, every core each", [None, None]),
        ("2 processes, 1 core each (distkeras's pinning)", [[cores[0]], [cores[1]]]),
    ]
    rows = []
    for name, core_sets in cases:
        results = run_together(args.samples, core_sets)
        total = sum(result["rate"] for result in results)
        rows.append([name, f"{total:.0f}",
                     " / ".join(f"{result['cpu_per_wall']:.2f}" for result in results)])
    unpinned = rows[0][2]  # this run's, not a figure from an earlier one
    body = (f"{args.samples} samples per process, batch 32, Adam, 12 steps per compiled call "
            "(the worker's window path), no Spark. `--xla_cpu_multi_thread_eigen=false` "
            "does not keep JAX's CPU backend on one core: an unpinned process alone used "
            f"{unpinned} of {len(cores)} cores in this run.\n\n"
            + report.table(["processes", "samples/s (all processes)", "CPU s per wall s, "
                            "each process"], rows))
    report.write_section("Cores: unpinned and pinned training processes", body)


if __name__ == "__main__":
    main()
