"""KerasEstimator in a Pipeline: preprocess, train with a distkeras trainer, predict, save."""

import numpy as np
import pytest
from conftest import build_mlp

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def fashion_test_frame(spark):
    from distkeras.datasets import load_fashion_mnist

    return load_fashion_mnist(spark, "test", limit=1000).cache()


def _pipeline(trainer):
    from pyspark.ml import Pipeline

    from distkeras.ml.estimators import KerasEstimator
    from distkeras.transformers import LabelIndexTransformer, OneHotTransformer

    return Pipeline(stages=[
        OneHotTransformer(10, input_col="label_index", output_col="one_hot"),
        KerasEstimator(trainer, output_col="prediction", batch_size=256),
        # The default threshold (0.55): a sure prediction wins, else the largest value.
        LabelIndexTransformer(10, input_col="prediction", output_col="prediction_index"),
    ])


def _single_trainer():
    from distkeras.trainers import SingleTrainer

    return SingleTrainer(keras_model=build_mlp(64), worker_optimizer="adam",
                         loss="categorical_crossentropy", metrics=["accuracy"], batch_size=32,
                         features_col="features", label_col="one_hot")


def test_pipeline_trains_predicts_and_survives_save_and_load(fashion_train, fashion_test_frame,
                                                             tmp_path):
    import keras
    from pyspark.ml import PipelineModel

    from distkeras.ml.estimators import KerasModel
    from distkeras.evaluators import AccuracyEvaluator, LossEvaluator

    trainer = _single_trainer()
    fitted = _pipeline(trainer).fit(fashion_train.drop("label").limit(2000))
    stage = fitted.stages[1]
    assert isinstance(stage, KerasModel) and isinstance(stage.keras_model, keras.Model)
    assert sum(record["batch_size"] for record in trainer.get_history()) == 2000

    predicted = fitted.transform(fashion_test_frame).cache()
    assert {"prediction", "prediction_index", "one_hot", "label"} <= set(predicted.columns)
    accuracy = AccuracyEvaluator("prediction_index", "label_index").evaluate(predicted)
    assert accuracy > 0.5

    # Argmax accuracy from Spark equals the Keras model's own on the same rows.
    rows = fashion_test_frame.select("features", "label_index").collect()
    images = np.array([row.features for row in rows], dtype="float32")
    labels = np.array([row.label_index for row in rows])
    probabilities = stage.keras_model.predict(images, verbose=0)
    keras_accuracy = float((probabilities.argmax(1) == labels).mean())
    assert accuracy == pytest.approx(keras_accuracy, abs=1e-9)
    assert AccuracyEvaluator("prediction", "label_index").evaluate(predicted) == \
        pytest.approx(keras_accuracy, abs=1e-9)
    keras_loss = float(keras.ops.mean(keras.losses.categorical_crossentropy(
        np.eye(10, dtype="float32")[labels], probabilities)))
    assert LossEvaluator(prediction_col="prediction", label_col="label").evaluate(predicted) \
        == pytest.approx(keras_loss, rel=1e-4)

    fitted.save(str(tmp_path / "fitted"))
    loaded = PipelineModel.load(str(tmp_path / "fitted"))
    assert isinstance(loaded.stages[1], KerasModel)
    assert loaded.stages[1].keras_model.compiled
    assert loaded.stages[1].getOrDefault("batchSize") == 256
    again = loaded.transform(fashion_test_frame).select("prediction").collect()
    before = predicted.select("prediction").collect()
    np.testing.assert_allclose([row.prediction for row in again],
                               [row.prediction for row in before], atol=1e-6)


def test_unfitted_pipeline_with_the_estimator_saves_and_loads(spark, tmp_path):
    from pyspark.ml import Pipeline

    from distkeras.ml.estimators import KerasEstimator
    from distkeras.trainers import SingleTrainer

    trainer = _single_trainer()
    _pipeline(trainer).save(str(tmp_path / "pipeline"))
    estimator = Pipeline.load(str(tmp_path / "pipeline")).getStages()[1]
    assert isinstance(estimator, KerasEstimator)
    assert isinstance(estimator.trainer, SingleTrainer)
    assert estimator.trainer.get_config() == trainer.get_config()
    for loaded, original in zip(estimator.trainer.master_model.get_weights(),
                                trainer.master_model.get_weights()):
        np.testing.assert_array_equal(loaded, original)
    assert estimator.getOrDefault("batchSize") == 256


def test_settings_a_compiled_model_lends_are_saved_with_the_estimator(spark, tmp_path):
    import keras
    from pyspark.ml import Pipeline

    from distkeras.ml.estimators import KerasEstimator
    from distkeras.trainers import SingleTrainer

    model = build_mlp(32)
    model.compile(keras.optimizers.SGD(0.05), "categorical_crossentropy")
    Pipeline(stages=[KerasEstimator(SingleTrainer(model))]).save(str(tmp_path / "lent"))
    trainer = Pipeline.load(str(tmp_path / "lent")).getStages()[0].trainer
    assert trainer.get_config()["worker_optimizer"]["class_name"] == "SGD"
    assert trainer.get_config()["loss"] == "categorical_crossentropy"


def test_a_model_needing_custom_objects_says_how_to_load_it(spark, tmp_path):
    """Keras's own error named neither the saved stage nor the fix (a scope or a
    registration): a Pipeline saved in one session and loaded in another hit it."""
    import keras
    from pyspark.ml import Pipeline, PipelineModel

    from distkeras.ml.estimators import KerasModel

    class Halve(keras.layers.Layer):  # not registered, not at a module's top level
        def call(self, inputs):
            return inputs / 2

    model = keras.Sequential([keras.Input((3,)), Halve(), keras.layers.Dense(2)])
    path = str(tmp_path / "custom")
    Pipeline(stages=[KerasModel(model)]).fit(spark.range(1)).save(path)
    with pytest.raises(ValueError, match=r"Could not rebuild the Keras model saved at .*"
                                         r"model\.keras(.|\n)*custom_object_scope"):
        PipelineModel.load(path)
    with keras.saving.custom_object_scope({"Halve": Halve}):
        loaded = PipelineModel.load(path).stages[0]
    assert isinstance(loaded.keras_model.layers[0], Halve)


def test_estimator_errors(spark):
    from distkeras.ml.estimators import KerasEstimator, KerasModel

    frame = spark.createDataFrame([([0.0] * 784,)], ["features"])
    with pytest.raises(TypeError, match="needs a distkeras trainer"):
        KerasEstimator().fit(frame)
    with pytest.raises(ValueError, match="holds no Keras model"):
        KerasModel().transform(frame)


def test_estimator_and_model_params_have_chained_setters_as_spark_stages_do(spark):
    import keras

    from distkeras.ml.estimators import KerasEstimator, KerasModel

    estimator = KerasEstimator(_single_trainer()).setPredictionCol("scores").setBatchSize(8) \
        .setWeightCol("w").setValidation(0.25).setShuffle(True).setClassWeight({"1": 2})
    assert [estimator.getOrDefault(name) for name in (
        "predictionCol", "batchSize", "weightCol", "validation", "shuffle", "classWeight")] \
        == ["scores", 8, "w", 0.25, True, {1: 2.0}]
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    fitted = KerasModel(model).setFeaturesCol("x").setPredictionCol("y_hat").setBatchSize(2)
    frame = spark.createDataFrame([([1.0, 2.0],), ([3.0, 4.0],), ([5.0, 6.0],)], ["x"])
    predicted = [row.y_hat for row in fitted.transform(frame).collect()]
    expected = model.predict(np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), verbose=0)
    np.testing.assert_allclose(predicted, expected, rtol=1e-5)


def test_every_param_has_a_getter_as_spark_stages_do(spark):
    """Spark's stages have ``get<Param>`` for each Param (``getNumEpoch()`` raised
    AttributeError); unset and without a default, Spark's KeyError, as its own."""
    import keras

    from distkeras.ml.estimators import KerasEstimator, KerasModel

    estimator = KerasEstimator(_single_trainer(), batch_size=8, validation=0.25,
                               shuffle=True, class_weight={1: 2}, num_epoch=3,
                               training_batch_size=16, worker_optimizer="sgd",
                               learning_rate=0.5)
    assert [estimator.getBatchSize(), estimator.getValidation(), estimator.getShuffle(),
            estimator.getClassWeight(), estimator.getNumEpoch(),
            estimator.getTrainingBatchSize(), estimator.getWorkerOptimizer(),
            estimator.getLearningRate()] == [8, 0.25, True, {1: 2.0}, 3, 16, "sgd", 0.5]
    assert estimator.copy({estimator.numEpoch: 5}).getNumEpoch() == 5
    with pytest.raises(KeyError):
        KerasEstimator(_single_trainer()).getNumEpoch()
    fitted = KerasModel(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]),
                        features_col="x", batch_size=4)
    assert (fitted.getFeaturesCol(), fitted.getBatchSize()) == ("x", 4)


def test_weight_col_reaches_the_trainer_and_survives_save_and_load(fashion_train, tmp_path):
    from pyspark.ml import Pipeline
    from pyspark.sql import functions as F

    from distkeras.ml.estimators import KerasEstimator

    trainer = _single_trainer()
    initial = trainer.master_model.get_weights()
    # Every row weighs 0: the trained model must be the initial one.
    frame = fashion_train.limit(256).withColumn("weight", F.lit(0.0))
    stage = KerasEstimator(trainer, weight_col="weight")
    fitted = Pipeline(stages=[stage]).fit(frame.withColumnRenamed("label", "one_hot"))

    for trained, start in zip(fitted.stages[0].keras_model.get_weights(), initial):
        np.testing.assert_allclose(trained, start, atol=1e-7)
    Pipeline(stages=[stage]).save(str(tmp_path / "weighted"))
    loaded = Pipeline.load(str(tmp_path / "weighted")).getStages()[0]
    assert loaded.getOrDefault("weightCol") == "weight"


def test_class_weight_reaches_the_trainer_and_survives_save_and_load(fashion_train, tmp_path):
    from pyspark.ml import Pipeline

    from distkeras.ml.estimators import KerasEstimator

    trainer = _single_trainer()
    initial = trainer.master_model.get_weights()
    # Every class weighs 0: the trained model must be the initial one.
    stage = KerasEstimator(trainer, class_weight={index: 0.0 for index in range(10)})
    fitted = Pipeline(stages=[stage]).fit(
        fashion_train.limit(256).withColumnRenamed("label", "one_hot"))

    for trained, start in zip(fitted.stages[0].keras_model.get_weights(), initial):
        np.testing.assert_allclose(trained, start, atol=1e-7)
    Pipeline(stages=[stage]).save(str(tmp_path / "class_weighted"))
    loaded = Pipeline.load(str(tmp_path / "class_weighted")).getStages()[0]
    assert loaded.getOrDefault("classWeight") == {index: 0.0 for index in range(10)}
    with pytest.raises(TypeError, match="must map class indices"):
        KerasEstimator(trainer, class_weight={"cat": 2.0})


def test_validation_and_callbacks_reach_the_trainer(fashion_train, tmp_path):
    import keras
    from pyspark.ml import Pipeline

    from distkeras.ml.estimators import KerasEstimator
    from distkeras.trainers import AveragingTrainer

    trainer = AveragingTrainer(build_mlp(32), "adam", "categorical_crossentropy",
                               label_col="label", num_epoch=3)
    logger = keras.callbacks.CSVLogger(str(tmp_path / "epochs.csv"))
    stage = KerasEstimator(trainer, validation=0.2, callbacks=[logger])
    Pipeline(stages=[stage]).fit(fashion_train.limit(2000))

    records = trainer.get_validation_history()
    assert [record["epoch"] for record in records] == [1, 2, 3]
    assert 3 * 1400 < records[-1]["samples"] < 3 * 1800  # about a fifth held out
    assert len((tmp_path / "epochs.csv").read_text().splitlines()) == 4  # header + 3 epochs
    Pipeline(stages=[stage]).save(str(tmp_path / "validated"))
    loaded = Pipeline.load(str(tmp_path / "validated")).getStages()[0]
    assert loaded.getOrDefault("validation") == pytest.approx(0.2)


def test_a_callback_alone_reaches_the_trainer(fashion_train):
    import keras

    from distkeras.ml.estimators import KerasEstimator
    from distkeras.trainers import SingleTrainer

    # fit takes one callback without a list: so does the estimator.
    stopping = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0)
    trainer = SingleTrainer(build_mlp(32), "adam", "categorical_crossentropy", num_epoch=4)
    KerasEstimator(trainer, callbacks=stopping).fit(fashion_train.limit(500))

    assert stopping.stopped_epoch == 1
    assert {record["epoch"] for record in trainer.get_history()} == {0, 1}


def test_estimator_copies_fitted_in_parallel_threads_keep_their_own_settings(spark,
                                                                            fashion_train):
    """Copies of an estimator share its trainer (Params.copy is shallow): when a run kept
    its state on the trainer, CrossValidator(parallelism=2) fitting two copies at once
    mixed their settings. Each run owns its state now: they may overlap, each with its
    own copy's Params, and the trainer keeps its settings."""
    import threading
    import time

    from distkeras.ml.estimators import KerasEstimator
    from distkeras.trainers import SingleTrainer
    from distkeras.training.one_task import OneTaskPlan

    spans = []

    class RecordingPlan(OneTaskPlan):
        def train(self, frame, label_shapes, shuffle):
            start = time.monotonic()
            time.sleep(0.5)  # long enough for the other thread to start its run
            model = super().train(frame, label_shapes, shuffle)
            spans.append((start, time.monotonic(), self.run.class_table,
                          self.settings.num_epoch))
            return model

    class Recording(SingleTrainer):
        plan = RecordingPlan

    trainer = Recording(build_mlp(16), "adam", "categorical_crossentropy")
    config = trainer.get_config()
    estimator = KerasEstimator(trainer)
    copies = [estimator.copy({estimator.classWeight: {0: 0.0}, estimator.numEpoch: 2}),
              estimator.copy()]
    data = fashion_train.limit(300)
    threads = [threading.Thread(target=copy.fit, args=(data,)) for copy in copies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(spans) == 2
    # Each run trained with its own copy's class weights and epochs.
    assert sorted((table is None, epochs) for _, _, table, epochs in spans) == \
        [(False, 2), (True, 1)]
    assert trainer.get_config() == config  # the trainer kept its own settings


def test_estimator_passes_shuffle_to_the_trainer(spark, tmp_path):
    import keras

    from distkeras.ml.estimators import KerasEstimator
    from distkeras.trainers import SingleTrainer

    frame = spark.createDataFrame([([float(i)], i % 2) for i in range(16)],
                                  "features array<double>, label int")
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2, activation="softmax")])
    trainer = SingleTrainer(model, worker_optimizer="sgd",
                            loss="sparse_categorical_crossentropy")
    seen = []
    original = trainer.train
    trainer.train = lambda dataframe, **options: seen.append(options["shuffle"]) or \
        original(dataframe, **options)
    KerasEstimator(trainer).fit(frame)
    estimator = KerasEstimator(trainer, shuffle=True)
    estimator.fit(frame)
    assert seen == [False, True]
    estimator.save(str(tmp_path / "estimator"))
    assert KerasEstimator.load(str(tmp_path / "estimator")).getOrDefault("shuffle") is True


def test_estimator_refuses_an_ensemble_before_training(spark, fashion_train):
    from distkeras.ml.estimators import KerasEstimator
    from distkeras.trainers import EnsembleTrainer

    trainer = EnsembleTrainer(build_mlp(16), "adam", "categorical_crossentropy")
    with pytest.raises(TypeError, match="EnsembleTrainer returns several models"):
        KerasEstimator(trainer).fit(fashion_train.limit(64))
    assert trainer.get_history() == []  # nothing trained


def _small_frame(spark, rows=64):
    return spark.createDataFrame([([float(i % 4), float(i % 3)], i % 2) for i in range(rows)],
                                 "features array<double>, label int")


def _small_model():
    import keras

    return keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="softmax")])


def test_cross_validator_tunes_the_training_params(spark, tmp_path):
    """A grid over epochs, minibatch size and optimizer reached nothing: the estimator had
    no Params for them (its batchSize is the prediction batch). Each fit now trains with
    its own, and the trainer keeps its settings."""
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    from distkeras.ml.estimators import KerasEstimator
    from distkeras.evaluators import AccuracyEvaluator
    from distkeras.trainers import SingleTrainer
    from distkeras.training.one_task import OneTaskPlan

    seen = []

    class RecordingPlan(OneTaskPlan):
        def train(self, frame, label_shapes, shuffle):
            settings = self.settings  # the run's: the estimator's Params replace the trainer's
            seen.append((settings.num_epoch, settings.batch_size,
                         settings.worker_optimizer["class_name"],
                         settings.worker_optimizer["config"]["learning_rate"]))
            return super().train(frame, label_shapes, shuffle)

    class Recording(SingleTrainer):
        plan = RecordingPlan

    trainer = Recording(_small_model(), worker_optimizer="adam",
                        loss="sparse_categorical_crossentropy", batch_size=32, num_epoch=1)
    estimator = KerasEstimator(trainer, learning_rate=0.05)
    grid = ParamGridBuilder().addGrid(estimator.numEpoch, [1, 3]) \
        .addGrid(estimator.trainingBatchSize, [4, 16]) \
        .addGrid(estimator.workerOptimizer, ["sgd", "rmsprop"]).build()
    # Two of its 8 maps, each Param's both values: (1, 4, sgd) and (3, 16, rmsprop).
    grid = [grid[0], grid[-1]]
    fitted = CrossValidator(estimator=estimator, estimatorParamMaps=grid, numFolds=2, seed=3,
                            evaluator=AccuracyEvaluator("prediction", "label")) \
        .fit(_small_frame(spark))
    expected = {(1, 4, "sgd", 0.05), (3, 16, "rmsprop", 0.05)}
    assert {(e, b, o.lower(), round(lr, 6)) for e, b, o, lr in seen[:-1]} == expected
    assert len(seen) == 2 * len(grid) + 1  # each map on each fold, then the best on all
    assert len(fitted.avgMetrics) == len(grid)
    assert (trainer.num_epoch, trainer.batch_size, trainer.worker_optimizer) == \
        (1, 32, "adam")
    assert sum(record["batch_size"] for record in trainer.get_history()) == \
        64 * seen[-1][0]  # the last fit's history, with its own epochs

    plain = KerasEstimator(SingleTrainer(_small_model(), worker_optimizer="adam",
                                         loss="sparse_categorical_crossentropy"),
                           num_epoch=2, learning_rate=0.05)
    plain.setTrainingBatchSize(8).setWorkerOptimizer("sgd").save(str(tmp_path / "estimator"))
    loaded = KerasEstimator.load(str(tmp_path / "estimator"))
    assert [loaded.getOrDefault(name) for name in (
        "numEpoch", "trainingBatchSize", "workerOptimizer", "learningRate")] == \
        [2, 8, "sgd", 0.05]


def test_learning_rate_param_reaches_the_workers(spark):
    """learningRate=0 trains nothing: the weights come back as they were; the trainer's
    own optimizer (an instance here) is left as it was."""
    import keras

    from distkeras.ml.estimators import KerasEstimator
    from distkeras.trainers import ADAG

    model = _small_model()
    optimizer = keras.optimizers.SGD(learning_rate=0.5)
    trainer = ADAG(model, worker_optimizer=optimizer, loss="sparse_categorical_crossentropy",
                   num_workers=2, batch_size=4, communication_window=2)
    frozen = KerasEstimator(trainer, learning_rate=0.0).fit(_small_frame(spark))
    for trained, initial in zip(frozen.keras_model.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(trained, initial)
    assert trainer.worker_optimizer is optimizer
    assert float(optimizer.learning_rate) == pytest.approx(0.5)
    moved = KerasEstimator(trainer).fit(_small_frame(spark))
    assert any(not np.array_equal(trained, initial) for trained, initial in
               zip(moved.keras_model.get_weights(), model.get_weights()))


def test_learning_rate_param_sets_a_mixed_precision_models_optimizer(spark):
    """A mixed_float16 model compiles with a LossScaleOptimizer, which takes no
    learning_rate: setting it on the wrapper failed to rebuild; the wrapped optimizer's is
    set."""
    import keras

    from distkeras.ml.estimators import KerasEstimator
    from distkeras.trainers import SingleTrainer

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4),
                                  keras.layers.Dense(2, activation="softmax", dtype="float32")])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model.compile(keras.optimizers.SGD(0.5), "sparse_categorical_crossentropy")
    frozen = KerasEstimator(SingleTrainer(model, batch_size=4),
                            learning_rate=0.0).fit(_small_frame(spark))
    optimizer = frozen.keras_model.optimizer
    assert type(optimizer).__name__ == "LossScaleOptimizer"
    assert float(optimizer.inner_optimizer.learning_rate) == 0.0
    for trained, initial in zip(frozen.keras_model.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(trained, initial)


def test_learning_rate_param_without_an_optimizer_says_what_to_set(spark):
    from distkeras.ml.estimators import KerasEstimator
    from distkeras.trainers import SingleTrainer

    trainer = SingleTrainer(_small_model(), loss="sparse_categorical_crossentropy")
    with pytest.raises(ValueError, match="workerOptimizer"):
        KerasEstimator(trainer, learning_rate=0.1).fit(_small_frame(spark))
    model = KerasEstimator(trainer, learning_rate=0.1, worker_optimizer="sgd") \
        .fit(_small_frame(spark)).keras_model
    assert float(model.optimizer.learning_rate) == pytest.approx(0.1)


def test_loading_an_estimator_whose_trainer_class_is_gone_says_to_define_it(spark, tmp_path):
    """A custom trainer defined in a notebook is not there in a new session: loading said
    it was "not a distkeras trainer class", or named a module that never existed."""
    from distkeras.ml.estimators import KerasEstimator
    from distkeras.trainers import SingleTrainer

    class NotebookTrainer(SingleTrainer):
        pass

    estimator = KerasEstimator(NotebookTrainer(_small_model(), worker_optimizer="adam",
                                               loss="sparse_categorical_crossentropy"))
    estimator.save(str(tmp_path / "estimator"))
    with pytest.raises(ValueError, match="cannot find: define or import NotebookTrainer"):
        KerasEstimator.load(str(tmp_path / "estimator"))
