"""Sample weights and class weights: hand-computed weights, the feed, Keras's own `fit`, and
training on imbalanced data."""

import numpy as np
import pyarrow as pa
import pytest

from distkeras.data.feed import MinibatchFeed
from distkeras.data.sample_weights import class_indices, row_weights


def test_row_weights_multiply_sample_and_class_weights():
    table = np.array([1.0, 4.0, 0.5], dtype=np.float32)
    one_hot = np.eye(3, dtype=np.float32)[[0, 1, 2, 1]]

    weights = row_weights(4, np.array([1.0, 2.0, 3.0, 0.0]), one_hot, table)

    np.testing.assert_array_equal(weights, [1.0, 8.0, 1.5, 0.0])
    np.testing.assert_array_equal(row_weights(3, None, np.array([2, 0, 7]), table),
                                  [0.5, 1.0, 1.0])  # class 7 is not in the table: weight 1
    np.testing.assert_array_equal(row_weights(2), [1.0, 1.0])


def test_class_indices_of_indices_one_hot_and_binary_labels():
    np.testing.assert_array_equal(class_indices(np.array([3, 0, 1])), [3, 0, 1])
    np.testing.assert_array_equal(class_indices(np.eye(4)[[2, 3]]), [2, 3])
    np.testing.assert_array_equal(class_indices(np.array([[0.0], [1.0], [0.9]])), [0, 1, 1])


def test_negative_or_missing_sample_weights_are_refused():
    with pytest.raises(ValueError, match="finite numbers >= 0.*2 that are not"):
        row_weights(3, np.array([1.0, -1.0, np.nan]))


def test_a_negative_sample_weight_is_named_by_its_column_and_row():
    """As the feed's other errors do: the weight column and where its first bad row is,
    also in a later record batch of the partition."""
    def record_batch(weights):
        return pa.RecordBatch.from_pydict({"x": pa.array(np.zeros(len(weights), np.float32)),
                                           "y": pa.array([0] * len(weights)),
                                           "weight": pa.array(weights)})

    feed = MinibatchFeed(iter([record_batch([1.0] * 4), record_batch([1.0, 2.0, -0.5])]),
                         ["x"], ["y"], 2, [()], [()], weight_col="weight")
    with pytest.raises(ValueError, match=r"Sample weights \(column 'weight'\) must be finite "
                                         r"numbers >= 0; this batch of 3 rows holds 1 that "
                                         r"are not \(the first, -0.5, in row 2\)\. Drop or "
                                         r"fix those rows first\. \(That batch holds rows 4 "
                                         r"to 6 of this partition\.\)"):
        list(feed)


def test_feed_yields_weights_with_their_rows_across_record_batches():
    def record_batch(start, count):
        rows = np.arange(start, start + count)
        return pa.RecordBatch.from_pydict({
            "x": pa.array(rows.astype(np.float32)),
            "y": pa.array(rows % 2),
            "w": pa.array((rows + 1).astype(np.float64)),
        })

    table = np.array([1.0, 10.0], dtype=np.float32)
    feed = MinibatchFeed(iter([record_batch(0, 5), record_batch(5, 4)]), ["x"], ["y"], 4,
                         [()], [()], weight_col="w", class_table=table)

    batches = list(feed)

    assert [len(x) for x, _, _ in batches] == [4, 4, 1]
    x = np.concatenate([x for x, _, _ in batches])
    weights = np.concatenate([w for _, _, w in batches])
    np.testing.assert_array_equal(x, np.arange(9))
    np.testing.assert_array_equal(weights, (np.arange(9) + 1) * np.where(np.arange(9) % 2, 10, 1))


def _imbalanced(rows=2000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4)).astype(np.float32)
    return x, (x[:, 0] > 1.6).astype(np.int64)  # about 5% positives


def _linear_model(seed=1):
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])


def _frame(spark, x, y, **extra):
    columns = {"features": [row.tolist() for row in x], "label": y.tolist(),
               **{name: values.tolist() for name, values in extra.items()}}
    rows = list(zip(*columns.values()))
    return spark.createDataFrame(rows, list(columns)).coalesce(1)


def test_single_trainer_with_class_weight_matches_keras_fit(spark):
    import keras

    from distkeras.trainers import SingleTrainer

    x, y = _imbalanced(rows=320)
    class_weight = {0: 0.5, 1: 8.0}
    reference = _linear_model()
    reference.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy")
    reference.fit(x, y, batch_size=32, epochs=1, shuffle=False, class_weight=class_weight,
                  verbose=0)

    trainer = SingleTrainer(_linear_model(), keras.optimizers.SGD(0.05),
                            "sparse_categorical_crossentropy", metrics=[])
    model = trainer.train(_frame(spark, x, y), verbose=0, class_weight=class_weight)

    for mine, theirs in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    unweighted = SingleTrainer(_linear_model(), keras.optimizers.SGD(0.05),
                               "sparse_categorical_crossentropy", metrics=[])
    plain = unweighted.train(_frame(spark, x, y), verbose=0)
    assert not np.allclose(plain.get_weights()[0], reference.get_weights()[0], atol=1e-3)


@pytest.mark.parametrize("trainer_name", ["SingleTrainer", "ADAG"])
def test_a_compiled_models_weighted_metrics_are_measured_as_fit_does(trainer_name, spark):
    import keras

    from distkeras import trainers

    x, y = _imbalanced(rows=320)
    weight = np.where(y == 1, 10.0, 1.0)

    def compiled():
        model = _linear_model()
        # The learning rate 0 keeps the predictions, so each step's values can be checked.
        model.compile(keras.optimizers.SGD(0.0), "sparse_categorical_crossentropy",
                      metrics=["accuracy"], weighted_metrics=["accuracy"])
        return model

    reference = compiled()
    fitted = reference.fit(x, y, sample_weight=weight, batch_size=32, epochs=1, verbose=0)
    kwargs = {"num_workers": 1, "communication_window": 2} if trainer_name == "ADAG" else {}
    trainer = getattr(trainers, trainer_name)(compiled(), batch_size=32, **kwargs)
    model = trainer.train(_frame(spark, x, y, weight=weight), verbose=0,
                          sample_weight_col="weight")

    history = trainer.get_history()
    assert set(fitted.history) <= set(history[0])  # loss, accuracy, weighted_accuracy
    right = (reference.predict(x, verbose=0).argmax(axis=1) == y).astype(np.float64)
    for step, record in enumerate(history):
        rows = slice(32 * step, 32 * (step + 1))
        assert record["accuracy"] == pytest.approx(right[rows].mean(), abs=1e-6)
        assert record["weighted_accuracy"] == pytest.approx(
            np.average(right[rows], weights=weight[rows]), abs=1e-6)
    # The returned model measures them too, as the model `fit` trained.
    logs = model.evaluate(x, y, sample_weight=weight, verbose=0, return_dict=True)
    assert logs["weighted_accuracy"] == pytest.approx(np.average(right, weights=weight),
                                                      abs=1e-6)


def test_zero_sample_weights_leave_the_model_untouched(spark):
    from distkeras.trainers import ADAG

    x, y = _imbalanced(rows=400)
    start = _linear_model()
    frame = _frame(spark, x, y, weight=np.zeros(len(x))).repartition(2)

    model = ADAG(_linear_model(), "sgd", "sparse_categorical_crossentropy", num_workers=2,
                 communication_window=3).train(frame, verbose=0, sample_weight_col="weight")

    for trained, initial in zip(model.get_weights(), start.get_weights()):
        np.testing.assert_allclose(trained, initial, atol=1e-7)


def test_class_weight_lifts_minority_recall_with_adag_on_two_workers(spark):
    import keras

    from distkeras.trainers import ADAG

    x, y = _imbalanced(rows=4000)
    frame = _frame(spark, x, y).repartition(2).cache()

    def minority_recall(**weights):
        trainer = ADAG(_linear_model(), keras.optimizers.Adam(0.02),
                       "sparse_categorical_crossentropy", num_workers=2, num_epoch=2,
                       communication_window=2)
        model = trainer.train(frame, verbose=0, **weights)
        predicted = model.predict(x, verbose=0).argmax(axis=1)
        return float((predicted[y == 1] == 1).mean())

    plain = minority_recall()
    weighted = minority_recall(class_weight={1: 10.0})
    assert weighted >= 0.9 and weighted > plain + 0.2, (plain, weighted)


@pytest.mark.parametrize("options, error, message", [
    ({"class_weight": {5: 1.0}}, ValueError, "key 5 is not a class index .*0 to 1"),
    ({"class_weight": {"1": 1.0}}, ValueError,
     r"key '1' is not a class index .*\(an int: \{1: \.\.\.\}, not a string\)"),
    ({"class_weight": {0: -1.0}}, ValueError, "class 0 must be a number >= 0"),
    ({"class_weight": [1.0, 2.0]}, ValueError, "must be a non-empty dict"),
    ({"sample_weight_col": "nope"}, ValueError, "'nope' is not a column"),
    ({"sample_weight_col": "features"}, ValueError, "also a feature or label column"),
    ({"sample_weight_col": "name"}, TypeError, "one number per row"),
])
def test_bad_weights_are_named_before_training(options, error, message, spark):
    from distkeras.trainers import SingleTrainer

    x, y = _imbalanced(rows=10)
    frame = _frame(spark, x, y).selectExpr("*", "'a' AS name")
    trainer = SingleTrainer(_linear_model(), "sgd", "sparse_categorical_crossentropy")

    with pytest.raises(error, match=message):
        trainer.train(frame, verbose=0, **options)
    assert trainer.get_history() == []


def test_class_weight_is_refused_for_an_output_of_several_axes(spark):
    import keras

    from distkeras.trainers import SingleTrainer

    frame = spark.createDataFrame([([1, 2, 3], [0, 1, 2])] * 4,
                                  "tokens array<int>, tags array<int>")
    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(5, 2),
                              keras.layers.Dense(3, activation="softmax")])
    trainer = SingleTrainer(model, "sgd", "sparse_categorical_crossentropy",
                            features_col="tokens", label_col="tags")

    with pytest.raises(ValueError, match="output of one axis .*shape \\(3, 3\\)"):
        trainer.train(frame, verbose=0, class_weight={0: 1.0, 2: 5.0})
    assert trainer.get_history() == []


def test_a_custom_worker_written_as_the_docs_say_takes_the_weights(spark):
    from distkeras.trainers import AsynchronousDistributedTrainer
    from distkeras.workers import NetworkWorker

    class WeightedWorker(NetworkWorker):
        def optimize(self):
            self.pull()
            self.model.set_weights(self.center_variable)
            while True:
                x, y, *weights = self.get_next_minibatch()
                assert len(weights) == 1 and len(weights[0]) == len(x)
                start = self.model.get_weights()
                self.model.train_on_batch(x, y, *weights)
                self.commit(self.model.get_weights() - start)
                self.pull()
                self.model.set_weights(self.center_variable)
                self.iteration += 1

    class WeightedTrainer(AsynchronousDistributedTrainer):
        def allocate_worker(self):
            return WeightedWorker(self.master_model)

    x, y = _imbalanced(rows=200)
    frame = _frame(spark, x, y, weight=np.zeros(len(x))).repartition(2)
    start = _linear_model()

    model = WeightedTrainer(_linear_model(), "sgd", "sparse_categorical_crossentropy",
                            num_workers=2).train(frame, verbose=0, sample_weight_col="weight")

    assert len(model.get_weights()) == len(start.get_weights())
    for trained, initial in zip(model.get_weights(), start.get_weights()):
        np.testing.assert_allclose(trained, initial, atol=1e-7)
