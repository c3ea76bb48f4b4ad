"""Faults injected into real trainings on local Spark, and what they cost.

Writes docs/reliability.md: each fault, how it was injected, what the user sees, the time
lost against an undisturbed run, and the final test accuracy against it; plus the fuzzer's
count (run `benchmarks/fuzz_frames.py` first; its section in docs/benchmarks.md is quoted).

    python benchmarks/reliability.py [--limit 20000]
"""

import argparse
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.dirname(__file__))


DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "reliability.md")
BATCH, WINDOW, WORKERS = 32, 6, 2
# Each worker's steps at which the faults are injected: --limit must take every worker
# past the last one, or that fault's row would report an undisturbed run.
POISON_STEP, STUCK_STEP, LOST_STEP = 60, 60, 120
MIN_LIMIT = WORKERS * BATCH * (LOST_STEP + WINDOW)

# What the table cannot show, written with it so that a rerun keeps it.
LIMITS = (
    "Before its token is checked a connection may send one frame of at most 64 KiB, and the "
    "whole handshake must arrive within `handshake_timeout` (a client trickling its bytes is "
    "dropped). At most `MAX_PENDING_HANDSHAKES` (64, or twice the trainer's workers) "
    "connections may be in their handshake at once: past that the oldest is closed as a new "
    "one arrives, so a flood of connections that never send the token costs a bounded number "
    "of threads, and workers, who send theirs as they connect, still join during one. A "
    "driver out of file descriptors (`ulimit -n`) warns once and accepts again as "
    "connections close, where the server used to stop accepting for good. Punchcard refuses "
    "a model archive whose files declare more than 10 times its size (past 64 MiB): a "
    "decompression bomb would be read into the server's memory as Keras loads it. It counts "
    "the weights a model's configuration declares, without allocating them, and refuses more "
    "than that same limit: a few kilobytes declaring Dense(200000) after Dense(200000) were "
    "built in the server's process, 160 GB of weights.")

LARGE_MODELS = (
    "Large models: a worker's reply to the driver (SingleTrainer's, AveragingTrainer's and "
    "EnsembleTrainer's weights) travels in rows of at most 8 MiB. Spark's `collect()` returns "
    "the rows read so far, without an error, when the driver's JVM runs out of memory serving "
    "them: an 80 MB reply in one row (20 million float32 parameters, the default 1 GB driver "
    "heap) gave back the initial weights. A reply that does not arrive whole is now an error "
    "that names `spark.driver.memory`.")

REFUSALS = (
    'A refused commit (NaN or infinite values, or finite ones whose sum with the center '
    'would overflow float32: 3e38 added to a center near 3e38, which would otherwise make '
    'every later pull infinite) is logged as it happens, and at the end of '
    '`train()` one warning counts the refusals per worker: the returned model lacks those '
    "workers' training since their first refusal. A step that diverges (a learning rate too"
    ' high, values too large for float32) refuses every later commit of its worker, where '
    "Keras's `fit` would return NaN weights: the warning says to look there. NaN or "
    'infinite values in the data (a label, a feature) never get that far: every trainer '
    'stops as they are fed, naming the column, the row and how to drop or fill them in '
    'Spark (`fit` would train on them). Such rows (and nulls, arrays of the wrong length, '
    'class indices out of range, negative sample weights) raise '
    "`distkeras.errors.InvalidDataError`, which Spark does not retry: the worker's task "
    'ends with the error as its reply (and a worker of a parameter server tells the driver,'
    ' which stops the other workers at once), where a failed task would run again up to '
    '`spark.task.maxFailures` times (4 on a cluster), each time training up to the same '
    "rows. The same holds for a custom worker's commit that does not fit the model "
    "(`InvalidUpdateError`, naming the array and the shapes) and for a parameter server's "
    'handler that raised (a bug in a custom `handle_commit`): the training stops at once '
    'with that error.')


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=20000)
    args = parser.parse_args()
    if args.limit < MIN_LIMIT:
        parser.error(f"--limit must be at least {MIN_LIMIT}: each of the {WORKERS} workers "
                     f"must train past step {LOST_STEP}, where a fault is injected")
    import report

    spark, data, (images, labels) = report.fashion_mnist_setup("local[2,4]", args.limit)
    from distkeras.tools.experiments import build_mlp, test_accuracy
    from distkeras.trainers import ADAG, TrainingError
    from distkeras.workers import ADAGWorker

    class LostWorker(ADAGWorker):
        def communicate(self):
            from pyspark import TaskContext

            if self.worker_id == 1 and TaskContext.get().attemptNumber() == 0 \
                    and self.iteration >= LOST_STEP:
                os._exit(17)
            super().communicate()

    class PoisonWorker(ADAGWorker):
        poisoned = False

        def commit(self, delta, **extra):
            # A worker commits at its windows' ends (iterations 7, 13, ... for a window
            # of 6), so its first commit past the step, not the step itself.
            if self.worker_id == 1 and self.iteration > POISON_STEP and not self.poisoned:
                self.poisoned = True
                delta = delta * float("nan")
            super().commit(delta, **extra)

    class StuckWorker(ADAGWorker):
        def communicate(self):
            super().communicate()
            if self.worker_id == 0 and self.iteration >= STUCK_STEP:
                time.sleep(3600)

    def trainer_with(worker_class=None, **extra):
        class Faulty(ADAG):
            def allocate_worker(self):
                return (worker_class or ADAGWorker)(self.master_model)

        return Faulty(keras_model=build_mlp(), worker_optimizer="adam",
                      loss="categorical_crossentropy", num_workers=WORKERS,
                      communication_window=WINDOW, batch_size=BATCH, **extra)

    def run(worker_class=None, **extra):
        trainer = trainer_with(worker_class, **extra)
        started = time.time()
        try:
            model = trainer.train(data, verbose=0)
            outcome = time.time() - started, test_accuracy(model, images, labels), "trains on"
        except TrainingError as error:
            outcome = time.time() - started, None, str(error)
        if worker_class is PoisonWorker and not trainer.parameter_server.center.refused:
            raise RuntimeError("The NaN commit was not injected: its row would describe an "
                               "undisturbed run.")
        return outcome

    base_time, base_accuracy, _ = run()
    rows = [["none (undisturbed)", "-", "a trained model", f"{base_time:.1f} s", "-",
             f"{base_accuracy:.4f}"]]

    def add(fault, injection, outcome):
        seconds, accuracy, seen = outcome
        rows.append([fault, injection, seen if accuracy is None else
                     "a trained model; the retry/refusal is logged", f"{seconds:.1f} s",
                     f"{seconds - base_time:+.1f} s",
                     "-" if accuracy is None else f"{accuracy:.4f} ({(accuracy - base_accuracy) * 100:+.2f} points)"])

    add("lost worker process", f"worker 1 calls os._exit at step {LOST_STEP} on its first "
        "attempt; Spark retries the task (local[2,4])", run(LostWorker))
    add("NaN commit", f"worker 1 commits a NaN delta at its first commit after step "
        f"{POISON_STEP}; the server refuses it", run(PoisonWorker))
    add("hung worker", f"worker 0 sleeps an hour after step {STUCK_STEP}; worker_timeout=10",
        run(StuckWorker, worker_timeout=10))

    # The driver killed mid-training, then train(resume=True) from its last checkpoint.
    folder = tempfile.mkdtemp(prefix="distkeras-reliability-")
    parquet = os.path.join(folder, "data.parquet")
    data.write.parquet(parquet)
    checkpoints = os.path.join(folder, "ckpt")
    script = textwrap.dedent(f"""
        import sys
        from distkeras.session import local_spark_session
        spark = local_spark_session("local[2]")
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from distkeras.tools.experiments import build_mlp
        from distkeras.trainers import ADAG
        ADAG(keras_model=build_mlp(), worker_optimizer="adam", loss="categorical_crossentropy",
             num_workers=2, communication_window=6).train(
            spark.read.parquet({parquet!r}), verbose=0, checkpoint_dir={checkpoints!r},
            checkpoint_every=1.0)
    """)
    from distkeras.training.checkpoints import load_checkpoint

    spec = [(w.shape, w.dtype) for w in build_mlp().get_weights()]
    started = time.time()
    driver = subprocess.Popen([sys.executable, "-c", script], start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Killed once a checkpoint holds half of the run's commits (each worker commits at
    # every window's end), so that the resumed run has the other half to train.
    steps = math.ceil(args.limit / WORKERS / BATCH)
    halfway = WORKERS * math.ceil(steps / WINDOW) // 2
    updates = 0
    while time.time() - started < 300 and driver.poll() is None:
        checkpoint = load_checkpoint(checkpoints, spec) if os.path.exists(
            os.path.join(checkpoints, "checkpoint.dkc")) else None
        updates = checkpoint["num_updates"] if checkpoint else 0
        if updates >= halfway:
            break
        time.sleep(0.3)
    if driver.poll() is not None:
        raise RuntimeError(f"The driver to kill ended (exit code {driver.returncode}) before "
                           f"a checkpoint of {halfway} updates: its row would be no kill.")
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    killed_after = time.time() - started
    trainer = trainer_with()
    resumed_at = time.time()
    model = trainer.train(data, verbose=0, checkpoint_dir=checkpoints, resume=True)
    resumed = time.time() - resumed_at
    accuracy = test_accuracy(model, images, labels)
    rows.append(["driver killed", f"SIGKILL to the driver's process group after a checkpoint "
                 f"at {updates} updates ({killed_after:.0f} s incl. start-up); then "
                 "train(resume=True)", "a trained model, resumed from the checkpoint",
                 f"{resumed:.1f} s (resumed run)", f"{killed_after + resumed - base_time:+.1f} s",
                 f"{accuracy:.4f} ({(accuracy - base_accuracy) * 100:+.2f} points)"])
    spark.stop()

    fuzz = "run `python benchmarks/fuzz_frames.py` for the fuzzer's count"
    bench = os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks.md")
    if os.path.exists(bench):
        match = re.search(r"## Fuzzing the frame decoder\n\n(`[^`]+`)\n.*?\| inputs tried \| "
                          r"(\d+) \|.*?\| other exceptions \(bugs\) \| (\d+) \|",
                          open(bench, encoding="utf-8").read(), re.S)
        if match:
            fuzz = (f"{int(match.group(2)):,} mutated frames fed to the decoder, "
                    f"{match.group(3)} crashes or unexpected exceptions ({match.group(1)}).")
    text = (
        "# Reliability\n\nFaults injected into ADAG (2 workers, window 6, Adam, batch 32) on "
        f"{args.limit} Fashion-MNIST images, `local[2,4]`, test accuracy on 10,000 images.\n\n"
        f"`python {' '.join(sys.argv)}` ({time.strftime('%Y-%m-%d')}, {report.machine()})\n\n"
        + report.table(["fault", "how it was injected", "what the user sees", "time",
                        "time lost", "test accuracy"], rows)
        + "\n\n" + REFUSALS
        + "\n\nHostile input to the parameter server "
          "(tests/transport/test_parameter_server.py, tests/transport/test_networking.py, "
          "tests/training/test_reliability.py): garbage, truncated frames, lengths up to "
          "2^63, wrong or missing tokens, wrong shapes and dtypes, silent clients, a "
          "thousand connections at once: each closes that connection only, the center is "
          "unchanged and honest workers go on. " + LIMITS + "\n\n"
        + LARGE_MODELS + "\n\n"
        + f"Fuzzing: {fuzz}\n")
    # Sections other benchmarks wrote (## headings: punchcard_attacks.py's) stay.
    kept = open(DOC, encoding="utf-8").read() if os.path.exists(DOC) else ""
    kept = kept[kept.find("\n## "):] if "\n## " in kept else ""
    with open(DOC, "w", encoding="utf-8") as handle:
        handle.write(text + kept)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
