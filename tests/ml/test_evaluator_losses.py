"""LossEvaluator against Keras's own `evaluate`, given the loss the model was compiled with
(its arguments included), on the same rows."""

import numpy as np
import pytest

pytestmark = pytest.mark.spark

ROWS, CLASSES = 12, 4


def _model(units, activation):
    import keras

    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(units, activation=activation)])


def _rows(spark, predictions, labels, weights=None):
    """A DataFrame of the prediction arrays, the labels (arrays or numbers) and weights."""
    from pyspark.sql import Row

    def value(label):
        return [float(x) for x in label] if np.ndim(label) else float(label)

    weights = np.ones(len(labels)) if weights is None else weights
    rows = [Row(prediction=[float(x) for x in p], label=value(y), weight=float(w))
            for p, y, w in zip(predictions, labels, weights)]
    return spark.createDataFrame(rows)


def _compare(spark, loss, units, activation, labels, weighted=False, given=None):
    """LossEvaluator(loss) (or ``given``: the loss as the evaluator gets it) on the model's
    predictions against its `evaluate` (one batch)."""
    from distkeras.evaluators import LossEvaluator

    features = np.random.default_rng(0).normal(size=(ROWS, 5)).astype("float32")
    weights = np.linspace(0.0, 2.0, ROWS).astype("float32") if weighted else None
    model = _model(units, activation)
    model.compile(loss=loss)
    expected = model.evaluate(features, labels, sample_weight=weights, batch_size=ROWS,
                              verbose=0)
    frame = _rows(spark, model.predict(features, verbose=0), labels, weights)
    got = LossEvaluator(loss if given is None else given,
                        weight_col="weight" if weighted else None).evaluate(frame)
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)
    return got


def _one_hot(indices):
    return np.eye(CLASSES, dtype="float32")[indices]


INDICES = np.array([0, 1, 2, 3, 0, 0, 1, 2, 3, 3, 0, 2])


def test_label_smoothing_counts_as_in_evaluate(spark):
    import keras

    smoothed = _compare(spark, keras.losses.CategoricalCrossentropy(label_smoothing=0.1),
                        CLASSES, "softmax", _one_hot(INDICES))
    plain = _compare(spark, keras.losses.CategoricalCrossentropy(), CLASSES, "softmax",
                     _one_hot(INDICES))
    assert smoothed != pytest.approx(plain, rel=1e-3)
    binary = (INDICES % 2).reshape(-1, 1).astype("float32")
    _compare(spark, keras.losses.BinaryCrossentropy(label_smoothing=0.2), 1, "sigmoid", binary)


def test_logits_are_read_as_the_loss_says(spark):
    import keras

    _compare(spark, keras.losses.CategoricalCrossentropy(from_logits=True,
                                                         label_smoothing=0.1),
             CLASSES, None, _one_hot(INDICES))
    _compare(spark, keras.losses.SparseCategoricalCrossentropy(from_logits=True), CLASSES,
             None, INDICES)
    binary = (INDICES % 2).reshape(-1, 1).astype("float32")
    _compare(spark, keras.losses.BinaryCrossentropy(from_logits=True), 1, None, binary)
    # A config (as `get_config` stores it) is read as its loss.
    loss = keras.losses.BinaryCrossentropy(from_logits=True)
    _compare(spark, loss, 1, None, binary, given=keras.losses.serialize(loss))


def test_contradicting_from_logits_is_refused(spark):
    import keras

    from distkeras.evaluators import LossEvaluator

    frame = _rows(spark, [[0.2, 0.8]], [1])
    with pytest.raises(ValueError, match="contradicts the loss's own from_logits=True"):
        LossEvaluator(keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      from_logits=False).evaluate(frame)


@pytest.mark.parametrize("ignored", [0, -1])
def test_ignore_class_leaves_its_rows_out_of_the_mean(spark, ignored):
    import keras

    labels = np.where(INDICES == 0, ignored, INDICES) if ignored < 0 else INDICES
    loss = keras.losses.SparseCategoricalCrossentropy(ignore_class=ignored)
    _compare(spark, loss, CLASSES, "softmax", labels)
    _compare(spark, loss, CLASSES, "softmax", labels, weighted=True)


def test_huber_delta_and_weights_with_each_mean(spark):
    import keras

    targets = np.random.default_rng(1).normal(scale=3.0, size=(ROWS, 2)).astype("float32")
    _compare(spark, keras.losses.Huber(delta=2.0), 2, None, targets)
    _compare(spark, keras.losses.Huber(delta=2.0), 2, None, targets, weighted=True)
    _compare(spark, keras.losses.MeanSquaredError(reduction="mean_with_sample_weight"), 2,
             None, targets, weighted=True)


@pytest.mark.parametrize("loss, message", [
    ("reduction_sum", "reduction='sum'.*depends on the batch size"),
    ("focal", "cannot compute BinaryFocalCrossentropy"),
    ("custom", "cannot compute ScaledSquaredError"),
    ("hinge", "`loss` must be one of"),
])
def test_losses_it_cannot_match_are_refused_by_name(spark, loss, message):
    import keras

    from distkeras.evaluators import LossEvaluator

    @keras.saving.register_keras_serializable(package="distkeras_tests")
    class ScaledSquaredError(keras.losses.Loss):
        def __init__(self, scale=1.0, **kwargs):
            super().__init__(**kwargs)
            self.scale = scale

        def call(self, y_true, y_pred):
            return self.scale * keras.ops.mean(keras.ops.square(y_true - y_pred), axis=-1)

        def get_config(self):
            return {**super().get_config(), "scale": self.scale}

    losses = {"reduction_sum": keras.losses.MeanSquaredError(reduction="sum"),
              "focal": keras.losses.BinaryFocalCrossentropy(),
              "custom": ScaledSquaredError(scale=2.0), "hinge": "hinge"}
    frame = _rows(spark, [[0.2]], [1])
    with pytest.raises(ValueError, match=message):
        LossEvaluator(losses[loss]).evaluate(frame)
