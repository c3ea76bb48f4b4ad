"""Where a train() call's wall time goes: before the first step, the steps, after them.

Trains the 784-500-500-10 MLP on the full Fashion-MNIST training set (packed features,
2 even partitions, executors warmed) with SingleTrainer, ADAG (2 workers, window 6, the
main job's setting), AveragingTrainer (2 workers, 3 epochs: all in one Spark job, and
the path it takes without a task slot for every worker, one Spark job per epoch) and
SingleTrainer validating on the 10,000 test images after each of 3 epochs (all in one
Spark task, and the path it takes without a slot to spare for a callback, a task per
epoch), each ``--repeat`` times in turns. From the per-step history timestamps: the time
before the first step (job start, model rebuilt and compiled on the executors), the span
of the steps, the gaps between epochs, and the time after the last step.

    python benchmarks/phases.py [--repeat 2] [--limit N]
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))


def timed_train(trainer, frame, **options):
    """Runs ``trainer.train(frame, **options)``; returns its phases in seconds."""
    started = time.time()
    trainer.train(frame, verbose=0, **options)
    ended = started + trainer.get_training_time()
    history = trainer.get_history()
    first = min(record["timestamp"] for record in history)
    last = max(record["timestamp"] for record in history)
    epochs = sorted({record.get("epoch", 0) for record in history})
    spans = [(min(r["timestamp"] for r in history if r.get("epoch", 0) == epoch),
              max(r["timestamp"] for r in history if r.get("epoch", 0) == epoch))
             for epoch in epochs]
    gaps = sum(start - previous_end for (_, previous_end), (start, _) in zip(spans, spans[1:]))
    samples = sum(record["batch_size"] for record in history)
    steps = last - first - gaps
    # A window of steps is recorded at its end, so one window per epoch (a small --limit)
    # has no span to divide by: its rate is NaN, printed as such.
    return {"wall": ended - started, "before": first - started, "steps": steps,
            "gaps": gaps, "after": ended - last,
            "rate": samples / steps if steps > 0 else float("nan")}


def averaging_epoch_by_epoch():
    """AveragingTrainer held to one Spark job per epoch (its path when Spark has fewer
    task slots than workers)."""
    from distkeras.trainers import AveragingTrainer
    from distkeras.training.averaging import AveragingPlan

    class JobPerEpochPlan(AveragingPlan):
        def slots_for_one_job(self, frame, num_tasks):
            return False

    class AveragingEpochByEpoch(AveragingTrainer):
        plan = JobPerEpochPlan

    return AveragingEpochByEpoch


def single_epoch_by_epoch():
    """SingleTrainer held to one Spark task per epoch when validating (its path when
    Spark has no task slot to spare for a callback of the user's own)."""
    from distkeras.trainers import SingleTrainer

    class SingleEpochByEpoch(SingleTrainer):
        def make_plan(self, run):
            return self.plan(run, self.allocate_worker)  # no worker that runs every epoch

    return SingleEpochByEpoch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None,
                        help="train on the first N images only (default: all 60,000)")
    args = parser.parse_args()
    import report

    spark, frame, test = report.fashion_mnist_setup("local[2]", limit=args.limit, packed=True)
    from fashion_mnist import build_mlp

    from distkeras.trainers import ADAG, AveragingTrainer, SingleTrainer

    common = dict(worker_optimizer="adam", loss="categorical_crossentropy",
                  metrics=["accuracy"])
    runs = {
        "SingleTrainer, 1 epoch": lambda: SingleTrainer(build_mlp(), **common),
        "ADAG, 2 workers, window 6, 1 epoch": lambda: ADAG(
            build_mlp(), num_workers=2, communication_window=6, **common),
        "AveragingTrainer, 2 workers, 3 epochs (one job)": lambda: AveragingTrainer(
            build_mlp(), num_workers=2, num_epoch=3, **common),
        "AveragingTrainer, 2 workers, 3 epochs (a job per epoch)":
            lambda: averaging_epoch_by_epoch()(build_mlp(), num_workers=2, num_epoch=3,
                                               **common),
        "SingleTrainer, 3 epochs, validating (one task)":
            lambda: SingleTrainer(build_mlp(), num_epoch=3, **common),
        "SingleTrainer, 3 epochs, validating (a task per epoch)":
            lambda: single_epoch_by_epoch()(build_mlp(), num_epoch=3, **common),
    }
    import numpy as np

    validation = (test[0], np.eye(10, dtype="float32")[test[1]])
    results = {name: [] for name in runs}
    for _ in range(args.repeat):
        for name, make in runs.items():
            options = {"validation_data": validation} if "validating" in name else {}
            results[name].append(timed_train(make(), frame, **options))
    rows = []
    for name, phases in results.items():
        def median(key, phases=phases):
            return statistics.median(phase[key] for phase in phases)
        rows.append([name, f"{median('wall'):.2f}", f"{median('before'):.2f}",
                     f"{median('steps'):.2f}", f"{median('gaps'):.2f}",
                     f"{median('after'):.2f}", f"{median('rate'):.0f}"])
    body = (f"{frame.count()} samples per epoch, batch 32, Adam, `local[2]`, "
            f"packed features in 2 even cached partitions, executors warmed; median of "
            f"{args.repeat} runs taken in turns. From the history's step timestamps: "
            "'before' is train() start to the first step, 'after' the last step to "
            "train()'s end (the driver's model rebuilt from the weights included), 'gaps' "
            "the time between epochs (a new Spark job or task each, or in one "
            "job the wait for the driver: the average, the validation), the last column "
            "the samples per second while steps run.\n\n"
            + report.table(["run", "train() s", "before s", "steps s", "gaps s", "after s",
                            "samples/s in steps"], rows))
    report.write_section("Phases of a train() call", body)
    spark.stop()


if __name__ == "__main__":
    main()
