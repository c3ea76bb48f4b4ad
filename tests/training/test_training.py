"""End to end on the shared local[2] SparkSession, on real Fashion-MNIST data."""

import numpy as np
import pytest
from conftest import TRAIN_LIMIT, accuracy, build_mlp

# A model that learned nothing scores about 0.10 on the ten balanced classes; one pass over
# 6,000 images takes every working trainer past 0.65 (SingleTrainer about 0.78, ADAG with its
# default window, which keeps 1/12 of each window's progress, about 0.66). One worker alone
# clears that floor too, with the other's work lost: see test_trainer_learns_fashion_mnist.
MIN_ACCURACY = 0.60


def loss_on(model, data):
    """The mean cross-entropy of ``model`` on ``(images, labels)``."""
    images, labels = data
    probabilities = model.predict(images, batch_size=1000, verbose=0)
    chosen = probabilities[np.arange(len(labels)), labels]
    return float(-np.log(np.clip(chosen, 1e-7, 1.0)).mean())


def _trainer(cls, **kwargs):
    settings = dict(keras_model=build_mlp(), worker_optimizer="adam",
                    loss="categorical_crossentropy", metrics=["accuracy"], batch_size=32)
    settings.update(kwargs)
    return cls(**settings)


@pytest.mark.parametrize("name", ["SingleTrainer", "DOWNPOUR", "ADAG"])
def test_trainer_learns_fashion_mnist(name, fashion_train, fashion_test):
    import keras

    from distkeras import trainers

    kwargs = {} if name == "SingleTrainer" else {"num_workers": 2}
    trainer = _trainer(getattr(trainers, name), **kwargs)
    model = trainer.train(fashion_train)

    assert isinstance(model, keras.Model)
    assert model.compiled, "train() must return a compiled model"
    assert accuracy(model, fashion_test) > MIN_ACCURACY
    if name == "ADAG":
        # Each worker's commits move the center (1/window of a window's change each): two
        # workers take it well past one worker on its share of the rows at the same window
        # (the 2-worker default, 2), whose center moves half as far. One worker at its own
        # default window (1) moves as far as the two together: no test of both counting.
        # DOWNPOUR's stale sums, over one pass, end no better than one worker alone
        # (0.63-0.72 against 0.65): its workers' commits are checked below.
        assert trainer.communication_window == 2
        alone = _trainer(trainers.ADAG, num_workers=1, communication_window=2).train(
            fashion_train.limit(TRAIN_LIMIT // 2), verbose=0)
        assert loss_on(model, fashion_test) < loss_on(alone, fashion_test)
    if name != "SingleTrainer":
        assert {worker for worker, _ in trainer.get_staleness()} == {0, 1}
    history = trainer.get_history()
    steps = int(np.ceil(TRAIN_LIMIT / 32)) if name == "SingleTrainer" else None
    if steps is not None:
        assert len(history) == steps  # the last partial minibatch is trained too
    assert sum(record["batch_size"] for record in history) == TRAIN_LIMIT
    assert {"worker_id", "iteration", "timestamp", "loss", "accuracy"} <= set(history[0])
    assert trainer.get_training_time() > 0
    averaged = trainer.get_averaged_history()
    assert averaged["loss"][-1] < averaged["loss"][0]
    if name != "SingleTrainer":
        assert {record["worker_id"] for record in history} == {0, 1}
        assert len(trainer.get_executor_history(1)) > 0
        assert len(trainer.get_staleness()) > 0


def test_trained_model_evaluates_with_its_compile_settings(fashion_train, fashion_test):
    from distkeras.trainers import ADAG

    trainer = _trainer(ADAG, num_workers=2, communication_window=4)
    model = trainer.train(fashion_train.limit(2000))
    images, labels = fashion_test
    one_hot = np.eye(10, dtype="float32")[labels]
    loss, acc = model.evaluate(images, one_hot, verbose=0)
    assert np.isfinite(loss) and acc > 0.5


def test_epochs_and_shuffle_see_every_sample(fashion_train):
    from distkeras.trainers import DOWNPOUR

    data = fashion_train.limit(640)
    trainer = _trainer(DOWNPOUR, num_workers=2, num_epoch=2, communication_window=3)
    trainer.train(data, shuffle=True)
    assert sum(record["batch_size"] for record in trainer.get_history()) == 2 * 640


def test_sparse_labels_and_vector_features(spark, fashion_train, fashion_test):
    from pyspark.ml.functions import array_to_vector

    from distkeras.trainers import SingleTrainer

    data = fashion_train.limit(3000).select(
        array_to_vector("features").alias("pixels"), "label_index")
    trainer = _trainer(SingleTrainer, loss="sparse_categorical_crossentropy",
                       features_col="pixels", label_col="label_index")
    model = trainer.train(data)
    assert accuracy(model, fashion_test) > 0.6


def test_user_model_is_not_modified(fashion_train):
    from distkeras.trainers import ADAG

    trainer = _trainer(ADAG, num_workers=2)
    before = [w.copy() for w in trainer.master_model.get_weights()]
    model = trainer.train(fashion_train.limit(500))
    after = trainer.master_model.get_weights()
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert not all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


@pytest.mark.parametrize("kwargs, message", [
    ({"features_col": "nope"}, "Column 'nope' is not in the DataFrame"),
    ({"label_col": "features"}, "Label column .features. holds 784 values"),
    ({"num_workers": 0}, "`num_workers` must be an integer >= 1. Received: num_workers=0"),
    ({"communication_window": 0}, "`communication_window` must be an integer >= 1"),
    ({"master_port": 70000},
     "`master_port` must be an integer in \\[0, 65535\\]. Received: master_port=70000"),
    ({"batch_size": 2.5}, "`batch_size` must be an integer >= 1"),
    ({"features_col": 5}, "`features_col` must be a column name, a list"),
    ({"label_col": []}, "`label_col` must be a column name, a list"),
])
def test_bad_input_fails_before_training(kwargs, message, fashion_train):
    from distkeras.trainers import ADAG

    trainer = _trainer(ADAG, **{"num_workers": 2, **kwargs})
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(")):
        trainer.train(fashion_train)
    assert trainer.get_history() == []


def test_a_column_name_held_twice_is_named(fashion_train):
    from distkeras.trainers import SingleTrainer

    rows = fashion_train.limit(10)
    joined = rows.select("features", "label").crossJoin(rows.select("label").limit(1))
    assert joined.columns.count("label") == 2
    with pytest.raises(ValueError, match="2 columns named 'label'"):
        _trainer(SingleTrainer).train(joined)


@pytest.mark.parametrize("given, hint", [
    ("arrays", r"not fit's \(x, y\): write the arrays with .*save_numpy_parquet"),
    ("rdd", r"pyspark.core.rdd.RDD. Convert it with rdd.toDF"),
])
def test_what_is_not_a_dataframe_is_told_how_to_become_one(spark, given, hint):
    from distkeras.trainers import ADAG

    data = (np.zeros((4, 784), "float32"), np.zeros(4, "int64"))
    if given == "rdd":
        data = spark.sparkContext.parallelize([([0.0] * 784, 0)] * 4)
    trainer = _trainer(ADAG, num_workers=2)
    with pytest.raises(TypeError, match="must be a Spark DataFrame. Received: .*" + hint):
        trainer.train(data)


def test_a_struct_features_column_is_told_how_to_become_an_array(spark):
    from distkeras.predictors import ModelPredictor
    from distkeras.trainers import SingleTrainer

    data = spark.createDataFrame([((0.1, 0.2), 1)], "features struct<a:float,b:float>, label int")
    hint = r"type struct<a:float,b:float>; .* F.array\('features.a', 'features.b'\)"
    trainer = _trainer(SingleTrainer, loss="sparse_categorical_crossentropy")
    with pytest.raises(TypeError, match=hint):
        trainer.train(data)
    with pytest.raises(TypeError, match=hint):  # predicting: the same way out
        ModelPredictor(build_mlp()).predict(data)


def _as_if_stopped(spark, monkeypatch):
    """What spark.stop() leaves on the Python side (no active context, the session's
    context closed), undone after the test: the shared session's JVM stays up."""
    from pyspark import SparkContext

    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    monkeypatch.setattr(spark.sparkContext, "_jsc", None)


def test_a_dataframe_of_a_stopped_session_is_named_before_training(spark, monkeypatch):
    from distkeras.predictors import ModelPredictor
    from distkeras.trainers import ADAG

    data = spark.createDataFrame([([0.1] * 784, 3)], "features array<float>, label int")
    model = build_mlp()
    model.compile("adam", "sparse_categorical_crossentropy")
    trainer = ADAG(keras_model=model, num_workers=2)
    _as_if_stopped(spark, monkeypatch)
    # Was a bare AssertionError from pyspark's F.col, naming nothing.
    with pytest.raises(ValueError, match=r"belongs to a SparkSession that was stopped"):
        trainer.train(data)
    with pytest.raises(ValueError, match=r"DataFrame to predict on belongs to a SparkSession"):
        ModelPredictor(keras_model=model).predict(data)
    assert trainer.get_history() == []


def test_wrong_feature_size_is_named(spark):
    from distkeras.trainers import SingleTrainer

    data = spark.createDataFrame([([0.1] * 10, [1.0] + [0.0] * 9)], "features array<float>, label array<float>")
    with pytest.raises(ValueError, match=r"holds 10 values per row .* expects shape \(784,\)"):
        _trainer(SingleTrainer).train(data)


def test_a_one_hot_encoder_label_missing_its_last_class_says_drop_last(spark):
    from pyspark.ml.feature import OneHotEncoder

    from distkeras.trainers import SingleTrainer

    data = spark.createDataFrame([([0.1] * 784, float(index)) for index in range(10)],
                                 "features array<float>, digit double")
    encoded = OneHotEncoder(inputCol="digit", outputCol="label").fit(data).transform(data)
    with pytest.raises(ValueError, match=r"holds 9 values per row .*dropLast=False"):
        _trainer(SingleTrainer).train(encoded, verbose=0)


def test_worker_error_reaches_caller_and_server_stops(spark, fashion_train):
    from distkeras.trainers import ADAG, TrainingError
    from distkeras.workers import ADAGWorker

    class ExplodingWorker(ADAGWorker):
        def communicate(self):
            raise RuntimeError("worker exploded on purpose")

    class ExplodingADAG(ADAG):
        def allocate_worker(self):
            return ExplodingWorker(self.master_model)

    trainer = _trainer(ExplodingADAG, num_workers=2)
    with pytest.raises(TrainingError, match="worker exploded on purpose"):
        trainer.train(fashion_train.limit(200))
    server = trainer.parameter_server
    assert server.transport.running is False
    import socket
    probe = socket.socket()
    # SO_REUSEADDR tolerates closed connections in TIME_WAIT but not a live listener.
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    probe.bind(("127.0.0.1", server.port))  # the port was freed
    probe.listen(1)
    probe.close()


def test_short_optimizer_config_trains_and_stays_unchanged(fashion_train, fashion_test):
    from distkeras.trainers import DOWNPOUR

    optimizer = {"class_name": "SGD", "config": {"learning_rate": 0.05}}
    trainer = _trainer(DOWNPOUR, num_workers=2, worker_optimizer=optimizer)
    model = trainer.train(fashion_train.limit(1500), verbose=0)
    assert type(model.optimizer).__name__ == "SGD"
    assert float(model.optimizer.learning_rate) == pytest.approx(0.05)
    assert optimizer == {"class_name": "SGD", "config": {"learning_rate": 0.05}}
    assert accuracy(model, fashion_test) > 0.4


def test_adag_center_keeps_the_batch_norm_statistics_its_workers_measure(fashion_train):
    import keras

    from distkeras.datasets import load_fashion_mnist_numpy
    from distkeras.trainers import ADAG

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((784,)), keras.layers.Dense(32), keras.layers.BatchNormalization(),
        keras.layers.Activation("relu"), keras.layers.Dense(10, activation="softmax")])
    trained = ADAG(model, "adam", "categorical_crossentropy", num_workers=2,
                   communication_window=12, num_epoch=2).train(fashion_train, verbose=0)

    images, _ = load_fashion_mnist_numpy("train")
    x = images[:TRAIN_LIMIT].reshape(TRAIN_LIMIT, -1).astype("float32") / 255.0
    dense, norm = trained.layers[0], trained.layers[1]
    before_norm = x @ dense.kernel.numpy() + dense.bias.numpy()
    # The moving variance describes the trained weights' activations. Divided by the
    # window like the parameters, it would stay near its initial 1.0 (errors of 100%+).
    error = np.abs(norm.moving_variance.numpy() - before_norm.var(axis=0))
    assert np.mean(error) / np.mean(before_norm.var(axis=0)) < 0.3


def test_a_number_column_trains_a_one_value_input_as_fit_does(spark):
    import keras
    import numpy as np

    from distkeras.trainers import SingleTrainer

    x = np.linspace(0.0, 1.0, 64, dtype=np.float32)
    frame = spark.createDataFrame([(float(v), 2.0 * float(v)) for v in x],
                                  "x double, y double").coalesce(1)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    initial = model.get_weights()
    trained = SingleTrainer(model, worker_optimizer="sgd", loss="mse", metrics=[],
                            features_col="x", label_col="y", batch_size=16,
                            num_epoch=2).train(frame, verbose=0)
    reference = keras.models.clone_model(model)
    reference.set_weights(initial)
    reference.compile("sgd", "mse")
    reference.fit(x.reshape(-1, 1), 2.0 * x, batch_size=16, epochs=2, shuffle=False, verbose=0)
    for got, expected in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_class_indices_in_arrays_of_one_train_as_fit_does(spark):
    """Labels shaped (rows, 1), as numpy's `y.reshape(-1, 1)` gives them, are class
    indices for a sparse loss, as in `fit`: they were refused, the error saying to use
    class indices with a sparse loss."""
    import keras

    from distkeras.trainers import SingleTrainer

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = ((x[:, 0] > 0).astype(int) + (x[:, 1] > 0)).reshape(-1, 1)
    frame = spark.createDataFrame([(row.tolist(), label.tolist()) for row, label in zip(x, y)],
                                  "features array<double>, label array<bigint>").coalesce(1)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    initial = model.get_weights()
    trainer = SingleTrainer(model, worker_optimizer="sgd",
                            loss="sparse_categorical_crossentropy", metrics=[], batch_size=16)
    trained = trainer.train(frame, validation_data=frame, verbose=0)
    reference = keras.models.clone_model(model)
    reference.set_weights(initial)
    reference.compile("sgd", "sparse_categorical_crossentropy")
    reference.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    for got, expected in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert trainer.get_validation_history()[-1]["val_loss"] == pytest.approx(
        reference.evaluate(x, y, verbose=0), rel=1e-4)
    with pytest.raises(ValueError, match=r"\(class indices\) but the loss .* one-hot"):
        SingleTrainer(model, "sgd", "categorical_crossentropy", metrics=[]).train(
            frame, verbose=0)


def _tagging_model(steps, vocabulary, tags):
    import keras

    return keras.Sequential([keras.Input((steps,), dtype="int32"),
                             keras.layers.Embedding(vocabulary, 4),
                             keras.layers.Dense(tags, activation="softmax")])


def test_a_class_index_per_step_trains_a_tagger_as_fit_does(spark):
    import keras

    from distkeras.trainers import SingleTrainer

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 12, size=(64, 5))
    tags = tokens % 3  # one class index per token, for an output of shape (5, 3)
    frame = spark.createDataFrame([(row.tolist(), tag.tolist()) for row, tag in
                                   zip(tokens, tags)], "tokens array<int>, tags array<int>")
    keras.utils.set_random_seed(0)
    model = _tagging_model(5, 12, 3)
    initial = model.get_weights()
    trainer = SingleTrainer(model, worker_optimizer="sgd", loss="sparse_categorical_crossentropy",
                            metrics=[], features_col="tokens", label_col="tags",
                            batch_size=16, num_epoch=2)
    trained = trainer.train(frame.coalesce(1), validation_data=(tokens, tags), verbose=0)
    reference = keras.models.clone_model(model)
    reference.set_weights(initial)
    reference.compile("sgd", "sparse_categorical_crossentropy")
    reference.fit(tokens, tags, batch_size=16, epochs=2, shuffle=False, verbose=0)
    for got, expected in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert trainer.get_validation_history()[-1]["val_loss"] == pytest.approx(
        reference.evaluate(tokens, tags, verbose=0), rel=1e-4)
    # The same rows as validation DataFrame; a tag out of range is named.
    SingleTrainer(model, "sgd", "sparse_categorical_crossentropy", metrics=[],
                  features_col="tokens", label_col="tags").train(
        frame, validation_data=frame, verbose=0)
    with pytest.raises(ValueError, match="class index 3"):
        SingleTrainer(model, "sgd", "sparse_categorical_crossentropy", metrics=[],
                      features_col="tokens", label_col="tags").train(
            frame, validation_data=(tokens, tags + 1), verbose=0)
    with pytest.raises(ValueError, match="class indices .*one-hot labels of shape"):
        SingleTrainer(model, "sgd", "categorical_crossentropy", metrics=[],
                      features_col="tokens", label_col="tags").train(frame, verbose=0)


def test_row_weights_weigh_every_step_of_a_taggers_output_as_fit_does(spark):
    """Keras's fit refuses weights of shape (rows,) for a loss per step; (rows, 1) weigh
    every step of a row. distkeras shapes the weight column so, in training and validation."""
    import keras

    from distkeras.trainers import SingleTrainer

    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 12, size=(64, 5))
    tags = tokens % 3
    weights = rng.uniform(0.1, 2.0, size=64).astype("float32")
    frame = spark.createDataFrame(
        [(row.tolist(), tag.tolist(), float(weight)) for row, tag, weight in
         zip(tokens, tags, weights)], "tokens array<int>, tags array<int>, weight float")
    keras.utils.set_random_seed(0)
    model = _tagging_model(5, 12, 3)
    initial = model.get_weights()
    trainer = SingleTrainer(model, worker_optimizer="sgd", loss="sparse_categorical_crossentropy",
                            metrics=["accuracy"], features_col="tokens", label_col="tags",
                            batch_size=16, num_epoch=2)
    trained = trainer.train(frame.coalesce(1), sample_weight_col="weight", verbose=0,
                            validation_data=(tokens, tags, weights))
    reference = keras.models.clone_model(model)
    reference.set_weights(initial)
    reference.compile("sgd", "sparse_categorical_crossentropy", metrics=["accuracy"])
    reference.fit(tokens, tags, sample_weight=weights[:, None], batch_size=16, epochs=2,
                  shuffle=False, verbose=0)
    for got, expected in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    weighted = reference.evaluate(tokens, tags, sample_weight=weights[:, None], verbose=0,
                                  return_dict=True)
    assert trainer.get_validation_history()[-1]["val_loss"] == pytest.approx(
        weighted["loss"], rel=1e-4)


@pytest.mark.parametrize("name", ["AEASGD", "DynSGD", "Experimental", "DiLoCo", "FedAdam"])
def test_a_model_holding_integer_state_trains_with_every_rule(name, fashion_train):
    import keras

    from distkeras import trainers
    from distkeras.datasets import load_fashion_mnist_numpy

    images, _ = load_fashion_mnist_numpy("train")
    norm = keras.layers.Normalization()  # its count is an int32 weight
    norm.adapt(images[:500].reshape(500, -1).astype("float32") / 255.0)
    model = keras.Sequential([keras.Input((784,)), norm,
                              keras.layers.Dense(10, activation="softmax")])
    # 300 rows a worker, 10 steps: a window of 4 commits twice.
    trained = getattr(trainers, name)(model, "adam", "categorical_crossentropy", num_workers=2,
                                      communication_window=4).train(fashion_train.limit(600),
                                                                    verbose=0)
    np.testing.assert_allclose(trained.layers[0].mean, norm.mean, atol=1e-6)
    assert trained.layers[0].count.dtype == "int32"


def test_averaging_ignores_the_replica_of_an_empty_partition(fashion_train):
    import keras
    from pyspark.sql import functions as F

    from distkeras.trainers import AveragingTrainer

    rows = fashion_train.limit(600)
    one_sided = rows.repartition(2, F.lit(0)).cache()  # every row in one partition
    assert sorted(one_sided.rdd.glom().map(len).collect()) == [0, 600]
    start = build_mlp()

    def moved(frame, num_workers):
        trainer = AveragingTrainer(keras_model=start, worker_optimizer=keras.optimizers.SGD(0.1),
                                   loss="categorical_crossentropy", num_workers=num_workers)
        model = trainer.train(frame, verbose=0)
        return [trained - initial for trained, initial in
                zip(model.get_weights(), start.get_weights())]

    # One epoch (a job of its own): the empty replica changes nothing.
    for with_empty, alone in zip(moved(one_sided, 2), moved(one_sided.coalesce(1), 1)):
        np.testing.assert_allclose(with_empty, alone, atol=1e-5)


def test_distributed_trainers_say_that_use_ema_is_not_exchanged(caplog):
    import keras

    from conftest import build_mlp
    from distkeras.trainers import ADAG, AveragingTrainer, EnsembleTrainer, SingleTrainer

    for trainer_class in (ADAG, AveragingTrainer, SingleTrainer, EnsembleTrainer):
        caplog.clear()
        with caplog.at_level("WARNING", logger="distkeras"):
            trainer_class(build_mlp(32), keras.optimizers.Adam(use_ema=True),
                          "categorical_crossentropy").validate_arguments()
        warned = "not their moving averages" in caplog.text
        # An ensemble's members exchange nothing: each ends with its own averages.
        assert warned == (trainer_class in (ADAG, AveragingTrainer)), trainer_class.__name__


@pytest.mark.parametrize("loss, metrics", [
    ("categorical_crossentropy", ["accuracy"]),
    ({"class_name": "SparseCategoricalCrossentropy", "config": {}}, ["accuracy"]),
    ("squared_hinge", ["accuracy"]),
    ("mse", []),
    ("huber", []),
])
def test_accuracy_is_the_default_metric_of_classification_losses_only(loss, metrics):
    from conftest import build_mlp
    from distkeras.trainers import ADAG

    trainer = ADAG(build_mlp(32), "adam", loss)
    assert trainer.settings().metrics == metrics  # the run's: the trainer keeps None
    assert trainer.metrics is None


def _multi_label_data(rows=600, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 8)).astype("float32")
    y = (x @ rng.normal(size=(8, 4)) > 0.5).astype("float32")  # multi-hot, several tags
    return x, y


@pytest.mark.parametrize("units, loss, threshold", [
    (4, "binary_crossentropy", 0.5),
    (1, {"class_name": "BinaryCrossentropy", "config": {"from_logits": True}}, 0.0),
    (3, "binary_focal_crossentropy", 0.5),
])
def test_default_accuracy_of_binary_losses_is_binary_accuracy(units, loss, threshold):
    # "accuracy" resolves to categorical accuracy (argmax) for several sigmoid units, and
    # thresholds logits at 0.5: the default is Keras's binary accuracy at the loss's 0.5.
    import keras

    from distkeras.trainers import ADAG

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(units)])
    trainer = ADAG(model, "adam", keras.losses.get(loss) if units == 1 else loss)
    (metric,) = trainer.settings().metrics
    assert metric["class_name"] == "BinaryAccuracy"
    assert metric["config"]["name"] == "accuracy"
    assert metric["config"]["threshold"] == threshold


def test_multi_label_default_accuracy_is_elementwise(spark):
    import keras

    from distkeras.trainers import SingleTrainer

    x, y = _multi_label_data()
    frame = spark.createDataFrame([(row.tolist(), tags.tolist()) for row, tags in zip(x, y)],
                                  "features array<float>, tags array<float>")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="sigmoid")])
    trainer = SingleTrainer(model, "adam", "binary_crossentropy", batch_size=64,
                            features_col="features", label_col="tags")
    trained = trainer.train(frame, validation_data=(x, y), verbose=0)

    elementwise = float(((trained.predict(x, verbose=0) > 0.5) == y).mean())
    assert trainer.get_validation_history()[-1]["val_accuracy"] == pytest.approx(elementwise,
                                                                                  abs=1e-6)
    assert 0.0 <= trainer.get_history()[0]["accuracy"] <= 1.0
