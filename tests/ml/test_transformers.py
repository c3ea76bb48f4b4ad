"""Transformers on tiny DataFrames against hand-computed values, alone and in a saved Pipeline."""

import numpy as np
import pytest

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def tiny(spark):
    from pyspark.ml.linalg import Vectors

    rows = [
        (0, 2, 1.0, [0.0, 5.0, 10.0, 2.0], Vectors.sparse(4, [1], [3.0]), "cat",
         [0.1, 0.7, 0.2]),
        (1, 0, 3.0, [1.0, 2.0, 3.0, 4.0], Vectors.dense([1.0, 2.0, 3.0, 4.0]), "dog",
         [0.4, 0.3, 0.3]),
        (2, 1, 5.0, [4.0, 4.0, 4.0, 4.0], Vectors.dense([0.0, 0.0, 0.0, 8.0]), "cat",
         [0.0, 0.2, 0.8]),
    ]
    return spark.createDataFrame(rows, ["id", "idx", "s", "a", "v", "c", "p"]).coalesce(1)


def _column(dataframe, name):
    rows = dataframe.orderBy("id").select(name).collect()
    return [row[0] for row in rows]


def _dense(values):
    return [list(value.toArray()) if hasattr(value, "toArray") else value for value in values]


def test_one_hot(tiny):
    from distkeras.transformers import OneHotTransformer

    out = OneHotTransformer(3, input_col="idx", output_col="o").transform(tiny)
    assert out.schema["o"].dataType.simpleString() == "array<float>"
    assert _column(out, "o") == [[0, 0, 1], [1, 0, 0], [0, 1, 0]]
    assert out.columns == tiny.columns + ["o"]


def test_one_hot_rejects_an_index_out_of_range(tiny):
    from distkeras.transformers import OneHotTransformer

    with pytest.raises(Exception, match="not a class index in \\[0, 1\\]"):
        OneHotTransformer(2, input_col="idx", output_col="o").transform(tiny).collect()
    with pytest.raises(TypeError, match="'c'"):
        OneHotTransformer(2, input_col="c", output_col="o").transform(tiny)


def test_min_max_on_arrays_vectors_and_numbers(tiny):
    from pyspark.ml.linalg import DenseVector, VectorUDT

    from distkeras.transformers import MinMaxTransformer

    arrays = MinMaxTransformer(0.0, 10.0, -1.0, 1.0, input_col="a", output_col="o")
    np.testing.assert_allclose(_column(arrays.transform(tiny), "o"), [
        [-1.0, 0.0, 1.0, -0.6], [-0.8, -0.6, -0.4, -0.2], [-0.2, -0.2, -0.2, -0.2]],
        rtol=1e-6)
    vectors = MinMaxTransformer(0.0, 8.0, 0.0, 1.0, input_col="v", output_col="o")
    out = vectors.transform(tiny)
    # Vectors in, dense vectors out (as Spark's MinMaxScaler and dist-keras's).
    assert isinstance(out.schema["o"].dataType, VectorUDT)
    assert all(isinstance(value, DenseVector) for value in _column(out, "o"))
    np.testing.assert_allclose(_dense(_column(out, "o")), [
        [0.0, 0.375, 0.0, 0.0], [0.125, 0.25, 0.375, 0.5], [0.0, 0.0, 0.0, 1.0]])
    numbers = MinMaxTransformer(1.0, 5.0, 0.0, 100.0, input_col="s", output_col="o",
                                is_vector=False)
    assert _column(numbers.transform(tiny), "o") == [0.0, 50.0, 100.0]
    with pytest.raises(TypeError, match="is_vector=False"):
        MinMaxTransformer(1.0, 5.0, 0.0, 1.0, input_col="s", output_col="o").transform(tiny)
    with pytest.raises(ValueError, match="must differ"):
        MinMaxTransformer(1.0, 1.0, 0.0, 1.0, input_col="a", output_col="o").transform(tiny)


def test_standard_transformer_and_estimator(tiny):
    from distkeras.transformers import StandardEstimator, StandardTransformer

    given = StandardTransformer(input_col="a", output_col="o", mean=[1.0, 2.0, 3.0, 4.0],
                                std=[1.0, 1.0, 2.0, 0.5])
    np.testing.assert_allclose(_column(given.transform(tiny), "o"), [
        [-1.0, 3.0, 3.5, -4.0], [0.0, 0.0, 0.0, 0.0], [3.0, 2.0, 0.5, 0.0]])
    one_value = StandardTransformer(input_col="s", output_col="o", mean=3.0, std=2.0)
    assert _column(one_value.transform(tiny), "o") == [-1.0, 0.0, 1.0]

    fitted = StandardEstimator(input_col="a", output_col="o").fit(tiny)
    values = np.array([[0.0, 5.0, 10.0, 2.0], [1.0, 2.0, 3.0, 4.0], [4.0, 4.0, 4.0, 4.0]])
    np.testing.assert_allclose(fitted.getOrDefault("mean"), values.mean(0))
    np.testing.assert_allclose(fitted.getOrDefault("std"), values.std(0))  # population std
    np.testing.assert_allclose(_column(fitted.transform(tiny), "o"),
                               (values - values.mean(0)) / values.std(0), rtol=1e-5, atol=1e-6)
    scalar = StandardEstimator(input_col="s", output_col="o").fit(tiny)
    np.testing.assert_allclose(scalar.getOrDefault("std"), [np.std([1.0, 3.0, 5.0])])

    wrong_size = StandardTransformer(input_col="a", output_col="o", mean=[0.0] * 3,
                                     std=[1.0] * 3)
    with pytest.raises(Exception, match="length is not 3"):
        wrong_size.transform(tiny).collect()


def test_standard_estimator_gives_constant_features_unit_std(spark):
    from distkeras.transformers import StandardEstimator

    frame = spark.createDataFrame([([1.0, 2.0],), ([1.0, 4.0],)], ["x"])
    fitted = StandardEstimator(input_col="x", output_col="y").fit(frame)
    assert fitted.getOrDefault("std") == [1.0, 1.0]
    assert [row.y for row in fitted.transform(frame).collect()] == [[0.0, -1.0], [0.0, 1.0]]


def test_dense(tiny):
    from pyspark.ml.linalg import DenseVector, VectorUDT

    from distkeras.transformers import DenseTransformer

    out = DenseTransformer(input_col="v", output_col="o").transform(tiny)
    assert isinstance(out.schema["o"].dataType, VectorUDT)
    values = _column(out, "o")
    assert all(isinstance(value, DenseVector) for value in values)
    assert _dense(values) == [[0, 3, 0, 0], [1, 2, 3, 4], [0, 0, 0, 8]]


def test_reshape(tiny):
    from distkeras.transformers import ReshapeTransformer

    out = ReshapeTransformer(input_col="a", output_col="o", shape=(2, 2, 1)).transform(tiny)
    assert out.schema["o"].dataType.simpleString() == "array<array<array<float>>>"
    expected = np.array([[0.0, 5.0, 10.0, 2.0], [1.0, 2.0, 3.0, 4.0], [4.0, 4.0, 4.0, 4.0]])
    assert _column(out, "o") == expected.reshape(3, 2, 2, 1).tolist()
    from_vectors = ReshapeTransformer(input_col="v", output_col="o", shape=(2, 2))
    assert _column(from_vectors.transform(tiny), "o")[0] == [[0.0, 3.0], [0.0, 0.0]]
    with pytest.raises(Exception, match="not 6, the number of values in shape \\(2, 3\\)"):
        ReshapeTransformer(input_col="a", output_col="o", shape=(2, 3)).transform(tiny) \
            .collect()


def test_label_index(tiny):
    from distkeras.transformers import LabelIndexTransformer

    out = LabelIndexTransformer(3, input_col="p").transform(tiny)
    assert "prediction_index" in out.columns
    # Row 1: no value reaches 0.55, so the largest one wins (index 0).
    assert _column(out, "prediction_index") == [1.0, 0.0, 2.0]
    # The first value at or above the threshold wins, as in dist-keras.
    low = LabelIndexTransformer(3, input_col="p", output_col="o", default_index=2,
                                activation_threshold=0.0)
    assert _column(low.transform(tiny), "o") == [0.0, 0.0, 0.0]
    strict = LabelIndexTransformer(3, input_col="p", output_col="o", default_index=2,
                                   activation_threshold=0.75)
    assert _column(strict.transform(tiny), "o") == [1.0, 0.0, 2.0]
    zeros = tiny.sparkSession.createDataFrame([(0, [0.0, 0.0, 0.0])], ["id", "p"])
    assert _column(strict.transform(zeros), "o") == [2.0]  # nothing positive: default
    with pytest.raises(Exception, match="not output_dim=4"):
        LabelIndexTransformer(4, input_col="p").transform(tiny).collect()
    # One sigmoid unit: class 1 above 0.5 (a position would always be 0).
    sigmoid = tiny.sparkSession.createDataFrame([(0, [0.9]), (1, [0.3]), (2, [0.52])],
                                                ["id", "p"])
    assert _column(LabelIndexTransformer(1, input_col="p").transform(sigmoid),
                   "prediction_index") == [1.0, 0.0, 1.0]


def test_label_index_reads_logits_as_keras_accuracy_does(tiny):
    """Logits (no activation, a loss with from_logits=True): several pass 0.55 and all
    may be negative, so the probabilities' rule gave the first one past 0.55, or 0 for
    every row whose logits were all negative; Keras's accuracy takes the largest."""
    from distkeras.transformers import LabelIndexTransformer

    logits = np.array([[0.6, 1.2, -0.3], [-2.0, -0.5, -1.0], [-1.0, -3.0, 4.0]])
    frame = tiny.sparkSession.createDataFrame(
        [(row, values.tolist()) for row, values in enumerate(logits)], ["id", "p"])
    stage = LabelIndexTransformer(3, input_col="p", from_logits=True)
    assert stage.getFromLogits() is True
    assert _column(stage.transform(frame), "prediction_index") == \
        logits.argmax(axis=1).astype(float).tolist()  # [1, 1, 2]; the rule gave [0, 0, 2]
    one_unit = tiny.sparkSession.createDataFrame([(0, [0.3]), (1, [-0.2])], ["id", "p"])
    assert _column(LabelIndexTransformer(1, input_col="p", from_logits=True)
                   .transform(one_unit), "prediction_index") == [1.0, 0.0]


def test_binary_label(tiny):
    from distkeras.transformers import BinaryLabelTransformer

    out = BinaryLabelTransformer(input_col="c", output_col="o", label="cat").transform(tiny)
    assert out.schema["o"].dataType.simpleString() == "array<float>"
    assert _column(out, "o") == [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]
    numeric = BinaryLabelTransformer(input_col="idx", output_col="o", label=0).transform(tiny)
    assert _column(numeric, "o") == [[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]


def test_binary_label_names_a_label_of_another_type_than_its_column(tiny):
    """Spark cast the strings to numbers to compare them with a number, and failed the job
    on the first one that was not (CAST_INVALID_INPUT, naming neither column nor label)."""
    from pyspark.sql import functions as F

    from distkeras.transformers import BinaryLabelTransformer

    with pytest.raises(TypeError, match="column 'c' has type string but label=1 is a number"):
        BinaryLabelTransformer(input_col="c", output_col="o", label=1).transform(tiny)
    with pytest.raises(TypeError, match="column 'idx' has type bigint but label='cat'"):
        BinaryLabelTransformer(input_col="idx", output_col="o", label="cat").transform(tiny)
    flags = tiny.withColumn("flag", F.col("idx") == 0)  # booleans: True is 1
    out = BinaryLabelTransformer(input_col="flag", output_col="o", label=1).transform(flags)
    assert _column(out, "o") == [[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]


def test_missing_columns_and_params_are_named(tiny):
    from distkeras.transformers import DenseTransformer, OneHotTransformer

    with pytest.raises(ValueError, match="'nope'.*not in the DataFrame"):
        DenseTransformer(input_col="nope", output_col="o").transform(tiny)
    with pytest.raises(ValueError, match="outputDim"):
        OneHotTransformer(input_col="idx", output_col="o").transform(tiny)


def test_an_output_column_already_in_the_dataframe_is_refused_unless_it_is_the_input(tiny):
    """LabelIndexTransformer(..., output_col="label") replaced the labels with the
    predicted classes without a word (withColumn), which then scored an accuracy of 1.0;
    ModelPredictor and Spark's own stages refuse such a column. Replacing the input
    column itself is still done as asked."""
    from distkeras.transformers import LabelIndexTransformer, MinMaxTransformer

    with pytest.raises(ValueError, match="LabelIndexTransformer: column 'idx' is already in "
                                         "the DataFrame; pick another output_col"):
        LabelIndexTransformer(3, input_col="p", output_col="idx").transform(tiny)
    # Spark matches column names regardless of case: "IDX" would replace "idx" too.
    with pytest.raises(ValueError, match="column 'IDX' is already in the DataFrame \\(as "
                                         "'idx': Spark matches column names regardless"):
        LabelIndexTransformer(3, input_col="p", output_col="IDX").transform(tiny)
    in_place = MinMaxTransformer(0.0, 10.0, 0.0, 1.0, input_col="a", output_col="a")
    assert _column(in_place.transform(tiny), "a")[0] == pytest.approx([0.0, 0.5, 1.0, 0.2])
    in_place = MinMaxTransformer(0.0, 10.0, 0.0, 1.0, input_col="a", output_col="A")
    assert _column(in_place.transform(tiny), "A")[0] == pytest.approx([0.0, 0.5, 1.0, 0.2])


def test_every_stage_in_a_saved_and_reloaded_pipeline(tiny, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel

    from distkeras.transformers import (BinaryLabelTransformer, DenseTransformer,
                                        LabelIndexTransformer, MinMaxTransformer,
                                        OneHotTransformer, ReshapeTransformer,
                                        StandardEstimator)

    pipeline = Pipeline(stages=[
        OneHotTransformer(3, input_col="idx", output_col="one_hot"),
        MinMaxTransformer(1.0, 5.0, 0.0, 1.0, input_col="s", output_col="s01",
                          is_vector=False),
        StandardEstimator(input_col="a", output_col="a_std"),
        DenseTransformer(input_col="v", output_col="v_dense"),
        ReshapeTransformer(input_col="a", output_col="a_2x2", shape=(2, 2)),
        LabelIndexTransformer(3, input_col="p", output_col="p_index", default_index=1),
        BinaryLabelTransformer(input_col="c", output_col="is_dog", label="dog"),
    ])
    pipeline.fit(tiny).save(str(tmp_path / "model"))
    loaded = PipelineModel.load(str(tmp_path / "model"))
    assert [type(stage).__name__ for stage in loaded.stages] == [
        "OneHotTransformer", "MinMaxTransformer", "StandardTransformer", "DenseTransformer",
        "ReshapeTransformer", "LabelIndexTransformer", "BinaryLabelTransformer"]
    assert loaded.stages[5].getOrDefault("defaultIndex") == 1
    assert loaded.stages[0].getOrDefault("outputDim") == 3

    rows = loaded.transform(tiny).orderBy("id").collect()
    assert [row.one_hot for row in rows] == [[0, 0, 1], [1, 0, 0], [0, 1, 0]]
    assert [row.s01 for row in rows] == [0.0, 0.5, 1.0]
    values = np.array([[0.0, 5.0, 10.0, 2.0], [1.0, 2.0, 3.0, 4.0], [4.0, 4.0, 4.0, 4.0]])
    np.testing.assert_allclose([row.a_std for row in rows],
                               (values - values.mean(0)) / values.std(0), rtol=1e-5, atol=1e-6)
    assert _dense([row.v_dense for row in rows])[0] == [0, 3, 0, 0]
    assert rows[1].a_2x2 == [[1.0, 2.0], [3.0, 4.0]]
    assert [row.p_index for row in rows] == [1.0, 0.0, 2.0]  # row 1: largest value wins
    assert [row.is_dog for row in rows] == [[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]


def test_stages_are_configured_with_chained_setters_as_spark_stages_are(tiny):
    from distkeras.transformers import (BinaryLabelTransformer, LabelIndexTransformer,
                                        MinMaxTransformer, OneHotTransformer,
                                        ReshapeTransformer, StandardEstimator,
                                        StandardTransformer)

    # `VectorAssembler().setInputCols(...).setOutputCol(...)`: Spark users write our stages
    # the same way; each setter returns the stage.
    stages = [
        OneHotTransformer().setOutputDim(3).setInputCol("idx").setOutputCol("one_hot"),
        MinMaxTransformer().setOMin(1.0).setOMax(5.0).setNMin(0.0).setNMax(1.0)
        .setIsVector(False).setInputCol("s").setOutputCol("s01"),
        StandardTransformer().setMean(1.0).setStd(2.0).setInputCol("s").setOutputCol("s_std"),
        ReshapeTransformer().setShape((2, 2)).setInputCol("a").setOutputCol("a_2x2"),
        LabelIndexTransformer().setOutputDim(3).setDefaultIndex(1)
        .setActivationThreshold(0.9).setInputCol("p").setOutputCol("p_index"),
        BinaryLabelTransformer().setLabel("dog").setInputCol("c").setOutputCol("is_dog"),
    ]
    frame = tiny
    for stage in stages:
        frame = stage.transform(frame)
    frame = StandardEstimator().setInputCol("a").setOutputCol("a_std").fit(frame) \
        .transform(frame)
    rows = frame.orderBy("id").collect()
    assert [row.one_hot for row in rows] == [[0, 0, 1], [1, 0, 0], [0, 1, 0]]
    assert [row.s01 for row in rows] == [0.0, 0.5, 1.0]
    assert [row.s_std for row in rows] == [0.0, 1.0, 2.0]
    assert rows[1].a_2x2 == [[1.0, 2.0], [3.0, 4.0]]
    assert [row.p_index for row in rows] == [1.0, 0.0, 2.0]
    assert [row.is_dog for row in rows] == [[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]
    values = np.array([[0.0, 5.0, 10.0, 2.0], [1.0, 2.0, 3.0, 4.0], [4.0, 4.0, 4.0, 4.0]])
    np.testing.assert_allclose([row.a_std for row in rows],
                               (values - values.mean(0)) / values.std(0), rtol=1e-5, atol=1e-6)


def test_null_rows_stay_null_through_every_element_wise_transformer(spark):
    from distkeras.transformers import (DenseTransformer, LabelIndexTransformer,
                                        MinMaxTransformer, ReshapeTransformer,
                                        StandardTransformer)

    frame = spark.createDataFrame([(0, [1.0, 3.0]), (1, None)], "id int, a array<double>")
    stages = [DenseTransformer("a", "out"), ReshapeTransformer("a", "out", (2, 1)),
              LabelIndexTransformer(2, "a", "out"), MinMaxTransformer(0, 4, 0, 1, "a", "out"),
              StandardTransformer("a", "out", mean=[1.0, 1.0], std=[2.0, 2.0])]
    for stage in stages:  # a null row used to fail as "an array whose length is not 2"
        rows = sorted(stage.transform(frame).collect())
        assert rows[0]["out"] is not None and rows[1]["out"] is None, type(stage).__name__


def test_null_vectors_stay_null_through_every_element_wise_transformer(spark):
    """Spark's vector_to_array fails the job on a null vector (a JVM UDF error): every
    transformer that reads vectors failed so on a null row."""
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql.types import IntegerType, StructField, StructType

    from distkeras.transformers import (DenseTransformer, LabelIndexTransformer,
                                        MinMaxTransformer, ReshapeTransformer,
                                        StandardTransformer)

    frame = spark.createDataFrame([(0, Vectors.sparse(2, [1], [3.0])), (1, None)],
                                  StructType([StructField("id", IntegerType()),
                                              StructField("v", VectorUDT())]))
    stages = [DenseTransformer("v", "out"), ReshapeTransformer("v", "out", (2, 1)),
              LabelIndexTransformer(2, "v", "out"), MinMaxTransformer(0, 4, 0, 1, "v", "out"),
              StandardTransformer("v", "out", mean=[1.0, 1.0], std=[2.0, 2.0])]
    for stage in stages:
        rows = sorted(stage.transform(frame).collect())
        assert rows[0]["out"] is not None and rows[1]["out"] is None, type(stage).__name__
    assert list(sorted(MinMaxTransformer(0, 4, 0, 1, "v", "out").transform(frame).collect())[
        0]["out"].toArray()) == [0.0, 0.75]


def test_numpy_numbers_are_taken_as_parameters(spark):
    from distkeras.transformers import (MinMaxTransformer, OneHotTransformer,
                                        ReshapeTransformer, StandardTransformer)

    frame = spark.createDataFrame([([0.0, 2.0], 1)], "a array<double>, k int")
    scaled = MinMaxTransformer(np.float32(0), np.float64(2), np.int64(0), np.int32(1), "a", "m")
    assert scaled.transform(frame).first()["m"] == [0.0, 1.0]
    standard = StandardTransformer("a", "s", mean=np.float32(1),
                                   std=np.array([2.0, 2.0], np.float32))
    assert standard.transform(frame).first()["s"] == [-0.5, 0.5]
    assert OneHotTransformer(np.int64(3), "k", "o").transform(frame).first()["o"] == \
        [0.0, 1.0, 0.0]
    assert ReshapeTransformer("a", "r", np.array([2, 1])).transform(frame).first()["r"] == \
        [[0.0], [2.0]]
    with pytest.raises(TypeError, match="Expected an integer"):
        OneHotTransformer(2.5, "k", "o")


def test_standard_estimator_skips_nulls_and_names_what_it_cannot_fit(spark):
    from distkeras.transformers import StandardEstimator

    estimator = StandardEstimator(input_col="a", output_col="out")
    frame = spark.createDataFrame([([1.0, 2.0],), (None,), ([3.0, 6.0],)], "a array<double>")
    fitted = estimator.fit(frame)
    assert fitted.getOrDefault("mean") == [2.0, 4.0] and fitted.getOrDefault("std") == [1.0, 2.0]
    for rows, schema, message in [
        ([([1.0],), ([1.0, 2.0],)], "a array<double>", "arrays of different lengths"),
        ([([1.0, None],)], "a array<double>", "null values inside its arrays"),
        ([], "a array<double>", "has no rows"),
        ([(None,)], "a double", "has no rows"),
        # Spark's summarizer gives a NaN mean, which the fitted transformer refused as
        # "Invalid param value given for param mean. Expected a finite number".
        ([([1.0, float("nan")],), ([2.0, 3.0],)], "a array<double>", "NaN or infinite"),
        ([(1.0,), (float("inf"),)], "a double", "NaN or infinite"),
    ]:
        with pytest.raises(ValueError, match=message):
            estimator.fit(spark.createDataFrame(rows, schema))


# A value (not the default) for each Param of distkeras's stages; a new Param needs one here.
_PARAM_VALUES = {
    "inputCol": "in", "outputCol": "out", "predictionCol": "pred", "labelCol": "lab",
    "weightCol": "w", "featuresCol": "f", "outputDim": 7, "oMin": -1.0, "oMax": 2.0,
    "nMin": 0.5, "nMax": 3.0, "isVector": True, "mean": [1.0, 2.0], "std": [3.0],
    "shape": [2, 3], "defaultIndex": 4, "activationThreshold": 0.25, "fromLogits": True,
    "label": "cat", "columns": ["a", "b"], "suffix": "_n",
    "multiLabel": True, "loss": "mse", "batchSize": 8, "validation": 0.25, "shuffle": True,
    "classWeight": {1: 2.0}, "numEpoch": 3, "trainingBatchSize": 16,
    "workerOptimizer": "sgd", "learningRate": 0.5, "outputType": "vector",
}


def _stage_classes():
    """Every public pyspark.ml stage that distkeras defines."""
    import inspect

    from pyspark.ml.param import Params

    from distkeras.ml import (accuracy_evaluator, estimators, label_encoders, loss_evaluator,
                              reshapers, scalers)

    return [cls for module in (label_encoders, scalers, reshapers, accuracy_evaluator,
                               loss_evaluator, estimators)
            for name, cls in vars(module).items()
            if inspect.isclass(cls) and issubclass(cls, Params) and not name.startswith("_")
            and cls.__module__ == module.__name__]


@pytest.mark.parametrize("stage_class", _stage_classes(), ids=lambda cls: cls.__name__)
def test_every_param_of_every_stage_has_a_getter_as_spark_stages_do(stage_class):
    """Spark's stages have ``get<Param>`` for each Param (``OneHotTransformer.getOutputDim()``
    raised AttributeError); each returns the value set, as Spark's do."""
    stage = stage_class()
    assert stage.params
    for param in stage.params:
        assert param.name in _PARAM_VALUES, f"no test value for {param.name}"
        getter = "get" + param.name[0].upper() + param.name[1:]
        assert hasattr(stage, getter), f"{stage_class.__name__} has no {getter}()"
        stage.set(param, _PARAM_VALUES[param.name])
        assert getattr(stage, getter)() == _PARAM_VALUES[param.name], getter


def test_integer_params_refuse_infinite_and_nan_values_naming_the_param():
    """``OneHotTransformer(float("inf"))`` raised a bare OverflowError ("cannot convert
    float infinity to integer") and NaN a bare ValueError, naming no Param: the converter
    let them reach ``int()``. ``ReshapeTransformer(shape=784)`` raised "'int' object is
    not iterable" from its constructor, before the Param's converter could say what
    `shape` takes."""
    from distkeras.transformers import (LabelIndexTransformer, OneHotTransformer,
                                        ReshapeTransformer)

    for value in (float("inf"), float("-inf"), float("nan")):
        with pytest.raises(TypeError, match='param "outputDim". Expected an integer'):
            OneHotTransformer(value)
        with pytest.raises(TypeError, match='param "outputDim". Expected an integer'):
            LabelIndexTransformer().setOutputDim(value)
        with pytest.raises(TypeError, match='param "shape". Expected an integer'):
            ReshapeTransformer(shape=[28, value])
    with pytest.raises(TypeError, match='param "shape". Expected a list of integers. '
                                        'Received: 784'):
        ReshapeTransformer("a", "b", 784)


def test_label_index_refuses_an_output_dim_below_one_before_the_job(spark):
    """``LabelIndexTransformer(0)`` (or -1) was taken, and every row then failed the
    Spark job as "a prediction whose length is not output_dim=0", after Spark's retries:
    OneHotTransformer refuses such a size on the driver, as this one now does."""
    from distkeras.transformers import LabelIndexTransformer

    frame = spark.createDataFrame([([0.1, 0.9],)], "p array<double>")
    for size in (0, -1):
        with pytest.raises(ValueError, match=f"`output_dim` must be an integer >= 1. "
                                             f"Received: output_dim={size}"):
            LabelIndexTransformer(size, "p", "o").transform(frame)


def test_packing_a_null_row_names_the_column_and_what_to_do(spark):
    """A null row (or a null inside an array) failed the pack with "The column holds null
    arrays", naming no column, as a plain ValueError that Spark retried."""
    from distkeras.errors import InvalidDataError
    from distkeras.transformers import PackedTensorTransformer

    frame = spark.createDataFrame([([1.0, 2.0],), (None,)], "pixels array<double>")
    with pytest.raises(Exception, match=r"InvalidDataError: Column 'pixels' holds null "
                                        r"arrays.*dropna\(subset=\['pixels'\]\)"):
        PackedTensorTransformer("pixels", "packed").transform(frame).collect()
    assert issubclass(InvalidDataError, ValueError)


@pytest.mark.parametrize("stage_class", _stage_classes(), ids=lambda cls: cls.__name__)
def test_every_stage_sets_params_with_set_params_as_spark_stages_do(stage_class):
    """Spark's stages take ``stage.setParams(inputCol=..., outputCol=...)``; distkeras's
    raised AttributeError. It sets the Params named (Spark's names), returns the stage, and
    a name that is no Param of it is refused, listing those there are."""
    stage = stage_class()
    values = {param.name: _PARAM_VALUES[param.name] for param in stage.params}
    assert stage.setParams(**values) is stage
    for name, value in values.items():
        assert stage.getOrDefault(name) == value, name
    with pytest.raises(ValueError, match=f"{stage_class.__name__} has no Param 'input_col'; "
                                         "its Params are \\["):
        stage.setParams(input_col="x")


# dist-keras's constructors, each argument by name and by position, as its source had them.
DIST_KERAS_SIGNATURES = [
    ("MinMaxTransformer", ["o_min", "o_max", "n_min", "n_max", "input_col", "output_col",
                           "is_vector"], [0.0, 255.0, 0.0, 1.0, "a", "o", True]),
    ("BinaryLabelTransformer", ["input_column", "output_column", "label"], ["c", "o", "cat"]),
    ("StandardTransformer", ["columns", "suffix"], [["s", "id"], "_n"]),
    ("DenseTransformer", ["input_col", "output_col"], ["v", "o"]),
    ("ReshapeTransformer", ["input_col", "output_col", "shape"], ["a", "o", (2, 2)]),
    ("OneHotTransformer", ["output_dim", "input_col", "output_col"], [3, "idx", "o"]),
    ("LabelIndexTransformer", ["output_dim", "input_col", "output_col", "default_index",
                               "activation_threshold"], [3, "p", "o", 1, 0.6]),
]


@pytest.mark.parametrize("name,arguments,values", DIST_KERAS_SIGNATURES,
                         ids=[entry[0] for entry in DIST_KERAS_SIGNATURES])
def test_dist_keras_arguments_by_name_and_by_position(tiny, name, arguments, values):
    from distkeras import transformers

    stage_class = getattr(transformers, name)
    by_name = stage_class(**dict(zip(arguments, values)))
    by_position = stage_class(*values)
    assert _params(by_name) == _params(by_position)
    assert len(_params(by_name)) >= len(arguments)  # each argument set a Param
    assert _rows(by_name.transform(tiny)) == _rows(by_position.transform(tiny))


def _params(stage):
    return {param.name: value for param, value in stage._paramMap.items()}  # those set


def _rows(frame):
    return [tuple(_dense([value])[0] for value in row) for row in frame.orderBy("id").collect()]


def test_dist_keras_forms_compute_what_dist_keras_did(tiny):
    from distkeras.transformers import BinaryLabelTransformer, StandardTransformer

    labels = BinaryLabelTransformer(input_column="c", output_column="o", label="cat")
    assert _column(labels.transform(tiny), "o") == [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]
    with pytest.raises(ValueError, match="same argument"):
        BinaryLabelTransformer(input_col="c", input_column="c")

    out = StandardTransformer(["s", "idx"]).transform(tiny)  # suffix "_normalized"
    assert out.columns == tiny.columns + ["s_normalized", "idx_normalized"]
    s = np.array([1.0, 3.0, 5.0])
    np.testing.assert_allclose(_column(out, "s_normalized"), (s - s.mean()) / s.std())
    constant = StandardTransformer(columns=["id"], suffix="_n").transform(
        tiny.where("id = 1"))
    assert _column(constant, "id_n") == [0.0]  # no deviation: centered, not divided by 0
    with pytest.raises(TypeError, match="StandardEstimator"):
        StandardTransformer(["a"]).transform(tiny)
    with pytest.raises(ValueError, match="either"):
        StandardTransformer(["s"], mean=1.0)
    reloaded = StandardTransformer(["s"], "_n").copy()
    assert reloaded.getColumns() == ["s"] and reloaded.getSuffix() == "_n"


def test_a_rescaled_vector_reads_as_dist_keras_code_reads_it(tiny):
    """dist-keras's MNIST notebook calls .toArray() on MinMaxTransformer's output."""
    from distkeras.transformers import (LabelIndexTransformer, MinMaxTransformer,
                                        ReshapeTransformer, StandardTransformer)

    out = MinMaxTransformer(n_min=0.0, n_max=1.0, o_min=0.0, o_max=8.0, input_col="v",
                            output_col="norm").transform(tiny)
    first = out.orderBy("id").first()["norm"].toArray().reshape((2, 2))
    np.testing.assert_allclose(first, [[0.0, 0.375], [0.0, 0.0]])
    out = ReshapeTransformer("norm", "matrix", (2, 2, 1)).transform(out)
    assert _column(out, "matrix")[1] == [[[0.125], [0.25]], [[0.375], [0.5]]]
    assert _column(LabelIndexTransformer(4, "norm", "i").transform(out), "i") == [1, 3, 3]
    standardized = StandardTransformer("v", "z", mean=1.0, std=2.0).transform(tiny)
    assert _dense(_column(standardized, "z"))[2] == [-0.5, -0.5, -0.5, 3.5]


def test_output_type_vector_gives_dist_keras_dense_vectors(tiny):
    """dist-keras's OneHot and BinaryLabel transformers wrote DenseVectors: `.toArray()`."""
    from distkeras.transformers import BinaryLabelTransformer, OneHotTransformer

    out = OneHotTransformer(3, "idx", "o", output_type="vector").transform(tiny)
    assert out.schema["o"].dataType.simpleString() == "vector"
    assert [list(value.toArray()) for value in _column(out, "o")] == \
        [[0, 0, 1], [1, 0, 0], [0, 1, 0]]
    out = BinaryLabelTransformer(input_column="c", output_column="b", label="cat",
                                 output_type="vector").transform(tiny)
    assert [list(value.toArray()) for value in _column(out, "b")] == \
        [[1, 0], [0, 1], [1, 0]]
    arrays = BinaryLabelTransformer("c", "b", "cat").transform(tiny)
    assert arrays.schema["b"].dataType.simpleString() == "array<float>"
    with pytest.raises(TypeError, match="'vector'.*toArray"):
        OneHotTransformer(3, "idx", "o", output_type="DenseVector")
    assert OneHotTransformer(3, "idx", "o").setOutputType("vector").getOutputType() == "vector"


def test_a_stage_saved_under_the_old_module_path_still_loads(tiny, tmp_path):
    """Stages moved to distkeras.ml (then split into its modules): a pipeline saved before
    names distkeras.transformers, dist-keras's path."""
    import glob
    import json
    import os

    from pyspark.ml import PipelineModel

    from distkeras.transformers import OneHotTransformer

    for old_path in ("distkeras.transformers",):
        path = str(tmp_path / old_path)
        PipelineModel(stages=[OneHotTransformer(3, "idx", "o")]).save(path)
        [metadata] = glob.glob(f"{path}/stages/*/metadata/part-00000*")
        with open(metadata) as handle:
            record = json.loads(handle.read())
        assert record["class"] == "distkeras.ml.label_encoders.OneHotTransformer"
        record["class"] = f"{old_path}.OneHotTransformer"
        with open(metadata, "w") as handle:
            handle.write(json.dumps(record))
        for checksum in glob.glob(f"{path}/stages/*/metadata/.part-00000*.crc"):
            os.remove(checksum)  # Hadoop checks a file against its checksum: edited, none
        loaded = PipelineModel.load(path)
        assert _column(loaded.transform(tiny), "o") == [[0, 0, 1], [1, 0, 0], [0, 1, 0]]
