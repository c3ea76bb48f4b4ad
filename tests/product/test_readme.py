"""README.md's and the docs pages' Python recipes run as printed (on fewer rows), so they
cannot rot; the README stays short and its links lead somewhere."""

import functools
import os
import re

import numpy as np
import pytest
from conftest import accuracy, build_mlp
from readme_support import README, documentation_pages, readme_block, run_as_main

README_LIMIT = 8000


def _read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def test_readme_is_short():
    # The details live in docs/; the README says what distkeras is and how to start.
    assert len(_read(README)) <= README_LIMIT


def test_readme_links_reach_existing_pages():
    links = re.findall(r"\]\(((?:docs/)[^)#]+)", _read(README))
    assert len(links) >= 5
    for link in links:
        assert os.path.exists(os.path.join(os.path.dirname(README), link)), link


def test_pages_name_dist_keras_as_the_original():
    # dist-keras is named as the original that distkeras re-creates; no page speaks of
    # where the project came from in other words.
    for page in documentation_pages():
        text = _read(page).lower()
        assert "the seed" not in text and not re.search(r"\bseeds? \d{3}\b", text), page


def test_readme_blocks_are_found():
    assert "trainer = ADAG(keras_model=mlp" in readme_block("Use")
    assert "KerasEstimator(trainer)" in readme_block("Data pipeline")
    assert "job.wait_completion()" in readme_block("Punchcard: remote jobs")


def _run_fashion_block(heading, monkeypatch, fashion_test):
    """Runs the block under ``heading`` as printed, on 2,000 rows; checks that it trained
    a compiled model on every row, and returns its trainer."""
    import keras

    import distkeras.datasets

    # The one change: the block's load_fashion_mnist reads 2,000 rows, not 60,000.
    monkeypatch.setattr(distkeras.datasets, "load_fashion_mnist", functools.partial(
        distkeras.datasets.load_fashion_mnist, limit=2000))
    namespace = run_as_main(readme_block(heading))

    model, trainer = namespace["model"], namespace["trainer"]
    assert isinstance(model, keras.Model) and model.compiled
    assert sum(record["batch_size"] for record in trainer.get_history()) == 2000
    assert accuracy(model, fashion_test) > 0.3
    return trainer


@pytest.mark.spark
def test_quick_start_runs_as_printed(spark, fashion_test, monkeypatch):
    # The README's quick start: its "Use" block.
    trainer = _run_fashion_block("Use", monkeypatch, fashion_test)
    assert trainer.get_training_time() > 0
    assert len(trainer.get_averaged_history()["loss"]) > 0


@pytest.mark.spark
def test_getting_started_block_runs_as_printed(spark, fashion_test, monkeypatch):
    _run_fashion_block("Train a model", monkeypatch, fashion_test)


@pytest.mark.spark
def test_estimator_pipeline_runs_as_printed(spark, fashion_train, tmp_path):
    from distkeras.datasets import load_fashion_mnist

    # The one change: the block's relative path (the JVM's working directory) is under
    # tmp_path.
    saved = str(tmp_path / "fashion-pipeline")
    code = readme_block("Data pipeline")
    assert code.count('"fashion-pipeline"') == 2
    test = load_fashion_mnist(spark, "test", limit=500)
    namespace = run_as_main(code.replace('"fashion-pipeline"', repr(saved)),
                            mlp=build_mlp(64), train=fashion_train.limit(2000), test=test)

    predicted = namespace["predicted"]
    assert {"prediction", "prediction_index"} <= set(predicted.columns)
    assert namespace["accuracy"] > 0.5
    reloaded = namespace["PipelineModel"].load(saved).transform(test)
    np.testing.assert_allclose([row.prediction for row in reloaded.collect()],
                               [row.prediction for row in predicted.collect()], atol=1e-6)


def _area_under_roc(scores, labels):
    """The area under the ROC curve: the chance that a positive row outscores a negative
    one (ties count half), as Spark's BinaryClassificationEvaluator computes it."""
    positives, negatives = scores[labels == 1], scores[labels == 0]
    wins = (positives[:, None] > negatives[None, :]).sum()
    ties = (positives[:, None] == negatives[None, :]).sum()
    return (wins + ties / 2) / (len(positives) * len(negatives))


@pytest.mark.spark
def test_spark_binary_evaluator_runs_as_printed(spark):
    import keras

    from distkeras.predictors import ModelPredictor

    # The README's step: Spark's evaluator refused `F.col("prediction")[0]` (a float).
    rng = np.random.default_rng(0)
    features = rng.normal(size=(200, 4)).astype("float32")
    labels = (features[:, 0] + rng.normal(scale=0.5, size=200) > 0).astype(int)
    frame = spark.createDataFrame([(row.tolist(), int(label))
                                   for row, label in zip(features, labels)],
                                  "features array<float>, label int")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    scored = ModelPredictor(model).predict(frame)
    namespace = run_as_main(readme_block("Data pipeline", index=1), scored=scored)

    expected = _area_under_roc(model.predict(features, verbose=0)[:, 0], labels)
    assert namespace["area"] == pytest.approx(expected, abs=1e-6)
    in_pipeline = namespace["to_score"].transform(scored)
    assert namespace["BinaryClassificationEvaluator"](
        rawPredictionCol="score", labelCol="label").evaluate(in_pipeline) == \
        pytest.approx(expected, abs=1e-6)
