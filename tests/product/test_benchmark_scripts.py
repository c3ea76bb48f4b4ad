"""The benchmark scripts' own logic, without running a benchmark (they are run by hand)."""

import argparse
import importlib.util
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(REPO, "benchmarks")


def load_script(name):
    """The module of ``benchmarks/<name>.py``, imported as the scripts import each other."""
    sys.path.insert(0, BENCHMARKS)
    try:
        spec = importlib.util.spec_from_file_location(
            f"benchmark_{name}", os.path.join(BENCHMARKS, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(BENCHMARKS)


class RecordedTrainer:
    """A trainer's history, as `steps_rate` reads it: per worker, its step records."""

    def __init__(self, timestamps):
        self.records = {worker: [{"worker_id": worker, "timestamp": stamp, "batch_size": 32}
                                 for stamp in stamps]
                        for worker, stamps in timestamps.items()}

    def get_history(self):
        return [record for records in self.records.values() for record in records]

    def get_executor_history(self, worker):
        return self.records[worker]


def test_training_steps_rate_is_none_for_workers_that_trained_one_window():
    training = load_script("training")
    # A window's steps share its end's timestamp: a worker of one window has no span.
    assert training.steps_rate(RecordedTrainer({0: [5.0] * 10, 1: [5.5] * 10})) is None
    # Two windows of 16 steps: the span from the first's end to the second's holds the
    # second window's 512 samples only (all 1024 made SingleTrainer twice as fast).
    assert training.steps_rate(RecordedTrainer({0: [1.0] * 16 + [3.0] * 16})) == 256
    assert training.steps_rate(RecordedTrainer({0: [1.0, 3.0], 1: [1.0, 2.0]})) == 32
    assert training._rate(None) == "-" and training._ratio(None, 2.0) == "-"
    assert training._ratio(3.0, 2.0) == "1.50"


def test_reliability_rerun_keeps_what_docs_reliability_says_beyond_its_table():
    reliability = load_script("reliability")
    with open(os.path.join(REPO, "docs", "reliability.md"), encoding="utf-8") as handle:
        assert reliability.REFUSALS in handle.read()


def test_reliability_refuses_a_limit_that_its_faults_would_not_reach():
    run = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "reliability.py"),
                          "--limit", "2000"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "--limit must be at least 8064" in run.stderr


def test_report_machine_line_names_the_backends_a_script_measured_in_its_children():
    report = load_script("report")
    # benchmarks/backends.py trains nothing itself: its line named its own process's
    # backend (~/.keras/keras.json's), not the backends of its table.
    assert "Keras " in report.machine() and "(jax, torch, tensorflow)" in report.machine(
        backend="jax, torch, tensorflow")


class OneWindowTrainer:
    """A train() of one window per epoch: every step of an epoch has one timestamp."""

    def train(self, frame, **options):
        self.history = [{"timestamp": 10.0 + epoch, "epoch": epoch, "batch_size": 32}
                        for epoch in range(3) for _ in range(5)]

    def get_training_time(self):
        return 0.0

    def get_history(self):
        return self.history


def test_phases_and_epochs_give_no_rate_for_an_epoch_of_one_window():
    import math

    phases = load_script("phases")
    trainer = OneWindowTrainer()
    trainer.train(None)
    assert math.isnan(phases.timed_train(OneWindowTrainer(), None)["rate"])
    epochs = load_script("epochs")
    assert all(math.isnan(rate) for rate in epochs.epoch_rates(trainer.get_history()))


def test_parquet_feed_compares_each_path_with_sparks_and_the_feed_net_of_an_empty_job():
    feed = load_script("parquet_feed")
    clock = feed.Clock()
    clock.runs = {"feed spark": [(3.0, 2.0)], "feed direct": [(2.0, 1.5)],
                  "feed none": [(1.0, 1.0)], "predict mlp spark": [(2.0, 2.0)],
                  "predict mlp direct": [(1.0, 1.0)], "predict mlp driver": [(0.5, 0.5)]}
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")
            for line in feed.table(clock, lambda name: 100).splitlines()[2:]}
    # The feed: 100 rows in 1.0 and 0.5 CPU seconds once the empty job's 1.0 is taken off.
    assert rows["feed spark"][3] == "100" and rows["feed direct"][3] == "200"
    assert rows["feed direct"][4] == "2.00 |" and rows["feed none"][3:] == ["-", "- |"]
    assert rows["predict mlp direct"][4] == "2.00 |"  # nothing taken off outside the feed
    assert rows["predict mlp driver"][4] == "4.00 |" and rows["predict mlp spark"][4] == "- |"


def test_zoo_runs_name_a_window_and_a_compression():
    zoo = load_script("zoo")
    for name in ("adag", "adag/4", "adag+bfloat16", "adag/4+topk", "downpour+topk:0.05"):
        assert zoo.run_name(name) == name
    for name in ("adag+int8", "adag/x", "nope+topk"):
        with pytest.raises(argparse.ArgumentTypeError, match="adag\\+topk"):
            zoo.run_name(name)


def test_zoo_compression_table_compares_each_compressed_run_with_its_float32_seeds():
    zoo = load_script("zoo")
    records = [{"model": "mlp", "run": run, "seed": seed, "accuracy": accuracy}
               for run, seed, accuracy in (
                   ("adag", 1, 0.80), ("adag", 2, 0.82), ("adag+bfloat16", 1, 0.79),
                   ("adag+bfloat16", 2, 0.81), ("adag+topk", 1, 0.70), ("fit", 1, 0.9))]
    records.append({"model": "cnn", "run": "downpour+topk", "seed": 1, "accuracy": 0.5,
                    "placement": "driver"})
    lines = zoo.compression_table(records).splitlines()[2:]
    # Models in the zoo's order, float32 first; `fit` has no compressed run: left out; a
    # run with no float32 counterpart at its placement has no difference to show.
    assert lines == [
        "| mlp | adag | none | 2 | 0.8100 | 0.8000-0.8200 | - |",
        "| mlp | adag | bfloat16 | 2 | 0.8000 | 0.7900-0.8100 | -1.00 |",
        "| mlp | adag | topk | 1 | 0.7000 | 0.7000-0.7000 | -11.00 |",
        "| cnn | downpour (driver) | topk | 1 | 0.5000 | 0.5000-0.5000 | - |"]
