"""The `distkeras` command line, end to end on a small Fashion-MNIST Parquet set."""

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import accuracy, build_mlp


@pytest.fixture(scope="module")
def parquet_data(fashion_train, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("data") / "fashion.parquet")
    fashion_train.limit(1500).write.parquet(path)
    return path


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    from distkeras import utils

    model = build_mlp()
    model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"])
    path = str(tmp_path_factory.mktemp("model") / "mlp.keras")
    utils.save_model(model, path)
    return path


def test_train_in_process(spark, parquet_data, model_file, tmp_path, fashion_test, capsys):
    from distkeras import cli, utils

    output, history = str(tmp_path / "out.keras"), str(tmp_path / "history.json")
    status = cli.main(["train", "--data", parquet_data, "--model", model_file,
                       "--trainer", "AEASGD", "--workers", "2", "--window", "8",
                       "--rho", "2.0", "--output", output, "--history", history])
    assert status == 0
    assert "samples/s" in capsys.readouterr().out
    assert accuracy(utils.load_model(output), fashion_test) > 0.4
    records = json.load(open(history))
    assert sum(record["batch_size"] for record in records) == 1500


def test_an_interrupted_training_leaves_a_failed_status(spark, parquet_data, model_file,
                                                         tmp_path, monkeypatch):
    """Ctrl-C (or the SIGINT a job server sends) left the status at "training" for good."""
    from distkeras import cli
    from distkeras.trainers import SingleTrainer

    status_path = str(tmp_path / "status.json")
    seen = []

    def interrupted(self, *args, **kwargs):
        seen.append(json.load(open(status_path))["state"])
        raise KeyboardInterrupt

    monkeypatch.setattr(SingleTrainer, "train", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["train", "--data", parquet_data, "--model", model_file, "--trainer",
                  "SingleTrainer", "--output", str(tmp_path / "out.keras"),
                  "--status", status_path])
    assert seen == ["training"]
    status = json.load(open(status_path))
    assert status["state"] == "failed" and "KeyboardInterrupt" in status["error"]


def test_train_options_validate_and_weigh(spark, parquet_data, model_file, tmp_path):
    from distkeras import cli

    output, validation = str(tmp_path / "out.keras"), str(tmp_path / "validation.json")
    status = cli.main(["train", "--data", parquet_data, "--model", model_file,
                       "--trainer", "ADAG", "--workers", "2", "--window", "4",
                       "--epochs", "2", "--output", output, "--validation", parquet_data,
                       "--class-weight", '{"0": 2.0}', "--validation-history", validation])
    assert status == 0
    records = json.load(open(validation))
    assert records[-1]["epoch"] == 2 and records[-1]["samples"] == 3000
    assert records[-1]["val_accuracy"] > 0.4


@pytest.mark.parametrize("change, message", [
    ({"--validation": "1.5"}, "'validation' must be a fraction"),
    ({"--class-weight": "{1: 2}"}, "--class-weight is not JSON"),
    ({"--data": "/nonexistent/data.parquet"}, "cannot read Parquet data"),
    ({"--model": "/nonexistent/model.keras"}, "model file not found"),
    ({"--trainer": "Nope"}, "Unknown trainer 'Nope'. Available trainers:"),
    ({"--features": "pixels"}, "Column 'pixels' is not in the DataFrame"),
    # Refused before training: its several models would be trained, then lost.
    ({"--trainer": "EnsembleTrainer"}, "EnsembleTrainer returns several models and --output"),
])
def test_bad_arguments_give_one_line(spark, parquet_data, model_file, tmp_path, capsys,
                                     change, message):
    from distkeras import cli

    arguments = {"--data": parquet_data, "--model": model_file,
                 "--output": str(tmp_path / "out.keras")}
    arguments.update(change)
    argv = ["train"] + [item for pair in arguments.items() for item in pair]
    started = time.monotonic()
    assert cli.main(argv) == 1
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and message in error
    assert not os.path.exists(tmp_path / "out.keras")
    if change.get("--trainer") == "EnsembleTrainer":
        assert "samples" not in error and time.monotonic() - started < 20  # no training


@pytest.mark.parametrize("flag, path, message", [
    ("--model", "{folder}", "cannot load the model {folder}: {folder} is a folder"),
    ("--output", "{folder}", "--output {folder} is a folder"),  # before training, not after
    ("--history", "{folder}", "--history {folder} is a folder"),
    # Under a file: refused before training, not once the trained model could not be saved.
    ("--output", "{folder}/notes/x/out.keras",
     "--output: cannot write {folder}/notes/x/out.keras: {folder}/notes is a file"),
    ("--validation-history", "{folder}/notes/v.json",
     "--validation-history: cannot write {folder}/notes/v.json: {folder}/notes is a file"),
])
def test_a_folder_where_a_file_goes_is_named(spark, parquet_data, model_file, tmp_path,
                                             capsys, flag, path, message):
    from distkeras import cli

    folder = tmp_path / "folder"
    (folder / "inside").mkdir(parents=True)
    (folder / "notes").write_text("kept")
    arguments = {"--data": parquet_data, "--model": model_file,
                 "--output": str(tmp_path / "out.keras"), flag: path.format(folder=folder)}
    argv = ["train"] + [item for pair in arguments.items() for item in pair]
    started = time.monotonic()
    assert cli.main(argv) == 1
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and message.format(folder=folder) in error, error
    assert time.monotonic() - started < 30  # refused before any training
    assert sorted(os.listdir(folder)) == ["inside", "notes"]
    assert (folder / "notes").read_text() == "kept" and not os.listdir(folder / "inside")


@pytest.mark.parametrize("content, message", [
    # Keras said "File not found: filepath=/tmp/distkeras-.../model.keras" of its own copy.
    (b"", "not a .keras archive (not a zip file"),
    ("half", "not a .keras archive (not a zip file"),
    # A zip of something else: Keras's KeyError ended the command with a traceback.
    ("zip", "not a .keras archive (it has no config.json"),
])
def test_a_model_file_that_is_no_keras_archive_is_named(spark, parquet_data, model_file,
                                                        tmp_path, capsys, content, message):
    import zipfile

    from distkeras import cli

    path = tmp_path / "model.keras"
    if content == "half":  # an interrupted copy
        whole = open(model_file, "rb").read()
        path.write_bytes(whole[:len(whole) // 2])
    elif content == "zip":
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("notes.txt", "not a model")
    else:
        path.write_bytes(content)
    for argv in (["train", "--data", parquet_data, "--output", str(tmp_path / "out.keras")],
                 ["predict", "--data", parquet_data, "--output", str(tmp_path / "out")]):
        assert cli.main(argv + ["--model", str(path)]) == 1
        error = capsys.readouterr().err.strip()
        assert f"cannot load the model {path}: {message}" in error, error
        assert len(error.splitlines()) == 1 and "distkeras-" not in error, error
        assert os.listdir(tmp_path) == ["model.keras"]


def test_data_that_is_not_parquet_is_named(spark, model_file, tmp_path, capsys):
    from distkeras import cli

    data = tmp_path / "data.csv"
    data.write_text("features,label\n1,2\n")
    argv = ["train", "--data", str(data), "--model", model_file,
            "--output", str(tmp_path / "out.keras")]
    assert cli.main(argv) == 1
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert f"{data} is not a Parquet file or a folder of Parquet files" in error


def test_help_lists_trainer_options_with_defaults(capsys):
    from distkeras import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--trainer", "EAMSGD", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--momentum MOMENTUM", "(default: None)", "--rho RHO", "(default: 5.0)",
                   "--batch-size", "(default: 32)"):
        assert option in out


@pytest.mark.parametrize("command", ["secret", "punchcard"])
def test_job_server_commands_name_themselves_as_run(command, capsys):
    """`distkeras secret --help` printed "usage: generate_secret", the script's name."""
    from distkeras import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: distkeras {command} [-h]")


@pytest.mark.parametrize("command", ["train", "predict"])
def test_help_states_each_default_once(command, capsys):
    from distkeras import cli

    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: spark-submit's, else local[*])" in out
    assert "local[*]) (default: None)" not in out
    if command == "train":
        assert "(default: the model's compiled one, else adam)" in out
        assert "else adam) (default: None)" not in out
        assert "required otherwise) (default: None)" not in out
        assert "(default 2; not for SingleTrainer)" in out
        assert "SingleTrainer) (default: None)" not in out
        assert "(default: 32)" in out


def test_installed_command_trains_in_its_own_spark(parquet_data, model_file, tmp_path):
    command = [os.path.join(os.path.dirname(sys.executable), "distkeras"), "train",
               "--data", parquet_data, "--model", model_file, "--trainer", "SingleTrainer",
               "--output", str(tmp_path / "single.keras"), "--master", "local[1]"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "trained SingleTrainer" in result.stdout
    assert os.path.getsize(tmp_path / "single.keras") > 0


def test_predict_writes_parquet(spark, parquet_data, model_file, tmp_path, capsys):
    from distkeras import cli

    output = str(tmp_path / "predictions.parquet")
    argv = ["predict", "--data", parquet_data, "--model", model_file, "--output", output]
    assert cli.main(argv) == 0
    predictions = spark.read.parquet(output)
    assert predictions.count() == 1500
    first = predictions.select("prediction").first()["prediction"]
    assert len(first) == 10 and abs(sum(first) - 1.0) < 1e-4
    assert cli.main(argv) == 1  # the output exists: refused without --overwrite
    assert "already exists: pass --overwrite" in capsys.readouterr().err.lower()
    assert cli.main(argv + ["--overwrite"]) == 0


def test_metrics_default_to_the_compiled_models(spark):
    from distkeras import cli
    from distkeras.cli import train_args
    from distkeras.trainers import ADAG

    model = build_mlp(16)
    model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["mae"])
    parser = train_args.train_parser(ADAG)
    args = parser.parse_args(["--data", "d", "--model", "m", "--output", "o"])
    trainer = cli.build_trainer(ADAG, model, args)
    assert trainer.metrics is None  # stored as given: the model's are resolved per run
    assert trainer.settings().metrics == ["mae"]  # was ["accuracy"], replacing the model's
    given = cli.build_trainer(ADAG, model, parser.parse_args(
        ["--data", "d", "--model", "m", "--output", "o", "--metrics", "accuracy"]))
    assert given.metrics == ["accuracy"]


def test_an_empty_label_trains_without_targets():
    # label_col=None (fit(x), a model whose loss is its own) had no spelling on the command
    # line: --label "" gave label_col=[], refused as no column name.
    import keras

    from distkeras import cli
    from distkeras.cli import train_args
    from distkeras.trainers import ADAG

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.ActivityRegularization(l2=0.1)(
        keras.layers.Dense(4)(inputs)))
    model.compile("adam", loss=None)
    args = train_args.train_parser(ADAG).parse_args(
        ["--data", "d", "--model", "m", "--output", "o", "--label", ""])
    trainer = cli.build_trainer(ADAG, model, args)
    trainer.validate_arguments()
    assert trainer.label_col is None


def test_boolean_trainer_options_are_switches(spark):
    from distkeras import cli
    from distkeras.cli import train_args
    from distkeras.trainers import ADAG

    parser = train_args.train_parser(ADAG)
    required = ["--data", "d", "--model", "m", "--output", "o",
                "--loss", "categorical_crossentropy"]

    def overlap(*flags):
        args = parser.parse_args(required + list(flags))
        return cli.build_trainer(ADAG, build_mlp(16), args).overlap_communication

    assert overlap() is False
    assert overlap("--overlap-communication") is True  # took a value before: "true"
    assert overlap("--overlap-communication", "--no-overlap-communication") is False
    with pytest.raises(SystemExit):
        parser.parse_args(required + ["--overlap-communication", "yes"])


def test_predict_on_rows_of_the_wrong_size_names_them_and_leaves_nothing(
        spark, parquet_data, model_file, tmp_path, capsys):
    from distkeras import cli

    output = tmp_path / "predictions.parquet"
    # `label` holds 10 values a row; the model reads 784: found on the driver, first row.
    argv = ["predict", "--data", parquet_data, "--model", model_file, "--output", str(output),
            "--features", "label"]
    assert cli.main(argv) == 1
    error = capsys.readouterr().err.strip()
    assert error == ("distkeras predict: error: Column 'label' holds 10 values per row but "
                     "the model's input expects shape (784,) (784 values). Reshape the data "
                     "or the model."), error
    assert not output.exists()  # so the corrected command needs no --overwrite


def test_predict_overwrite_replaces_the_output_only_once_the_new_one_is_written(
        spark, parquet_data, model_file, tmp_path, capsys):
    import os

    from distkeras import cli

    from pyspark.sql import functions as F

    output = str(tmp_path / "predictions.parquet")
    argv = ["predict", "--data", parquet_data, "--model", model_file, "--output", output]
    assert cli.main(argv) == 0
    before = sorted(os.listdir(output))
    # A job that fails on the executors: the first row fits the model (the driver's check
    # passes), a later one holds 10 values. The old predictions stay, and no temporary
    # folder is left beside them.
    rows = spark.read.parquet(parquet_data).select("features", "label").limit(20)
    bad = rows.limit(1).select(F.slice("features", 1, 10).alias("features"), "label")
    bad_data = str(tmp_path / "bad.parquet")
    rows.union(bad).coalesce(1).write.parquet(bad_data)
    assert cli.main(["predict", "--data", bad_data, "--model", model_file, "--output", output,
                     "--overwrite"]) == 1
    error = capsys.readouterr().err
    assert "Column 'features' holds arrays" in error
    assert "the model expects 784 per row" in error and len(error.strip().splitlines()) == 1
    assert sorted(os.listdir(output)) == before
    assert not [name for name in os.listdir(tmp_path) if ".tmp-" in name]
    # The output may be the data read: predicted again, into itself.
    assert cli.main(["predict", "--data", output, "--model", model_file, "--output", output,
                     "--prediction", "again", "--overwrite"]) == 0
    again = spark.read.parquet(output)
    assert again.count() == 1500 and {"prediction", "again"} <= set(again.columns)


def test_predict_takes_the_columns_of_a_multi_input_multi_output_model(spark, tmp_path):
    """`--features a,b` as for train (was refused: "column 'a,b' is not in ..."), and
    `--prediction` names one column per output."""
    import keras
    import numpy as np

    from distkeras import cli, utils

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(40, 4)), rng.normal(size=(40, 3))
    data = str(tmp_path / "multi.parquet")
    spark.createDataFrame([(x.tolist(), y.tolist()) for x, y in zip(a, b)],
                          "a array<float>, b array<float>").write.parquet(data)
    in_a, in_b = keras.Input((4,), name="a"), keras.Input((3,), name="b")
    hidden = keras.layers.Concatenate()([in_a, in_b])
    model = keras.Model([in_a, in_b], [keras.layers.Dense(2, name="cls")(hidden),
                                       keras.layers.Dense(1, name="reg")(hidden)])
    model_file = str(tmp_path / "multi.keras")
    utils.save_model(model, model_file)
    output = str(tmp_path / "predictions.parquet")
    argv = ["predict", "--data", data, "--model", model_file, "--output", output,
            "--features", "a, b", "--prediction", "p_cls,p_reg"]
    assert cli.main(argv) == 0
    rows = spark.read.parquet(output).orderBy("a").collect()
    expected = [np.asarray(out) for out in model.predict(
        [np.array([row["a"] for row in rows]), np.array([row["b"] for row in rows])],
        verbose=0)]
    np.testing.assert_allclose([row["p_cls"] for row in rows], expected[0], atol=1e-5)
    np.testing.assert_allclose([row["p_reg"] for row in rows], expected[1], atol=1e-5)
    prefixed = str(tmp_path / "prefixed.parquet")
    assert cli.main(argv[:5] + ["--output", prefixed, "--features", "a,b"]) == 0
    assert {"prediction_cls", "prediction_reg"} <= set(spark.read.parquet(prefixed).columns)


def test_predict_on_parquet_holding_spark_ml_vectors(spark, tmp_path):
    """VectorAssembler's output saved to Parquet: the write failed with Spark's
    "[UNSUPPORTED_DATATYPE] Unsupported data type UDT(...)" (its columnar input to Arrow
    UDFs, which ModelPredictor turns off for such data); the Parquet reader is left as
    the session has it."""
    import keras
    import numpy as np
    from pyspark.ml.feature import VectorAssembler

    from distkeras import cli, utils

    rng = np.random.default_rng(1)
    rows = [tuple(float(v) for v in row) for row in rng.normal(size=(30, 3))]
    data = str(tmp_path / "vectors.parquet")
    VectorAssembler(inputCols=["x0", "x1", "x2"], outputCol="vec").transform(
        spark.createDataFrame(rows, ["x0", "x1", "x2"])).write.parquet(data)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model_file = str(tmp_path / "model.keras")
    utils.save_model(model, model_file)
    output = str(tmp_path / "predictions.parquet")
    assert cli.main(["predict", "--data", data, "--model", model_file, "--output", output,
                     "--features", "vec"]) == 0
    rows = spark.read.parquet(output).orderBy("x0").collect()
    expected = model.predict(np.array([row["vec"].toArray() for row in rows]), verbose=0)
    np.testing.assert_allclose([row["prediction"] for row in rows], expected, atol=1e-5)
    assert spark.conf.get("spark.sql.parquet.enableVectorizedReader", "true") == "true"


def test_workers_default_to_two_and_are_refused_for_a_single_trainer(spark):
    """`--workers` was ignored by SingleTrainer without a word."""
    from distkeras import cli
    from distkeras.cli import train_args
    from distkeras.trainers import ADAG, SingleTrainer

    required = ["--data", "d", "--model", "m", "--output", "o",
                "--loss", "categorical_crossentropy"]
    adag = train_args.train_parser(ADAG)
    assert cli.build_trainer(ADAG, build_mlp(16), adag.parse_args(required)).num_workers == 2
    assert cli.build_trainer(ADAG, build_mlp(16), adag.parse_args(
        required + ["--workers", "3"])).num_workers == 3
    single = train_args.train_parser(SingleTrainer)
    cli.build_trainer(SingleTrainer, build_mlp(16), single.parse_args(required))
    with pytest.raises(cli.CommandError, match="SingleTrainer trains on one worker: "
                                               "--workers does not apply"):
        cli.build_trainer(SingleTrainer, build_mlp(16),
                          single.parse_args(required + ["--workers", "4"]))


def test_spark_settings_reach_the_session_and_malformed_ones_are_refused(spark, capsys):
    from distkeras.cli import common, train_args
    from distkeras.trainers import ADAG

    parser = train_args.train_parser(ADAG)
    required = ["--data", "d", "--model", "m", "--output", "o"]
    args = parser.parse_args(required + ["--conf", "spark.executor.cores=2",
                                         "--conf", "spark.sql.shuffle.partitions=7"])
    assert args.spark_conf == [("spark.executor.cores", "2"),
                               ("spark.sql.shuffle.partitions", "7")]
    before = spark.conf.get("spark.sql.shuffle.partitions")
    try:
        assert common.spark_session("local[2,4]", args.spark_conf) is spark
        assert spark.conf.get("spark.sql.shuffle.partitions") == "7"
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
    with pytest.raises(SystemExit):
        parser.parse_args(required + ["--conf", "spark.executor.cores"])
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_a_train_options_file_that_is_not_json_is_named(tmp_path, capsys):
    from distkeras import cli

    options = tmp_path / "options.json"
    options.write_text('{"shuffle": true,}')
    argv = ["train", "--data", "d.parquet", "--model", "m.keras", "--output", "o.keras",
            "--train-options", str(options)]
    assert cli.main(argv) == 1  # before Spark starts
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"distkeras train: error: --train-options {options} is not JSON:")


@pytest.mark.parametrize("flags, message", [
    (["--epochs", "0"], "--epochs must be an integer >= 1. Received: --epochs 0"),
    (["--batch-size", "-1"], "--batch-size must be an integer >= 1"),
    (["--window", "0"], "--window must be an integer >= 1"),
    (["--optimizer", "adamm"], "--optimizer: Keras does not know 'adamm'"),
    (["--loss", "categorical_crossentropyy"],
     "--loss: Keras does not know 'categorical_crossentropyy'"),
    (["--trainer", "SingleTrainer", "--window", "4"], "SingleTrainer has no communication"),
    (["--trainer", "SingleTrainer", "--workers", "2"], "SingleTrainer trains on one worker"),
    # The history was written over the trained model, once training was done.
    (["--history", "o.keras"], "--history o.keras is also --output: give each its own path"),
    (["--history", "h.json", "--validation-history", "./h.json"],
     "--validation-history ./h.json is also --history: give each its own path"),
    # It said "[Errno 2] No such file or directory: '...'", naming no option.
    (["--train-options", "/nonexistent/options.json"],
     "--train-options /nonexistent/options.json: No such file or directory"),
    # It named the temporary file: "No such file or directory: '.../status.json.tmp'".
    (["--status", "/nonexistent/status.json"],
     "--status /nonexistent/status.json: cannot write it (No such file or directory)"),
])
def test_train_settings_are_refused_before_spark_starts(flags, message, monkeypatch, capsys):
    from distkeras import cli
    from distkeras.cli import common

    def no_spark(*_args):
        raise AssertionError("Spark started before the settings were checked")

    monkeypatch.setattr(common, "spark_session", no_spark)
    argv = ["train", "--data", "d.parquet", "--model", "m.keras", "--output", "o.keras"]
    assert cli.main(argv + flags) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("distkeras train: error: ") and message in error, error
