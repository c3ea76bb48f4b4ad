"""Several trainings at once from one driver, in threads (as a hyperparameter search's)."""

import re
import threading
from concurrent.futures import ThreadPoolExecutor

from conftest import build_mlp

from distkeras.trainers import SingleTrainer


def _hold_at_first_epoch_end(reached, release):
    import keras

    class Hold(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                reached.set()
                release.wait(120)

    return Hold()


def test_a_training_started_during_another_names_its_progress_apart(spark, fashion_train,
                                                                     capsys):
    """Two trainings of one trainer class print progress lines of their own: the one
    started while the other runs carries its run's number."""
    frame = fashion_train.limit(256)
    reached, release = threading.Event(), threading.Event()
    first = SingleTrainer(build_mlp(8), "sgd", "categorical_crossentropy", num_epoch=2)
    with ThreadPoolExecutor(1) as pool:
        first_done = pool.submit(first.train, frame, verbose=0,
                                 callbacks=[_hold_at_first_epoch_end(reached, release)])
        try:
            assert reached.wait(120) or first_done.done()
            SingleTrainer(build_mlp(8), "sgd", "categorical_crossentropy").train(frame,
                                                                                 verbose=2)
        finally:
            release.set()
            # Raises the first training's error, which a plain thread dropped.
            first_model = first_done.result(timeout=120)
    assert reached.is_set() and first_model is not None
    assert len(first.get_history()) == 2 * 256 // 32  # both its epochs, held one between
    assert re.search(r"^SingleTrainer #\d+: 256/256 samples", capsys.readouterr().err, re.M)
    SingleTrainer(build_mlp(8), "sgd", "categorical_crossentropy").train(frame, verbose=2)
    assert re.search(r"^SingleTrainer: 256/256 samples", capsys.readouterr().err, re.M)
