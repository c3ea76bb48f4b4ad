"""Models whose weights are large: the workers' replies reach the driver whole, or not at all."""

import numpy as np
import pytest


def test_a_model_of_20_million_parameters_comes_back_trained(spark):
    import keras

    from distkeras.trainers import SingleTrainer

    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 784)).astype("float32")
    frame = spark.createDataFrame([(row.tolist(), int(row[0] > 0)) for row in x],
                                  "features array<float>, label long").coalesce(1)
    keras.utils.set_random_seed(0)
    # 19.7 million float32 parameters: a reply of 79 MB, which one row of Spark's
    # collect() could not pass to Python in the default 1 GB driver heap.
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(25000, activation="relu"),
                              keras.layers.Dense(2, activation="softmax")])
    initial = model.layers[-1].kernel.numpy()
    trainer = SingleTrainer(model, keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy",
                            batch_size=16)
    trained = trainer.train(frame, verbose=0)

    assert len(trainer.get_history()) == 2
    assert not np.allclose(trained.layers[-1].kernel.numpy(), initial)


def test_a_reply_missing_from_the_collected_rows_is_an_error():
    from distkeras.trainers import TrainingError
    from distkeras.training.spark_jobs import joined_replies, reply_chunks

    replies = [bytes([index]) * 20 for index in range(2)]
    rows = [{"worker_id": worker_id, "chunk": index, "chunks": len(chunks), "payload": chunk}
            for worker_id, reply in enumerate(replies)
            for chunks in [reply_chunks(reply, size=8)]
            for index, chunk in enumerate(chunks)]
    assert len(rows) == 6
    assert joined_replies(reversed(rows), 2) == replies
    # PySpark's collect() ends early, without an error, where the driver's JVM failed to
    # serve the rows: no replica or some of one must not pass for the training's result.
    for collected in (rows[:-1], rows[:3], []):
        with pytest.raises(TrainingError, match="spark.driver.memory"):
            joined_replies(collected, 2)
