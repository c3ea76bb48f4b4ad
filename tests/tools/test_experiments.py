"""Sweeps (`distkeras.tools.experiments`) and plots (`distkeras.tools.plotting`) on a small subset."""

import csv
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from conftest import build_mlp

LIMIT = 1500
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def assert_png(path):
    assert os.path.isfile(path), f"{path} was not written"
    data = open(path, "rb").read()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert len(data) > 1024, f"{path} is only {len(data)} bytes"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert width > 200 and height > 200


@pytest.fixture(scope="module")
def swept(spark, tmp_path_factory):
    from distkeras.tools.experiments import sweep

    output_dir = str(tmp_path_factory.mktemp("sweep"))
    results = sweep(spark, trainers=("SingleTrainer", "ADAG"), workers=(1, 2), windows=(2, 8),
                    epochs=1, limit=LIMIT, output_dir=output_dir)
    return results, output_dir


def read_rows(output_dir):
    with open(os.path.join(output_dir, "results.csv"), newline="") as handle:
        reader = csv.DictReader(handle)
        return reader.fieldnames, list(reader)


def test_sweep_writes_one_row_per_run(swept):
    results, output_dir = swept
    columns, rows = read_rows(output_dir)
    assert columns == ["trainer", "workers", "window", "epochs", "wall_time_s",
                       "samples_per_s", "test_accuracy", "mean_staleness"]
    single = [row for row in rows if row["trainer"] == "SingleTrainer"]
    adag = [row for row in rows if row["trainer"] == "ADAG"]
    assert len(rows) == 5 and len(single) == 1 and len(adag) == 4
    assert (single[0]["workers"], single[0]["window"], single[0]["epochs"]) == ("1", "", "1")
    assert sorted((int(row["workers"]), int(row["window"])) for row in adag) == \
        [(1, 2), (1, 8), (2, 2), (2, 8)]
    # The returned dicts are the rows of the table, in the same order.
    assert [(r["trainer"], r["workers"], r["window"]) for r in results] == \
        [(row["trainer"], int(row["workers"]), int(row["window"]) if row["window"] else None)
         for row in rows]
    for result, row in zip(results, rows):
        assert float(row["test_accuracy"]) == pytest.approx(result["test_accuracy"], abs=1e-4)


def test_sweep_numbers_are_sane(swept):
    _, output_dir = swept
    _, rows = read_rows(output_dir)
    for row in rows:
        wall_time, rate = float(row["wall_time_s"]), float(row["samples_per_s"])
        assert 0.3 < float(row["test_accuracy"]) <= 1.0, row
        assert wall_time > 0 and rate > 0, row
        assert rate == pytest.approx(LIMIT / wall_time, rel=0.01), row
        if row["trainer"] == "SingleTrainer":
            assert row["mean_staleness"] == ""
        else:
            assert float(row["mean_staleness"]) >= 0, row
            if row["workers"] == "1":  # nobody else commits: never stale
                assert float(row["mean_staleness"]) == 0.0, row


def test_sweep_writes_plots(swept):
    _, output_dir = swept
    for name in ("by_workers.png", "by_window.png"):
        assert_png(os.path.join(output_dir, name))


def test_comparison_plot_has_a_line_per_trainer_and_window(swept):
    from distkeras.tools.plotting import plot_comparison

    results, _ = swept
    figure = plot_comparison(results, by="workers")
    wall_time_axes, accuracy_axes = figure.axes
    lines = {line.get_label(): line for line in wall_time_axes.get_lines()}
    assert set(lines) == {"ADAG, window 2", "ADAG, window 8", "SingleTrainer"}
    assert list(lines["ADAG, window 8"].get_xdata()) == [1, 2]
    assert accuracy_axes.get_ylabel() == "test accuracy"
    by_window = plot_comparison(results, by="window")
    labels = {line.get_label() for line in by_window.axes[1].get_lines()}
    assert labels == {"ADAG, 1 worker", "ADAG, 2 workers", "SingleTrainer"}


def test_plot_history_draws_every_worker_and_the_mean(spark, tmp_path):
    from distkeras.datasets import load_fashion_mnist
    from distkeras.tools.plotting import plot_history
    from distkeras.trainers import ADAG

    data = load_fashion_mnist(spark, "train", limit=LIMIT)
    trainer = ADAG(keras_model=build_mlp(64), worker_optimizer="adam",
                   loss="categorical_crossentropy", metrics=["accuracy"], num_workers=2,
                   batch_size=32, communication_window=4)
    trainer.train(data, validation_data=0.2)
    path = str(tmp_path / "history.png")
    figure = plot_history(trainer, path)
    assert len(figure.axes) == 2
    loss_axes, accuracy_axes = figure.axes
    assert loss_axes.get_ylabel() == "training loss"
    assert accuracy_axes.get_ylabel() == "training accuracy"
    lines = loss_axes.get_lines()
    assert [line.get_label() for line in lines] == ["worker 0", "worker 1", "mean of workers",
                                                    "validation"]
    validation = trainer.get_validation_history()
    assert list(lines[-1].get_ydata()) == [record["val_loss"] for record in validation]
    assert list(accuracy_axes.get_lines()[-1].get_ydata()) == \
        [record["val_accuracy"] for record in validation]
    lines = lines[:-1]
    assert lines[-1].get_linewidth() > 2 * lines[0].get_linewidth()
    history = trainer.get_history()
    span = max(r["timestamp"] for r in history) - min(r["timestamp"] for r in history)
    mean_line = lines[-1]
    assert len(mean_line.get_xdata()) == len(history)
    assert min(mean_line.get_xdata()) == 0.0
    assert max(mean_line.get_xdata()) == pytest.approx(span)
    assert_png(path)


def test_one_nan_loss_does_not_blank_the_rest_of_the_curve():
    from distkeras.tools.plotting import plot_history, rolling_mean

    values = [1.0, 2.0, float("nan"), 4.0, 6.0, 8.0]
    np.testing.assert_allclose(rolling_mean(values, 2), [1.0, 1.5, 2.0, 4.0, 5.0, 7.0])
    assert np.isnan(rolling_mean([1.0, float("nan"), float("nan")], 2)[-1])
    records = [{"worker_id": 0, "iteration": step, "timestamp": float(step),
                "loss": float("nan") if step == 5 else 1.0} for step in range(100)]
    mean_line = plot_history(records, metrics=("loss",), smoothing=10).axes[0].get_lines()[-1]
    assert np.isfinite(mean_line.get_ydata()).all()


def test_plot_history_refuses_an_untrained_trainer():
    from distkeras.tools.plotting import plot_history

    with pytest.raises(ValueError, match="no history"):
        plot_history([])
    with pytest.raises(ValueError, match="have no 'timestamp'.*pass a trainer's history"):
        plot_history([{"worker_id": 0, "loss": 0.5}])
    with pytest.raises(ValueError, match="neither any of metrics"):
        plot_history([{"worker_id": 0, "iteration": 0, "timestamp": 1.0, "loss": 0.5}],
                     metrics=("auc",))


def test_plan_runs_each_trainer_only_over_its_own_settings():
    from distkeras.tools.experiments import plan, resolve_trainers

    classes = resolve_trainers(["SingleTrainer", "AveragingTrainer", "DOWNPOUR"])
    runs = [(name, workers, window) for name, _, workers, window in plan(classes, [1, 3], [4, 9])]
    assert runs == [("SingleTrainer", 1, None),
                    ("AveragingTrainer", 1, None), ("AveragingTrainer", 3, None),
                    ("DOWNPOUR", 1, 4), ("DOWNPOUR", 1, 9), ("DOWNPOUR", 3, 4),
                    ("DOWNPOUR", 3, 9)]


@pytest.mark.parametrize("change, message", [
    ({"trainers": ("Nope",)}, "Unknown trainer 'Nope'"),
    ({"workers": (2, 0)}, "`workers` must hold integers >= 1"),
    ({"windows": ()}, "`windows` must hold at least one value"),
    ({"epochs": 0}, "`epochs` must be an integer >= 1. Received: epochs=0"),
    ({"limit": -5}, "`limit` must be None or an integer >= 1"),
    ({"dataset": "mnist"}, "Unknown dataset 'mnist'. Available datasets: fashion_mnist"),
])
def test_sweep_checks_its_arguments_before_any_work(change, message, tmp_path):
    from distkeras.tools.experiments import sweep

    output_dir = tmp_path / "never"
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        sweep(None, output_dir=str(output_dir), **change)  # no Spark needed to refuse
    assert not output_dir.exists()


def test_sweep_refuses_an_output_dir_that_is_a_file(tmp_path):
    from distkeras.tools.experiments import sweep

    (tmp_path / "results").write_text("kept")
    with pytest.raises(ValueError, match=rf"`output_dir` {tmp_path / 'results'} is a file: "
                                         "give a folder"):
        sweep(None, output_dir=str(tmp_path / "results"))  # no Spark needed to refuse
    assert (tmp_path / "results").read_text() == "kept"


def run_command(*arguments):
    # JAVA_HOME points nowhere: a command that starts Spark fails with a Java error instead.
    env = dict(os.environ, JAVA_HOME="/nonexistent-java", PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-m", "distkeras.tools.experiments", *arguments],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=env)


@pytest.mark.parametrize("arguments, message", [
    (["--trainer", "ADAG", "Nope", "--workers", "1"], "Unknown trainer 'Nope'. Available"),
    (["--workers", "0"], "--workers: expected an integer >= 1, got '0'"),
    (["--window", "two"], "--window: expected an integer >= 1, got 'two'"),
    # "[Errno 17] File exists: 'README.md'", once Spark had started.
    (["--output-dir", "README.md"], "--output-dir README.md is a file: give a folder"),
])
def test_command_rejects_bad_arguments_before_spark(arguments, message):
    done = run_command("sweep", *arguments)
    assert done.returncode == 2
    assert done.stdout == ""
    error = done.stderr.strip()
    assert len(error.splitlines()) == 1 and message in error, done.stderr


def test_command_runs_a_sweep(spark, tmp_path, capsys):
    from distkeras.tools import experiments

    output_dir = str(tmp_path / "out")
    status = experiments.main(["sweep", "--trainer", "SingleTrainer", "ADAG", "--workers", "2",
                               "--window", "4", "--limit", "300", "--test-limit", "1000",
                               "--master", "local[2]", "--output-dir", output_dir])
    assert status == 0
    out = capsys.readouterr().out
    assert f"results: {os.path.join(output_dir, 'results.csv')}" in out
    table = out.splitlines()[2:]
    assert table[0].split()[:3] == ["trainer", "workers", "window"]
    assert [line.split()[:3] for line in table[1:]] == [["SingleTrainer", "1", "-"],
                                                        ["ADAG", "2", "4"]]
    assert len(read_rows(output_dir)[1]) == 2
    assert spark.range(3).count() == 3  # the shared session was not stopped


def test_a_failing_run_keeps_the_finished_runs_rows_and_plots(spark, tmp_path):
    from distkeras.tools.experiments import sweep
    from distkeras.trainers import SingleTrainer

    class BrokenTrainer(SingleTrainer):
        def allocate_worker(self):
            raise RuntimeError("broken on purpose")

    output_dir = str(tmp_path / "out")
    with pytest.raises(Exception, match="broken on purpose"):
        sweep(spark, trainers=(SingleTrainer, BrokenTrainer), workers=(1,), epochs=1,
              limit=300, test_limit=500, output_dir=output_dir)
    _, rows = read_rows(output_dir)
    assert [row["trainer"] for row in rows] == ["SingleTrainer"]
    assert_png(os.path.join(output_dir, "by_workers.png"))
    assert_png(os.path.join(output_dir, "by_window.png"))


def _step_records(keys, workers=2, steps=30, **extra):
    return [{"worker_id": worker, "iteration": step, "timestamp": step + worker / 10,
             "batch_size": 32, **{key: 1.0 / (step + 1) for key in keys}, **extra}
            for worker in range(workers) for step in range(steps)]


def test_plot_history_shows_each_output_and_metric_that_the_run_logged(spark):
    import keras

    from distkeras.tools.plotting import plot_history
    from distkeras.trainers import ADAG

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 4)).astype("float32")
    rows = [(row.tolist(), int(row[0] > 0), int(row[1] > 0)) for row in x]
    data = spark.createDataFrame(rows, "features array<float>, a int, b int")
    inputs = keras.Input((4,))
    model = keras.Model(inputs, [keras.layers.Dense(2, activation="softmax", name=name)(inputs)
                                 for name in ("a", "b")])
    model.compile("adam", ["sparse_categorical_crossentropy"] * 2,
                  metrics=[["accuracy"], ["accuracy"]])
    trainer = ADAG(keras_model=model, num_workers=2, batch_size=32, communication_window=4,
                   label_col=["a", "b"])
    trainer.train(data, validation_data=0.2, verbose=0)
    # As Keras's history.history names and orders them, the total loss first.
    panels = [axis.get_ylabel() for axis in plot_history(trainer).axes]
    assert panels == ["training loss", "a_accuracy", "a_loss", "b_accuracy", "b_loss"]
    figure = plot_history(trainer, metrics=("loss", "accuracy"))
    assert [axis.get_ylabel() for axis in figure.axes] == ["training loss", "a_accuracy",
                                                           "b_accuracy"]
    validation = trainer.get_validation_history()
    assert list(figure.axes[2].get_lines()[-1].get_ydata()) == \
        [record["val_b_accuracy"] for record in validation]


def test_plot_history_of_a_regression_shows_its_metrics():
    from distkeras.tools.plotting import plot_history

    figure = plot_history(_step_records(["loss", "mae"], workers=1))
    assert [axis.get_ylabel() for axis in figure.axes] == ["training loss", "mae"]
    assert figure.get_suptitle().startswith("training: 1 worker,")


def test_plot_history_labels_each_ensemble_members_validation():
    from distkeras.tools.plotting import plot_history

    class Ensemble:  # what plot_history reads of an EnsembleTrainer
        num_ensembles = 2

        def get_history(self):
            return _step_records(["loss", "accuracy"])

        def get_validation_history(self):
            return [{"epoch": 1, "samples": 960, "timestamp": 30.0 + member, "member": member,
                     "val_loss": 0.5 + member, "val_accuracy": 0.8 - member / 10}
                    for member in range(2)]

    figure = plot_history(Ensemble())
    lines = figure.axes[0].get_lines()
    assert [line.get_label() for line in lines] == [
        "member 0", "member 1", "mean of members", "validation, member 0",
        "validation, member 1"]
    assert list(lines[-1].get_ydata()) == [1.5]
    assert lines[-1].get_color() == lines[1].get_color()
    assert "2 members" in figure.get_suptitle()


def test_plot_history_leaves_out_superseded_steps():
    from distkeras.tools.plotting import plot_history

    retried = _step_records(["loss"], workers=1, attempt=1)
    failed = [{**record, "attempt": 0, "superseded": True, "loss": 100.0}
              for record in _step_records(["loss"], workers=1, steps=10)]
    mean_line = plot_history(failed + retried).axes[0].get_lines()[-1]
    assert len(mean_line.get_xdata()) == len(retried)
    assert max(mean_line.get_ydata()) <= 1.0


def test_a_results_file_that_fails_to_write_leaves_the_last_one_and_nothing_else(tmp_path):
    """A write that failed midway (here a value no number; a full disk alike) left its
    temporary file next to results.csv."""
    from distkeras.tools import experiments

    path = str(tmp_path / "results.csv")
    column = sorted(experiments._DECIMALS)[0]
    experiments.write_csv([{"trainer": "ADAG", column: 1.5}], path)
    before = open(path).read()
    with pytest.raises(ValueError):
        experiments.write_csv([{"trainer": "ADAG", column: 2.5},
                               {"trainer": "DOWNPOUR", column: "not a number"}], path)
    assert open(path).read() == before
    assert os.listdir(tmp_path) == ["results.csv"]
