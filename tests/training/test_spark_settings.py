"""The trainers under Spark settings that users' clusters have."""

import logging
import types

import numpy as np

import distkeras  # noqa: F401  (selects the JAX backend before Keras is imported)
from distkeras import trainers
from distkeras.session import master
from distkeras.training import spark_jobs


def _context(master, **conf):
    """A stand-in for a SparkSession: its ``conf`` with the master and the settings."""
    settings = {"spark.master": master, **conf}
    return types.SimpleNamespace(
        conf=types.SimpleNamespace(get=lambda key, default=None: settings.get(key, default)),
        sparkContext=types.SimpleNamespace(master=master))


def test_speculation_on_a_cluster_is_warned_of(caplog):
    cluster = _context("spark://master:7077", **{"spark.speculation": "true"})
    with caplog.at_level(logging.WARNING, logger="distkeras"):
        assert spark_jobs.warn_if_speculative(cluster, "ADAG")
    assert "spark.speculation=true" in caplog.text and "spark.speculation=false" in caplog.text
    # Off, or on one host (Spark never runs a speculative copy where the task runs).
    assert not spark_jobs.warn_if_speculative(_context("spark://master:7077"), "ADAG")
    assert not spark_jobs.warn_if_speculative(
        _context("local[2]", **{"spark.speculation": "true"}), "ADAG")


def test_parameter_server_trainers_check_speculation_before_training(spark, monkeypatch):
    import keras

    checked = []
    from distkeras.training import parameter_server

    monkeypatch.setattr(parameter_server, "warn_if_speculative",
                        lambda session, name: checked.append((master(session), name)))
    rows = [([float(i % 3), 1.0], i % 2) for i in range(64)]
    frame = spark.createDataFrame(rows, "features array<float>, label long")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="softmax")])
    trained = trainers.ADAG(model, "sgd", "sparse_categorical_crossentropy", num_workers=2,
                            communication_window=2).train(frame, verbose=0)
    assert checked == [(spark.sparkContext.master, "ADAG")]
    # The check let the training run: the returned model moved (the user's is untouched).
    assert np.isfinite(trained.get_weights()[0]).all()
    assert not np.array_equal(trained.get_weights()[0], model.get_weights()[0])
