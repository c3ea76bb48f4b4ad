"""README.md's Python recipes run as printed (on fewer rows), so the README cannot rot."""

import functools

import numpy as np
import pytest
from conftest import accuracy, build_mlp
from readme_support import readme_block, run_as_main


def test_readme_blocks_are_found():
    assert "trainer = ADAG(keras_model=mlp" in readme_block("Use")
    assert "KerasEstimator(trainer)" in readme_block("Data pipeline")
    assert "job.wait_completion()" in readme_block("Punchcard: remote jobs")


@pytest.mark.spark
def test_quick_start_runs_as_printed(spark, fashion_test, monkeypatch):
    import keras

    import distkeras.datasets

    # The one change: the block's load_fashion_mnist reads 2,000 rows, not 60,000.
    monkeypatch.setattr(distkeras.datasets, "load_fashion_mnist", functools.partial(
        distkeras.datasets.load_fashion_mnist, limit=2000))
    namespace = run_as_main(readme_block("Use"))

    model, trainer = namespace["model"], namespace["trainer"]
    assert isinstance(model, keras.Model) and model.compiled
    assert sum(record["batch_size"] for record in trainer.get_history()) == 2000
    assert trainer.get_training_time() > 0
    assert len(trainer.get_averaged_history()["loss"]) > 0
    assert accuracy(model, fashion_test) > 0.3


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
