"""ModelPredictor against model.predict on the same rows; evaluators against hand-computed
values."""

import math

import numpy as np
import pytest

pytestmark = pytest.mark.spark

ROWS = 37  # not a multiple of the batch size: the last chunk of every batch is padded


def _mlp(input_shape, seed):
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input(input_shape),
        keras.layers.Dense(5, activation="tanh"),
        keras.layers.Flatten(),
        keras.layers.Dense(3, activation="softmax"),
    ])


def _features(seed, width):
    return np.random.default_rng(seed).normal(size=(ROWS, width)).astype("float32")


def _predictions(dataframe, column="prediction"):
    rows = dataframe.orderBy("id").collect()
    return rows, np.array([row[column] for row in rows], dtype="float32")


def test_predicts_array_features_like_model_predict(spark):
    from distkeras.predictors import ModelPredictor

    model = _mlp((6,), seed=1)
    x = _features(0, 6)
    frame = spark.createDataFrame(
        [(i, x[i].tolist(), f"row{i}") for i in range(ROWS)], "id int, features array<float>, "
        "name string").repartition(2)
    out = ModelPredictor(model, batch_size=8).predict(frame)
    assert out.columns == ["id", "features", "name", "prediction"]
    assert out.schema["prediction"].dataType.simpleString() == "array<float>"
    rows, predicted = _predictions(out)
    assert [row.name for row in rows] == [f"row{i}" for i in range(ROWS)]
    np.testing.assert_allclose(predicted, model.predict(x, verbose=0), atol=1e-5)


def test_predicts_vector_features_reshaped_to_the_input_shape(spark):
    from pyspark.ml.linalg import Vectors

    from distkeras.predictors import ModelPredictor

    model = _mlp((4, 2), seed=2)  # flat rows of 8 values become (4, 2)
    x = _features(1, 8)
    x[::3, :4] = 0.0
    vectors = [Vectors.sparse(8, {j: float(v) for j, v in enumerate(row) if v != 0.0})
               if i % 3 == 0 else Vectors.dense(row.tolist()) for i, row in enumerate(x)]
    frame = spark.createDataFrame([(i, vectors[i]) for i in range(ROWS)], ["id", "pixels"]) \
        .coalesce(1)
    out = ModelPredictor(model, features_col="pixels", output_col="p", batch_size=16) \
        .predict(frame)
    assert out.columns == ["id", "pixels", "p"]
    rows, predicted = _predictions(out, "p")
    assert rows[0].pixels == vectors[0]  # the vector column is kept as it was
    np.testing.assert_allclose(predicted, model.predict(x.reshape(-1, 4, 2), verbose=0),
                               atol=1e-5)


def test_predicts_nested_arrays_from_reshape_transformer(spark):
    import keras

    from distkeras.predictors import ModelPredictor
    from distkeras.transformers import ReshapeTransformer

    keras.utils.set_random_seed(3)
    conv = keras.Sequential([
        keras.Input((4, 4, 1)),
        keras.layers.Conv2D(2, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(2),
    ])
    x = _features(2, 16)
    frame = spark.createDataFrame([(i, x[i].tolist()) for i in range(ROWS)], ["id", "flat"]) \
        .coalesce(1)
    images = ReshapeTransformer("flat", "image", (4, 4, 1)).transform(frame)
    _, predicted = _predictions(ModelPredictor(conv, "image").predict(images))
    np.testing.assert_allclose(predicted, conv.predict(x.reshape(-1, 4, 4, 1), verbose=0),
                               atol=1e-5)


def test_predicts_two_inputs_and_skips_empty_partitions(spark):
    import keras

    from distkeras.predictors import ModelPredictor

    keras.utils.set_random_seed(4)
    left, right = keras.Input((3,)), keras.Input((2,))
    merged = keras.layers.Concatenate()([keras.layers.Dense(4)(left), right])
    model = keras.Model([left, right], keras.layers.Dense(2)(merged))
    a, b = _features(3, 3), _features(4, 2)
    frame = spark.createDataFrame(
        [(i, a[i].tolist(), b[i].tolist()) for i in range(ROWS)], ["id", "a", "b"]) \
        .repartition(6, "id").filter("id < 9")  # several partitions, some of them empty
    out = ModelPredictor(model, features_col=["a", "b"], batch_size=4).predict(frame)
    assert out.columns == ["id", "a", "b", "prediction"]
    rows, predicted = _predictions(out)
    assert [row.id for row in rows] == list(range(9))
    np.testing.assert_allclose(predicted, model.predict([a[:9], b[:9]], verbose=0), atol=1e-5)


def test_predicts_every_output_of_a_multi_output_model_in_one_call(spark):
    import keras

    from distkeras.predictors import ModelPredictor

    keras.utils.set_random_seed(5)
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4)(inputs)
    model = keras.Model(inputs, [keras.layers.Dense(2, name="classes")(hidden),
                                 keras.layers.Dense(1, name="score")(hidden)])
    a = _features(3, 3)
    frame = spark.createDataFrame([(i, a[i].tolist()) for i in range(ROWS)],
                                  ["id", "features"]).repartition(3, "id")
    expected = model.predict(a, verbose=0)

    out = ModelPredictor(model, batch_size=8).predict(frame)
    assert out.columns == ["id", "features", "prediction_classes", "prediction_score"]
    rows = sorted(out.collect(), key=lambda row: row.id)
    np.testing.assert_allclose([row.prediction_classes for row in rows], expected[0],
                               atol=1e-5)
    np.testing.assert_allclose([row.prediction_score for row in rows], expected[1], atol=1e-5)
    # The model runs once per batch, not once per output column.
    assert out.select("prediction_classes", "prediction_score")._jdf.queryExecution() \
        .executedPlan().toString().count("ArrowEvalPython") == 1

    named = ModelPredictor(model, output_col=["kind", "how_much"]).predict(frame)
    assert named.columns[-2:] == ["kind", "how_much"]
    with pytest.raises(ValueError, match="The model has 2 outputs: `output_col` must name 2 "
                                         "different columns"):
        ModelPredictor(model, output_col=["only_one"]).predict(frame)
    with pytest.raises(ValueError, match="'prediction_score' is already in the DataFrame"):
        ModelPredictor(model).predict(frame.withColumn("prediction_score", frame.id))


def test_predicts_a_model_whose_outputs_are_a_dict(spark):
    """predict_on_batch returns a dict for `keras.Model(inputs, {name: output})`: it was
    taken for one output and failed on the executors with an IndexError."""
    import keras

    from distkeras.predictors import ModelPredictor

    keras.utils.set_random_seed(6)
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4)(inputs)
    model = keras.Model(inputs, {"zeta": keras.layers.Dense(2, name="zeta")(hidden),
                                 "alpha": keras.layers.Dense(1, name="alpha")(hidden)})
    a = _features(5, 3)
    frame = spark.createDataFrame([(i, a[i].tolist()) for i in range(ROWS)],
                                  ["id", "features"]).coalesce(1)
    expected = model.predict(a, verbose=0)
    out = ModelPredictor(model, batch_size=8).predict(frame)
    assert out.columns == ["id", "features", "prediction_alpha", "prediction_zeta"]
    _, alpha = _predictions(out, "prediction_alpha")
    _, zeta = _predictions(out, "prediction_zeta")
    np.testing.assert_allclose(alpha, expected["alpha"], atol=1e-5)
    np.testing.assert_allclose(zeta, expected["zeta"], atol=1e-5)


def test_a_null_vector_is_named_not_a_jvm_error(spark):
    """Spark's vector_to_array failed the job on a null vector with a JVM UDF error; the
    null now reaches the check that names the column. A row after the first (here the
    second partition's) fails its task, which Spark retries (local[2,4]: 4 attempts): each
    retry predicted every batch before it again, in a new Python worker (the failed one
    exits) that first rebuilt and compiled the model. The executor keeps the error, and
    the retries raise it at once."""
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql.types import IntegerType, StructField, StructType

    from distkeras.predictors import ModelPredictor

    frame = spark.createDataFrame([(0, Vectors.dense([1.0] * 6)), (1, None)],
                                  StructType([StructField("id", IntegerType()),
                                              StructField("features", VectorUDT())]))
    with pytest.raises(Exception, match="Column 'features' has 1 null values") as caught:
        ModelPredictor(_mlp((6,), seed=1)).predict(frame).collect()
    assert "This retry, attempt 4 of the task, stopped without predicting" in str(caught.value)


def test_executors_follow_new_weights_of_the_same_model(spark):
    """The executors keep the model between calls; changed weights must still reach them."""
    from distkeras.predictors import ModelPredictor

    model = _mlp((6,), seed=5)
    x = _features(5, 6)
    frame = spark.createDataFrame([(i, x[i].tolist()) for i in range(ROWS)],
                                  ["id", "features"]).coalesce(1)
    first = _predictions(ModelPredictor(model, batch_size=8).predict(frame))[1]
    again = _predictions(ModelPredictor(model, batch_size=8).predict(frame))[1]
    np.testing.assert_array_equal(again, first)
    model.set_weights([w * 0.5 for w in model.get_weights()])
    changed = _predictions(ModelPredictor(model, batch_size=8).predict(frame))[1]
    expected = model.predict(x, verbose=0)
    assert not np.allclose(expected, first, atol=1e-3)
    np.testing.assert_allclose(changed, expected, atol=1e-5)


def test_model_key_ignores_the_save_date_only():
    from distkeras.ml.prediction_tasks import model_key
    from distkeras.utils import serialize_model

    model = _mlp((6,), seed=6)
    first = serialize_model(model)
    time_passes = serialize_model(model)
    assert model_key(first) == model_key(time_passes)
    model.set_weights([w + 1.0 for w in model.get_weights()])
    assert model_key(serialize_model(model)) != model_key(first)


def test_cached_model_is_rebuilt_only_for_another_key():
    import gc

    from distkeras.ml import prediction_tasks
    from distkeras.utils import serialize_model

    data = serialize_model(_mlp((6,), seed=7))
    saved = dict(prediction_tasks._CACHE)
    prediction_tasks._CACHE.clear()
    try:
        model = prediction_tasks.cached_model("one", data)
        prediction_tasks.settle()  # freezes what is alive, once per model
        assert prediction_tasks.cached_model("one", data) is model
        assert gc.get_freeze_count() > 0
        other = prediction_tasks.cached_model("two", data)
        assert other is not model and prediction_tasks._CACHE["key"] == "two"
        assert gc.get_freeze_count() == 0  # unfrozen, so the old model can be collected
    finally:
        gc.unfreeze()
        prediction_tasks._CACHE.clear()
        prediction_tasks._CACHE.update(saved)


def test_a_batch_smaller_than_batch_size_is_padded_to_a_power_of_two_not_to_batch_size():
    """Every Arrow batch was padded to ``batch_size`` rows: ModelPredictor(batch_size=10**6)
    on batches of 37 rows ran the model on, and allocated, a million rows per batch (3 GB
    for 784 features). Keras's predict never pads beyond the data; here a batch smaller
    than ``batch_size`` is padded to the next power of two (few shapes to compile), and a
    larger one still to ``batch_size`` (one shape)."""
    import keras

    from distkeras.ml.prediction_tasks import predict_in_chunks

    calls = []

    class Recording(keras.Sequential):
        def predict_on_batch(self, x):
            calls.append(len(x))
            return super().predict_on_batch(x)

    keras.utils.set_random_seed(3)
    model = Recording([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])
    x = _features(8, 6)
    expected = model.predict(x, verbose=0)
    for batch_size, shapes in [(10 ** 6, [64]), (64, [64]), (37, [37]), (16, [16, 16, 16]),
                               (1, [1] * ROWS)]:
        calls.clear()
        (predicted,) = predict_in_chunks(model, [x], batch_size)
        assert calls == shapes, batch_size
        np.testing.assert_allclose(predicted, expected, atol=1e-6)
    calls.clear()
    predict_in_chunks(model, [x[:5]], 1024)
    assert calls == [8]


def test_predicts_a_streaming_dataframe_as_spark_models_transform_one(spark, tmp_path):
    """Spark's models transform a streaming DataFrame; KerasModel and ModelPredictor read
    its first row on the driver (``first()``), which Spark refuses for a stream ("Queries
    with streaming sources must be executed with writeStream.start()"). A stream's rows
    are now checked by the tasks, as a batch DataFrame's later rows are."""
    from pyspark.ml.linalg import Vectors

    from distkeras.ml.estimators import KerasModel
    from distkeras.transformers import LabelIndexTransformer

    model = _mlp((4,), seed=9)
    x = _features(9, 4)
    rows = [(i, Vectors.dense(row.tolist())) for i, row in enumerate(x)]
    spark.createDataFrame(rows, ["id", "features"]).write.parquet(str(tmp_path / "in"))
    batch = spark.read.parquet(str(tmp_path / "in"))
    stream = spark.readStream.schema(batch.schema).parquet(str(tmp_path / "in"))
    predicted = LabelIndexTransformer(3).transform(KerasModel(model).transform(stream))
    query = predicted.writeStream.format("memory").queryName("streamed_predictions").start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    _, predictions = _predictions(spark.table("streamed_predictions"))
    np.testing.assert_allclose(predictions, model.predict(x, verbose=0), atol=1e-5)


def test_predictor_errors_name_the_column(spark):
    from distkeras.predictors import ModelPredictor

    model = _mlp((6,), seed=1)
    frame = spark.createDataFrame([(0, [1.0, 2.0, 3.0], [0.0])],
                                  ["id", "features", "prediction"])
    with pytest.raises(ValueError, match="'missing'.*not in the DataFrame"):
        ModelPredictor(model, features_col="missing", output_col="out").predict(frame)
    with pytest.raises(ValueError, match="'prediction' is already in the DataFrame"):
        ModelPredictor(model).predict(frame)
    with pytest.raises(ValueError, match="'Prediction' is already in the DataFrame \\(as "
                                         "'prediction'"):
        ModelPredictor(model, output_col="Prediction").predict(frame)
    with pytest.raises(ValueError, match="batch_size"):
        ModelPredictor(model, output_col="out", batch_size=0).predict(frame)
    # Rows every task would fail on are refused from the first row, before any job runs.
    with pytest.raises(ValueError, match=r"Column 'features' holds 3 values per row but the "
                                         r"model's input expects shape \(6,\)"):
        ModelPredictor(model, output_col="out").predict(frame)
    holed = spark.createDataFrame([(0, None)], "id int, features array<float>")
    with pytest.raises(ValueError, match=r"Column 'features' holds null values \(its first "
                                         r"row is null\); drop or fill them first"):
        ModelPredictor(model).predict(holed)


# -- evaluators ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scored(spark):
    rows = [  # prediction, one-hot label, label index, prediction index
        ([0.7, 0.2, 0.1], [1.0, 0.0, 0.0], 0, 0.0),
        ([0.1, 0.3, 0.6], [0.0, 1.0, 0.0], 1, 2.0),
        ([0.0, 0.0, 1.0], [0.0, 0.0, 1.0], 2, 2.0),
        ([0.2, 0.5, 0.3], [0.0, 1.0, 0.0], 1, 1.0),
    ]
    return spark.createDataFrame(rows, ["prediction", "label", "label_index",
                                        "prediction_index"]).coalesce(1)


def test_accuracy_evaluator(scored):
    from distkeras.evaluators import AccuracyEvaluator

    assert AccuracyEvaluator().evaluate(scored) == 0.75  # indices against indices
    # Prediction vectors and one-hot labels count by their argmax: the same three rows.
    assert AccuracyEvaluator("prediction", "label").evaluate(scored) == 0.75
    assert AccuracyEvaluator("prediction", "label_index").evaluate(scored) == 0.75
    assert AccuracyEvaluator("label", "label_index").evaluate(scored) == 1.0
    assert AccuracyEvaluator().isLargerBetter()
    with pytest.raises(ValueError, match="'wrong'.*not in the DataFrame"):
        AccuracyEvaluator(label_col="wrong").evaluate(scored)
    with pytest.raises(ValueError, match="empty"):
        AccuracyEvaluator().evaluate(scored.limit(0))


def test_evaluators_are_configured_with_chained_setters_as_spark_evaluators_are(scored):
    from distkeras.evaluators import AccuracyEvaluator, LossEvaluator

    accuracy = AccuracyEvaluator().setPredictionCol("prediction").setLabelCol("label")
    assert accuracy.evaluate(scored) == 0.75
    loss = LossEvaluator().setLoss("sparse_categorical_crossentropy") \
        .setPredictionCol("prediction").setLabelCol("label_index")
    expected = -np.mean(np.log([0.7, 0.3, 1.0 - 1e-7, 0.5]))
    assert loss.evaluate(scored) == pytest.approx(expected, rel=1e-6)


def test_accuracy_evaluator_thresholds_one_unit_sigmoid_outputs(spark):
    from distkeras.evaluators import AccuracyEvaluator

    # A Dense(1, "sigmoid") model's predictions (1-element arrays) against 0/1 labels, as
    # scalars and as 1-element arrays: Keras's binary accuracy (threshold 0.5), not argmax.
    rows = [([0.9], 1, [1.0]), ([0.8], 1, [1.0]), ([0.7], 0, [0.0]), ([0.2], 0, [0.0])]
    frame = spark.createDataFrame(rows, "prediction array<float>, label int, "
                                        "label_array array<float>")
    assert AccuracyEvaluator("prediction", "label").evaluate(frame) == 0.75
    assert AccuracyEvaluator("prediction", "label_array").evaluate(frame) == 0.75
    # The same probabilities as numbers are no class indices: they never equalled a label
    # (an accuracy of 0.0, silently), and now stop with the column named.
    numbers = frame.withColumn("probability", frame.prediction[0])
    with pytest.raises(Exception, match="'probability' holds a fractional number"):
        AccuracyEvaluator("probability", "label").evaluate(numbers)



def test_accuracy_evaluator_thresholds_logits_at_zero_with_from_logits(spark):
    """A Dense(1) model trained with BinaryCrossentropy(from_logits=True) predicts logits:
    thresholded at 0.5, a logit of 0.3 (probability 0.57) counted as class 0, silently.
    ``from_logits=True`` scores them as BinaryAccuracy(threshold=0.0), one unit or several
    (multi_label); the argmax of several logits is left as it is."""
    import keras

    from distkeras.evaluators import AccuracyEvaluator

    logits = np.array([[0.3, -2.0], [-0.2, 0.4], [2.5, 0.1], [-1.5, -0.1]], "float32")
    labels = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]], "float32")
    frame = spark.createDataFrame(
        [(z[:1].tolist(), float(y[0]), z.tolist(), y.tolist())
         for z, y in zip(logits, labels)],
        "unit array<float>, label double, logits array<float>, labels array<float>")

    def binary_accuracy(y, z):
        metric = keras.metrics.BinaryAccuracy(threshold=0.0)
        metric.update_state(y, z)
        return float(metric.result())

    one = binary_accuracy(labels[:, :1], logits[:, :1])
    assert AccuracyEvaluator("unit", "label", from_logits=True).evaluate(frame) == one == 1.0
    assert AccuracyEvaluator("unit", "label").evaluate(frame) == 0.75  # 0.3 read as 0
    several = binary_accuracy(labels, logits)
    assert AccuracyEvaluator("logits", "labels", multi_label=True).setFromLogits(True) \
        .evaluate(frame) == pytest.approx(several)
    argmax = float(np.mean(keras.metrics.categorical_accuracy(labels, logits)))
    assert AccuracyEvaluator("logits", "labels", from_logits=True).evaluate(frame) == argmax


def test_accuracy_evaluator_reads_one_element_label_arrays_as_their_class(spark):
    """Labels of shape (n, 1), as CIFAR-10's, written as one-element arrays: against class
    indices (LabelIndexTransformer's output) each was thresholded as a sigmoid label, so
    [2] counted as class 1 and the accuracy was wrong, silently."""
    import keras

    from distkeras.evaluators import AccuracyEvaluator

    probabilities = np.array([[0.1, 0.2, 0.7], [0.6, 0.3, 0.1], [0.2, 0.5, 0.3],
                              [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]], dtype="float32")
    labels = np.array([[2], [0], [1], [1], [2]])
    frame = spark.createDataFrame(
        [(p.tolist(), y.tolist(), int(p.argmax())) for p, y in zip(probabilities, labels)],
        "prediction array<float>, label array<int>, prediction_index int").repartition(3)
    metric = keras.metrics.SparseCategoricalAccuracy()
    metric.update_state(labels, probabilities)
    expected = float(metric.result())  # 0.8
    assert AccuracyEvaluator("prediction_index", "label").evaluate(frame) == \
        pytest.approx(expected, abs=1e-6)
    assert AccuracyEvaluator("prediction", "label").evaluate(frame) == \
        pytest.approx(expected, abs=1e-6)

def test_accuracy_evaluator_scores_multi_label_outputs_as_keras_binary_accuracy(spark):
    """Sigmoid outputs against multi-hot labels: the argmax compared each row's first
    label only (silently wrong). ``multi_label=True`` gives Keras's binary accuracy;
    without it, a multi-hot label stops the job with that advice."""
    import keras
    from pyspark.ml.functions import array_to_vector

    from distkeras.evaluators import AccuracyEvaluator

    rng = np.random.default_rng(5)
    probabilities = rng.random((8, 5)).astype("float32")
    labels = (rng.random((8, 5)) > 0.5).astype("float32")
    labels[0] = 0.0  # a row with no label at all
    expected = float(np.mean(keras.metrics.binary_accuracy(labels, probabilities)))
    frame = spark.createDataFrame(
        [(p.tolist(), y.tolist()) for p, y in zip(probabilities, labels)],
        "prediction array<float>, label array<float>")
    frame = frame.withColumn("label_vector", array_to_vector("label"))
    for label_col in ("label", "label_vector"):
        evaluator = AccuracyEvaluator("prediction", label_col, multi_label=True)
        assert evaluator.evaluate(frame) == pytest.approx(expected, rel=1e-6)
    assert AccuracyEvaluator("prediction", "label").setMultiLabel(True).getMultiLabel()
    with pytest.raises(Exception, match="multi-hot labels.*multi_label=True"):
        AccuracyEvaluator("prediction", "label").evaluate(frame)
    # One-hot and soft labels still count by their argmax.
    one_hot = np.eye(5, dtype="float32")[np.argmax(labels + 0.1 * probabilities, axis=1)]
    soft = 0.9 * one_hot + 0.02
    rows = spark.createDataFrame(
        [(p.tolist(), y.tolist(), s.tolist()) for p, y, s in zip(probabilities, one_hot, soft)],
        "prediction array<float>, one_hot array<float>, soft array<float>")
    argmax_accuracy = float(np.mean(np.argmax(probabilities, 1) == np.argmax(one_hot, 1)))
    assert AccuracyEvaluator("prediction", "one_hot").evaluate(rows) == argmax_accuracy
    assert AccuracyEvaluator("prediction", "soft").evaluate(rows) == argmax_accuracy
    short = spark.createDataFrame([([0.5, 0.5, 0.5], [1.0, 0.0])],
                                  "prediction array<float>, label array<float>")
    with pytest.raises(Exception, match="differ in length"):
        AccuracyEvaluator("prediction", "label", multi_label=True).evaluate(short)


def test_loss_evaluator_matches_hand_computed_values(scored, spark):
    from distkeras.evaluators import LossEvaluator

    # Keras clips float32 predictions: to the float32 values of 1e-7 and 1 - 1e-7.
    low, high = float(np.float32(1e-7)), float(np.float32(1 - 1e-7))
    clip = lambda p: min(max(p, low), high)  # noqa: E731
    cce = -(math.log(0.7) + math.log(0.3) + math.log(clip(1.0)) + math.log(0.5)) / 4
    assert LossEvaluator().evaluate(scored) == pytest.approx(cce, rel=1e-9)
    sparse = LossEvaluator("sparse_categorical_crossentropy", label_col="label_index")
    assert sparse.evaluate(scored) == pytest.approx(cce, rel=1e-9)
    mse = np.mean([np.mean((np.array(p) - np.array(y)) ** 2) for p, y in [
        ([0.7, 0.2, 0.1], [1, 0, 0]), ([0.1, 0.3, 0.6], [0, 1, 0]),
        ([0.0, 0.0, 1.0], [0, 0, 1]), ([0.2, 0.5, 0.3], [0, 1, 0])]])
    assert LossEvaluator("mse").evaluate(scored) == pytest.approx(mse, rel=1e-9)
    assert not LossEvaluator().isLargerBetter()

    # Like Keras, categorical cross-entropy first scales each prediction to sum to 1.
    unscaled = spark.createDataFrame([([2.0, 6.0], [0.0, 1.0])], ["prediction", "label"])
    assert LossEvaluator().evaluate(unscaled) == pytest.approx(-math.log(0.75), rel=1e-9)

    binary = spark.createDataFrame([(0.9, 1.0), (0.2, 0.0), (0.0, 1.0)], ["p", "y"])
    bce = -(math.log(0.9) + math.log(0.8) + math.log(low)) / 3
    assert LossEvaluator("binary_crossentropy", "p", "y").evaluate(binary) == \
        pytest.approx(bce, rel=1e-9)
    assert LossEvaluator("mse", "p", "y").evaluate(binary) == \
        pytest.approx((0.01 + 0.04 + 1.0) / 3, rel=1e-9)


def test_loss_evaluator_refuses_fractional_class_indices(spark):
    """Refused on the driver, as a ValueError that counts the rows: a row that cannot be
    scored stopped the Spark job, whose task Spark ran 4 times (reading, or predicting,
    the partition again each time) before a Java trace holding the message."""
    from distkeras.evaluators import LossEvaluator

    frame = spark.createDataFrame([([0.2, 0.8], 1.7), ([0.2, 0.8], 1.0), ([0.5, 0.5], 0.5)],
                                  ["prediction", "label"])
    sparse = LossEvaluator("sparse_categorical_crossentropy")
    with pytest.raises(ValueError, match=r"holds a class index that is null, fractional or "
                                         r"outside .* \(2 rows in all.\)$"):
        sparse.evaluate(frame)  # truncating 1.7 to class 1 would score a wrong label


def test_loss_evaluator_names_null_rows(spark):
    """A null row was left out of the mean unsaid (numbers), or blamed on the label
    (a null prediction: "a class index that is null, fractional or outside...") or on the
    lengths (arrays)."""
    from distkeras.evaluators import LossEvaluator

    numbers = spark.createDataFrame([(0.5, 1.0), (None, 0.0), (0.25, None)],
                                    "prediction double, label double")
    arrays = spark.createDataFrame([([0.2, 0.8], [0.0, 1.0], 1), (None, [1.0, 0.0], 0)],
                                   "prediction array<float>, one_hot array<float>, label int")
    # Every row but the null one is valid: Spark may run the rows' tasks in any order.
    one_unit = spark.createDataFrame([([0.8], 1), (None, 0)], "prediction array<float>, label int")
    for evaluator, frame in [(LossEvaluator("mse"), numbers),
                             (LossEvaluator("sparse_categorical_crossentropy"), arrays),
                             (LossEvaluator("categorical_crossentropy", label_col="one_hot"),
                              arrays),
                             (LossEvaluator("binary_crossentropy"), one_unit)]:
        with pytest.raises(ValueError, match="LossEvaluator: column '(prediction|label|one_hot)"
                                            "' holds null rows; drop them first"):
            evaluator.evaluate(frame)
    assert LossEvaluator("mse").evaluate(numbers.dropna()) == 0.25


def test_evaluators_name_a_null_prediction_or_label_as_the_training_feed_does(spark):
    """AccuracyEvaluator counted a null prediction or label as wrong (a left join's missing
    predictions gave 1/3 here, silently), where LossEvaluator refused them; a null inside
    an array was read past (an accuracy of 1.0) or left out of the mean unsaid. Both now
    stop, naming the column and the rows to drop."""
    from distkeras.evaluators import AccuracyEvaluator, LossEvaluator

    rows = spark.createDataFrame(
        [([0.7, 0.3], 0, [1.0, 0.0]), (None, 1, [0.0, 1.0]), ([0.2, 0.8], None, None)],
        "prediction array<float>, label int, one_hot array<float>")
    for label_col in ("label", "one_hot"):
        with pytest.raises(ValueError, match=r"AccuracyEvaluator: column '(prediction|"
                                            f"{label_col})' holds null rows; drop them first, "
                                            r"for example `dataset.dropna\(subset="):
            AccuracyEvaluator("prediction", label_col).evaluate(rows)
    with pytest.raises(ValueError, match="AccuracyEvaluator: column 'prediction' holds null"):
        AccuracyEvaluator("prediction", "one_hot", multi_label=True).evaluate(
            rows.dropna(subset=["one_hot"]))
    assert AccuracyEvaluator("prediction", "label").evaluate(
        rows.dropna(subset=["prediction", "label"])) == 1.0

    inside = spark.createDataFrame([([0.7, None], 1, [0.0, 1.0]), ([0.2, 0.8], 1, [0.0, None])],
                                   "prediction array<float>, label int, one_hot array<float>")
    for evaluator, frame in [(AccuracyEvaluator("prediction", "label"), inside.limit(1)),
                             (LossEvaluator("mse", label_col="one_hot"), inside),
                             (LossEvaluator("sparse_categorical_crossentropy"), inside.limit(1))]:
        with pytest.raises(ValueError, match="Evaluator: column '(prediction|one_hot)' holds "
                                            "arrays with a null value; drop those rows"):
            evaluator.evaluate(frame)


def test_evaluators_weigh_rows_as_keras_evaluate_with_sample_weight(spark):
    """Neither evaluator took per-row weights: a model trained with
    ``sample_weight_col`` could not be scored as ``evaluate(x, y, sample_weight=w)``
    scores it. ``weight_col`` gives evaluate's loss (``sum(w * loss) / rows``) and its
    weighted accuracy (``sum(w * right) / sum(w)``)."""
    import keras
    from pyspark.sql import functions as F

    from distkeras.evaluators import AccuracyEvaluator, LossEvaluator

    rng = np.random.default_rng(11)
    x = rng.normal(size=(40, 4)).astype("float32")
    y = rng.integers(0, 3, 40)
    w = rng.random(40).astype("float32")
    keras.utils.set_random_seed(11)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(loss="sparse_categorical_crossentropy", weighted_metrics=["accuracy"])
    expected = model.evaluate(x, y, sample_weight=w, batch_size=16, verbose=0,
                              return_dict=True)
    frame = spark.createDataFrame(
        [(p.tolist(), int(label), float(weight))
         for p, label, weight in zip(model.predict(x, verbose=0), y, w)],
        "prediction array<float>, label int, weight double").coalesce(1)

    loss = LossEvaluator("sparse_categorical_crossentropy", weight_col="weight")
    assert loss.evaluate(frame) == pytest.approx(expected["loss"], rel=1e-5)
    accuracy = AccuracyEvaluator("prediction", "label").setWeightCol("weight")
    assert accuracy.evaluate(frame) == pytest.approx(expected["accuracy"], rel=1e-5)
    with pytest.raises(Exception, match="column 'weight' holds null rows"):
        loss.evaluate(frame.withColumn("weight", F.when(frame.label != 0, frame.weight)))

def test_loss_evaluator_agrees_with_keras(scored):
    import keras

    from distkeras.evaluators import LossEvaluator

    rows = scored.collect()
    y = np.array([row.label for row in rows], dtype="float32")
    p = np.array([row.prediction for row in rows], dtype="float32")
    for name in ("categorical_crossentropy", "binary_crossentropy", "mse"):
        expected = float(keras.ops.mean(keras.losses.get(name)(y, p)))
        assert LossEvaluator(name).evaluate(scored) == pytest.approx(expected, rel=1e-4)


def test_loss_evaluator_computes_the_regression_losses_as_keras(spark):
    import keras

    from distkeras.evaluators import LossEvaluator

    rng = np.random.default_rng(9)
    y = rng.normal(scale=3.0, size=(12, 3)).astype("float32")
    p = (y + rng.normal(scale=2.0, size=y.shape)).astype("float32")  # errors above 1 too
    frame = spark.createDataFrame(
        [(a.tolist(), b.tolist(), float(a[0]), float(b[0])) for a, b in zip(y, p)],
        "label array<float>, prediction array<float>, label_1 double, prediction_1 double")
    for name in ("mse", "mae", "mean_absolute_error", "huber", "log_cosh"):
        expected = float(keras.ops.mean(keras.losses.get(name)(y, p)))
        assert LossEvaluator(name).evaluate(frame) == pytest.approx(expected, rel=1e-5), name
        one = float(keras.ops.mean(keras.losses.get(name)(y[:, :1], p[:, :1])))
        assert LossEvaluator(name, "prediction_1", "label_1").evaluate(frame) == \
            pytest.approx(one, rel=1e-5), name


def test_loss_evaluator_reads_one_unit_outputs_against_number_labels_as_keras(spark):
    import keras

    from distkeras.evaluators import LossEvaluator

    # A sigmoid output's predictions (one value per row) against 0/1 labels as numbers.
    predictions = np.array([[0.9], [0.2], [0.6], [0.05]], dtype="float32")
    labels = np.array([1.0, 0.0, 0.0, 1.0], dtype="float32")
    frame = spark.createDataFrame(
        [(row.tolist(), float(label)) for row, label in zip(predictions, labels)],
        "prediction array<float>, label double")
    for name in ("binary_crossentropy", "mse"):
        # fit reads (n,) labels against (n, 1) outputs as (n, 1).
        expected = float(keras.ops.mean(keras.losses.get(name)(labels[:, None], predictions)))
        assert LossEvaluator(name).evaluate(frame) == pytest.approx(expected, rel=1e-5)
    two_values = spark.createDataFrame([([0.1, 0.9], 1.0)], "prediction array<float>, "
                                                             "label double")
    with pytest.raises(Exception, match="must hold one value per row"):
        LossEvaluator("binary_crossentropy").evaluate(two_values)



def test_loss_evaluator_clips_saturated_predictions_as_keras(spark):
    """A saturated sigmoid (exactly 1.0 or 0.0, an overconfident model's float32 output)
    was clipped to 1 - 1e-7 in doubles: log(1 - p) gave -16.12 where Keras, clipping in
    float32 (1 - 2**-23), gives -15.94, so the mean was 0.04 above Keras's here."""
    import keras

    from distkeras.evaluators import LossEvaluator

    predictions = np.array([[0.0], [1.0], [0.5], [1.0], [0.0]], dtype="float32")
    labels = np.array([[0.0], [0.0], [1.0], [1.0], [1.0]], dtype="float32")
    frame = spark.createDataFrame(
        [(p.tolist(), y.tolist()) for p, y in zip(predictions, labels)],
        "prediction array<float>, label array<float>").repartition(3)
    expected = float(keras.ops.mean(keras.losses.binary_crossentropy(labels, predictions)))
    assert LossEvaluator("binary_crossentropy").evaluate(frame) == \
        pytest.approx(expected, rel=1e-6)
    one_hot = spark.createDataFrame([([0.0, 1.0], [1.0, 0.0]), ([1.0, 0.0], [1.0, 0.0])],
                                    "prediction array<float>, label array<float>")
    expected = float(keras.ops.mean(keras.losses.categorical_crossentropy(
        np.array([[1.0, 0.0], [1.0, 0.0]]), np.array([[0.0, 1.0], [1.0, 0.0]]))))
    assert LossEvaluator("categorical_crossentropy").evaluate(one_hot) == \
        pytest.approx(expected, rel=1e-6)

def test_loss_evaluator_reads_logits_as_keras_losses_with_from_logits(spark):
    """A model ending in Dense(k) without activation predicts logits: read as
    probabilities (clipped, scaled to sum to 1), its cross-entropy came out several times
    Keras's, without a word. ``from_logits=True`` reads them as its Keras loss does."""
    import keras

    from distkeras.evaluators import LossEvaluator

    rng = np.random.default_rng(11)
    logits = (rng.normal(scale=4.0, size=(8, 3)) - 2.0).astype("float32")  # many negative
    logits[0] = [90.0, -80.0, 0.0]  # a saturated row: no overflow, no clip
    classes = rng.integers(0, 3, 8)
    classes[0] = 1
    one_hot = np.eye(3, dtype="float32")[classes]
    frame = spark.createDataFrame(
        [(z.tolist(), int(k), y.tolist(), z[:1].tolist(), float(y[0]))
         for z, k, y in zip(logits, classes, one_hot)],
        "prediction array<float>, class long, label array<float>, unit array<float>, "
        "binary double")

    def keras_loss(loss, y, z):
        return float(keras.ops.mean(loss(from_logits=True)(y, z)))

    expected = {
        "categorical_crossentropy": keras_loss(keras.losses.CategoricalCrossentropy,
                                               one_hot, logits),
        "binary_crossentropy": keras_loss(keras.losses.BinaryCrossentropy, one_hot, logits)}
    for name, value in expected.items():
        assert LossEvaluator(name, from_logits=True).evaluate(frame) == \
            pytest.approx(value, rel=1e-5), name
        assert LossEvaluator(name).evaluate(frame) != pytest.approx(value, rel=0.1)
    sparse = keras_loss(keras.losses.SparseCategoricalCrossentropy, classes, logits)
    assert LossEvaluator("sparse_categorical_crossentropy", label_col="class",
                         from_logits=True).evaluate(frame) == pytest.approx(sparse, rel=1e-5)
    # One logit per row (Dense(1)) against 0/1 numbers, as fit reads them.
    unit = keras_loss(keras.losses.BinaryCrossentropy, one_hot[:, :1], logits[:, :1])
    assert LossEvaluator("binary_crossentropy", "unit", "binary").setFromLogits(True) \
        .evaluate(frame) == pytest.approx(unit, rel=1e-5)

    # A tagger's logits, (steps, classes) flattened, per step.
    steps = logits.reshape(4, 2, 3)
    tags = classes.reshape(4, 2)
    tagged = spark.createDataFrame(
        [(z.reshape(-1).tolist(), k.tolist(), np.eye(3)[k].tolist())
         for z, k in zip(steps, tags)],
        "prediction array<float>, label array<int>, one_hot array<array<float>>")
    sparse = keras_loss(keras.losses.SparseCategoricalCrossentropy, tags, steps)
    assert LossEvaluator("sparse_categorical_crossentropy", from_logits=True) \
        .evaluate(tagged) == pytest.approx(sparse, rel=1e-5)
    categorical = keras_loss(keras.losses.CategoricalCrossentropy, np.eye(3)[tags], steps)
    assert LossEvaluator("categorical_crossentropy", label_col="one_hot", from_logits=True) \
        .evaluate(tagged) == pytest.approx(categorical, rel=1e-5)

    with pytest.raises(ValueError, match="not to mse"):
        LossEvaluator("mean_squared_error", from_logits=True).evaluate(frame)


def test_loss_evaluator_errors(scored):
    from distkeras.evaluators import LossEvaluator

    with pytest.raises(ValueError, match="`loss` must be one of"):
        LossEvaluator("hinge").evaluate(scored)
    with pytest.raises(ValueError, match="'nope'"):
        LossEvaluator(prediction_col="nope").evaluate(scored)
    with pytest.raises(TypeError, match="class indices"):
        LossEvaluator("sparse_categorical_crossentropy").evaluate(scored)
    with pytest.raises(TypeError, match="both hold arrays"):
        LossEvaluator(label_col="label_index").evaluate(scored)


def test_inputs_typed_as_integers_are_predicted_from_exact_ids(spark):
    import keras

    from custom_objects_support import Parity
    from distkeras.predictors import ModelPredictor

    ids = [2**24 + 1, 2**24, 3, 2**24 + 2]
    frame = spark.createDataFrame([(value,) for value in ids], "id long")
    inputs = keras.Input((1,), dtype="int32")
    model = keras.Model(inputs, Parity()(inputs))
    rows = ModelPredictor(model, features_col="id").predict(frame).collect()
    # Through float32, 2**24 + 1 became 2**24: even.
    assert {row["id"]: row["prediction"] for row in rows} == \
        {value: [float(value % 2)] for value in ids}


def test_evaluators_score_a_tagger_per_step_as_keras(spark):
    """A tagger's predictions (steps x classes, flattened by ModelPredictor) against one
    class index per step: AccuracyEvaluator compared the argmax of the whole flattened
    array with the argmax of the label array (silently wrong), and LossEvaluator refused
    the labels, calling them one-hot."""
    import keras

    from distkeras.evaluators import AccuracyEvaluator, LossEvaluator

    rng = np.random.default_rng(3)
    steps, classes, rows = 4, 3, 6
    probabilities = rng.random((rows, steps, classes)).astype("float32")
    probabilities /= probabilities.sum(-1, keepdims=True)
    labels = rng.integers(0, classes, (rows, steps))
    frame = spark.createDataFrame(
        [(p.reshape(-1).tolist(), y.tolist()) for p, y in zip(probabilities, labels)],
        "prediction array<float>, label array<int>")
    accuracy = float(np.mean(keras.metrics.sparse_categorical_accuracy(labels, probabilities)))
    loss = float(keras.ops.mean(keras.losses.sparse_categorical_crossentropy(
        labels, probabilities)))
    assert AccuracyEvaluator("prediction", "label").evaluate(frame) == \
        pytest.approx(accuracy, rel=1e-6)
    assert LossEvaluator("sparse_categorical_crossentropy").evaluate(frame) == \
        pytest.approx(loss, rel=1e-4)
    seven = spark.createDataFrame([([0.5] * 7, [0, 1])], "prediction array<float>, "
                                                         "label array<int>")
    with pytest.raises(Exception, match="not a whole number of steps"):
        AccuracyEvaluator("prediction", "label").evaluate(seven)


def test_evaluators_read_a_taggers_one_hot_labels_per_step_as_keras(spark):
    """One-hot labels per step (``array<array<float>>``, as the trainers take them for a
    tagger) were refused by both evaluators."""
    import keras

    from distkeras.evaluators import AccuracyEvaluator, LossEvaluator

    rng = np.random.default_rng(4)
    steps, classes, rows = 3, 4, 5
    probabilities = rng.random((rows, steps, classes)).astype("float32")
    probabilities /= probabilities.sum(-1, keepdims=True)
    one_hot = np.eye(classes, dtype="float32")[rng.integers(0, classes, (rows, steps))]
    frame = spark.createDataFrame(
        [(p.reshape(-1).tolist(), y.tolist()) for p, y in zip(probabilities, one_hot)],
        "prediction array<float>, label array<array<float>>")
    accuracy = float(np.mean(keras.metrics.categorical_accuracy(one_hot, probabilities)))
    assert AccuracyEvaluator("prediction", "label").evaluate(frame) == \
        pytest.approx(accuracy, rel=1e-6)
    for name in ("categorical_crossentropy", "mse"):
        expected = float(keras.ops.mean(keras.losses.get(name)(one_hot, probabilities)))
        assert LossEvaluator(name).evaluate(frame) == pytest.approx(expected, rel=1e-4)


def test_predicts_from_parquet_holding_spark_ml_vectors(spark, tmp_path):
    """`VectorAssembler` output saved to Parquet and read back: Spark 4.3's columnar input
    to Arrow UDFs handed the vector column itself to Arrow, and every action on the
    predictions failed with UNSUPPORTED_DATATYPE."""
    import keras
    from pyspark.ml.feature import VectorAssembler

    from distkeras.ml.prediction_udf import COLUMNAR_UDF_INPUT
    from distkeras.predictors import ModelPredictor

    rows = spark.createDataFrame([(float(i), float(i % 3)) for i in range(40)],
                                 "a double, b double")
    VectorAssembler(inputCols=["a", "b"], outputCol="vec").transform(rows) \
        .write.parquet(str(tmp_path / "data.parquet"))
    spark.conf.set(COLUMNAR_UDF_INPUT, "true")  # Spark's default
    data = spark.read.parquet(str(tmp_path / "data.parquet"))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    predicted = ModelPredictor(model, features_col="vec").predict(data)
    predicted.write.parquet(str(tmp_path / "predicted.parquet"))
    written = spark.read.parquet(str(tmp_path / "predicted.parquet")).orderBy("a").collect()
    x = np.array([[row["a"], row["b"]] for row in written], np.float32)
    np.testing.assert_allclose([row["prediction"] for row in written],
                               model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    assert spark.conf.get(COLUMNAR_UDF_INPUT) == "false"


def test_a_string_features_column_is_refused_with_what_to_do(spark):
    import keras

    from distkeras.predictors import ModelPredictor

    frame = spark.createDataFrame([("red",)], "color string")
    model = keras.Sequential([keras.Input((1,), dtype="int32"), keras.layers.Embedding(4, 2),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    with pytest.raises(TypeError, match="has type string.*integer ids"):
        ModelPredictor(keras_model=model, features_col="color").predict(frame)


def test_output_type_vector_gives_dense_vectors_as_dist_keras(spark):
    from distkeras.predictors import ModelPredictor

    model = _mlp((6,), seed=1)
    x = _features(0, 6)
    frame = spark.createDataFrame(
        [(i, x[i].tolist()) for i in range(ROWS)], "id int, features array<float>")
    out = ModelPredictor(model, batch_size=8, output_type="vector").predict(frame)
    assert out.schema["prediction"].dataType.simpleString() == "vector"
    rows = out.orderBy("id").collect()
    np.testing.assert_allclose(np.array([row.prediction.toArray() for row in rows]),
                               model.predict(x, verbose=0), atol=1e-5)
    with pytest.raises(ValueError, match="output_type"):
        ModelPredictor(model, output_type="list").predict(frame)


def test_each_python_worker_rebuilds_the_model_once_for_all_its_partitions(spark):
    """The model is rebuilt (and compiled) once per Python worker process, not per task:
    the 8 partitions of one call and the next call with the same model reuse it."""
    from distkeras.predictors import ModelPredictor

    def builds():
        def report(batches):
            import os

            import pyarrow as pa

            from distkeras.ml import prediction_tasks

            for _ in batches:
                pass
            yield pa.RecordBatch.from_pydict({"pid": [os.getpid()],
                                              "builds": [prediction_tasks._CACHE.get("builds", 0)]})

        rows = spark.range(0, 16, 1, 16).mapInArrow(report, "pid long, builds long").collect()
        return {row["pid"]: row["builds"] for row in rows}

    model = _mlp((6,), seed=11)
    x = _features(11, 6)
    frame = spark.createDataFrame([(i, x[i].tolist()) for i in range(ROWS)],
                                  ["id", "features"]).repartition(8)
    assert frame.rdd.getNumPartitions() == 8
    before = builds()
    for _ in range(2):
        rows, predicted = _predictions(ModelPredictor(model, batch_size=8).predict(frame))
        np.testing.assert_allclose(predicted, model.predict(x, verbose=0), atol=1e-5)
    after = builds()
    rebuilt = {pid: count - before.get(pid, 0) for pid, count in after.items()}
    assert sum(rebuilt.values()) >= 1
    assert all(count <= 1 for count in rebuilt.values()), rebuilt


def test_predicting_batch_after_batch_traces_the_model_once_per_call_size():
    """A compiling backend traces (and compiles) the model once per input shape: every
    chunk of ``batch_size`` rows, the last one padded, reuses one trace; only a batch
    smaller than ``batch_size`` (padded to a power of two) adds one."""
    import keras

    from distkeras.ml.prediction_tasks import predict_in_chunks

    traces = []

    class Counted(keras.layers.Layer):
        def call(self, inputs):
            traces.append(tuple(inputs.shape))  # Python runs only when the model is traced
            return inputs

    keras.utils.set_random_seed(12)
    model = keras.Sequential([keras.Input((6,)), Counted(),
                              keras.layers.Dense(3, activation="softmax")])
    x = np.random.default_rng(12).normal(size=(1000, 6)).astype("float32")
    expected = model.predict(x, batch_size=64, verbose=0)
    model.predict_function = None  # the model's own predict traced it: start afresh
    traces.clear()
    for rows in (1000, 999, 64, 130, 1000):  # 16 chunks of 64, the last padded, ...
        (predicted,) = predict_in_chunks(model, [x[:rows]], 64)
        np.testing.assert_allclose(predicted, expected[:rows], atol=1e-6)
    assert traces == [(64, 6)]
    predict_in_chunks(model, [x[:5]], 64)  # a batch of 5 rows: one call of 8
    predict_in_chunks(model, [x[:7]], 64)
    assert traces == [(64, 6), (8, 6)]
