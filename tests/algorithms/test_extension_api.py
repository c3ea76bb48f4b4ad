"""Seed 000's tutorial: a new optimizer from three small classes, run as printed."""

import logging

import numpy as np
import pytest
from conftest import build_mlp

from distkeras.networking import recv_data
from distkeras.parameter_servers import SocketParameterServer
from distkeras.trainers import AsynchronousDistributedTrainer
from distkeras.training import launch
from distkeras.workers import NetworkWorker


class MyOptimizer(AsynchronousDistributedTrainer):
    def allocate_worker(self):
        # 告诉框架训练时每个节点用哪种 Worker
        return MyWorker(self.master_model, self.worker_optimizer, self.loss)

    def allocate_parameter_server(self):
        # 告诉框架Driver 端用哪种参数服务器
        return MyParameterServer(self.master_model, self.master_port)


class MyWorker(NetworkWorker):
    def optimize(self):
        W1 = np.asarray(self.model.get_weights())
        while True:
            X, Y = self.get_next_minibatch()  # 取一个 mini-batch
            self.model.train_on_batch(X, Y)  # 本地更新
            if self.iteration % self.communication_window == 0:
                self.commit(W1 - np.asarray(self.model.get_weights()))  # 提交增量
                self.pull()  # 拉取最新中心变量
                self.model.set_weights(self.center_variable)
            self.iteration += 1


class MyParameterServer(SocketParameterServer):
    def handle_commit(self, conn, addr):
        data = recv_data(conn)  # 接收 Worker 提交
        # 在这里写你自己的聚合/更新逻辑
        with self.mutex:
            self.center_variable = self.center_variable + 0.5 * data['delta']


class DefaultServerOptimizer(AsynchronousDistributedTrainer):
    """Without allocate_parameter_server a trainer gets DeltaParameterServer."""

    def allocate_worker(self):
        return MyWorker(self.master_model)


def test_seed_tutorial_runs_as_printed(fashion_train, caplog):
    mlp = build_mlp()
    keras_optimizer = "adam"
    trainer = MyOptimizer(keras_model=mlp, worker_optimizer=keras_optimizer,
                          loss="categorical_crossentropy", num_workers=4, batch_size=32,
                          communication_window=8)
    dataframe = fashion_train.limit(1200)
    with caplog.at_level(logging.WARNING, logger="distkeras"):
        model = trainer.train(dataframe)
    assert not [r for r in caplog.records if "applied no commit" in r.getMessage()
                or "returned before" in r.getMessage()]

    server = trainer.parameter_server
    assert isinstance(server, MyParameterServer)
    # 1,200 rows over 4 workers: 300 rows, 10 minibatches each, commits at iterations 8.
    assert server.num_updates == 4
    assert len(trainer.get_staleness()) == 4
    initial = mlp.get_weights()
    # The seed's worker commits W1 - W (the negated change), halved by the server: the
    # center moved, and by a finite amount.
    moved = [np.abs(c - i).max() for c, i in zip(model.get_weights(), initial)]
    assert max(moved) > 0 and all(np.isfinite(moved))
    assert sum(r["batch_size"] for r in trainer.get_history()) == 1200


def test_a_run_that_commits_nothing_says_so(fashion_train, caplog):
    # The seed's loop commits every 8 steps only: 100 rows per worker are 4 minibatches,
    # so nothing reaches the center and the model comes back as it was given.
    trainer = MyOptimizer(keras_model=build_mlp(), worker_optimizer="adam",
                          loss="categorical_crossentropy", num_workers=2, batch_size=32,
                          communication_window=8)
    with caplog.at_level(logging.WARNING, logger="distkeras"):
        trainer.train(fashion_train.limit(200))
    assert trainer.parameter_server.num_updates == 0
    warnings = [r.getMessage() for r in caplog.records if "applied no commit" in r.getMessage()]
    assert len(warnings) == 1
    assert "communication_window=8" in warnings[0] and "MyWorker" in warnings[0]


class OneBatchWorker(NetworkWorker):
    """Trains one minibatch, commits it and returns: the rest of its partition is left."""

    def optimize(self):
        self.pull()
        self.model.set_weights(self.center_variable)
        x, y = self.get_next_minibatch()
        self.model.train_on_batch(x, y)
        self.commit([w - c for w, c in zip(self.model.get_weights(), self.center_variable)])


def test_a_worker_that_returns_early_says_how_little_it_trained(fashion_train, caplog):
    class OneBatch(AsynchronousDistributedTrainer):
        def allocate_worker(self):
            return OneBatchWorker(self.master_model)

    trainer = OneBatch(keras_model=build_mlp(16), worker_optimizer="adam",
                       loss="categorical_crossentropy", num_workers=2, batch_size=32,
                       num_epoch=2)
    # train() returned normally (epoch-end callbacks fired) without a word.
    with caplog.at_level(logging.WARNING, logger="distkeras"):
        trainer.train(fashion_train.limit(200), verbose=2)
    assert sum(r["batch_size"] for r in trainer.get_history()) == 64
    warnings = [r.getMessage() for r in caplog.records if "returned before" in r.getMessage()]
    assert len(warnings) == 1
    assert "trained on 64 samples, not the 400 of 2 epochs" in warnings[0]
    assert "OneBatchWorker.optimize()" in warnings[0]


class NaNWorker(NetworkWorker):
    """Commits NaN every step: DeltaParameterServer refuses every commit."""

    def optimize(self):
        self.pull()
        while True:
            x, y = self.get_next_minibatch()
            self.model.train_on_batch(x, y)
            self.commit(self.center_variable * np.nan)
            self.pull()
            self.iteration += 1


class NaNOptimizer(AsynchronousDistributedTrainer):
    def allocate_worker(self):
        return NaNWorker(self.master_model)


def test_a_run_whose_commits_were_all_refused_says_so(fashion_train, caplog):
    trainer = NaNOptimizer(keras_model=build_mlp(), worker_optimizer="adam",
                           loss="categorical_crossentropy", num_workers=2)
    with caplog.at_level(logging.WARNING, logger="distkeras"):
        trainer.train(fashion_train.limit(128))
    warnings = [r.getMessage() for r in caplog.records if "applied none" in r.getMessage()]
    refused = trainer.parameter_server.center.refused
    assert refused >= 2 and trainer.parameter_server.num_updates == 0
    assert len(warnings) == 1 and f"refused {refused}," in warnings[0]


def test_seed_loop_with_class_weight_says_what_to_write(fashion_train):
    # The seed's `X, Y = self.get_next_minibatch()` meets (x, y, sample_weight).
    from distkeras.trainers import TrainingError

    trainer = MyOptimizer(keras_model=build_mlp(), worker_optimizer="adam",
                          loss="categorical_crossentropy", num_workers=2,
                          communication_window=8)
    with pytest.raises(TrainingError, match=r"x, y, \*weights = self.get_next_minibatch\(\)"):
        trainer.train(fashion_train.limit(200), class_weight={0: 2.0})


def test_default_parameter_server_is_delta(fashion_train, fashion_test):
    from distkeras.parameter_servers import DeltaParameterServer

    trainer = DefaultServerOptimizer(keras_model=build_mlp(), worker_optimizer="adam",
                                     loss="categorical_crossentropy", num_workers=2,
                                     communication_window=4)
    trainer.train(fashion_train.limit(400))
    assert type(trainer.parameter_server) is DeltaParameterServer
    # 200 rows per worker: 7 minibatches, one commit (at iteration 4) each.
    assert trainer.parameter_server.num_updates == 2 * ((200 + 31) // 32 // 4)


def test_object_array_weights_on_numpy_2():
    from distkeras.transport.networking import weights_array

    w = weights_array([np.ones((2, 3), "float32"), np.full(3, 2.0, "float32")])
    w1 = np.asarray(w)
    delta = w1 - weights_array([np.zeros((2, 3), "float32"), np.ones(3, "float32")])
    center = w + 0.5 * delta
    np.testing.assert_array_equal(center[0], np.full((2, 3), 1.5))
    np.testing.assert_array_equal(center[1], np.full(3, 2.5))


class Float64Worker(NetworkWorker):
    """Computes its delta in float64 (numpy arithmetic with a Python float array)."""

    def optimize(self):
        self.pull()
        while True:
            x, y = self.get_next_minibatch()
            self.model.train_on_batch(x, y)
            self.commit([np.asarray(w, np.float64) - c for w, c in
                         zip(self.model.get_weights(), self.center_variable)])
            self.pull()
            self.model.set_weights(self.center_variable)
            self.iteration += 1


class TransposedWorker(Float64Worker):
    def optimize(self):
        x, y = self.get_next_minibatch()
        self.model.train_on_batch(x, y)
        self.commit([w.T for w in self.model.get_weights()])
        self.pull()


def test_a_float64_delta_is_cast_like_set_weights(fashion_train):
    class Float64(AsynchronousDistributedTrainer):
        def allocate_worker(self):
            return Float64Worker(self.master_model)

    trainer = Float64(keras_model=build_mlp(16), worker_optimizer="adam",
                      loss="categorical_crossentropy", num_workers=2)
    trainer.train(fashion_train.limit(128))
    assert trainer.parameter_server.num_updates == 4


def test_a_misshaped_delta_names_the_worker_and_the_shapes(fashion_train):
    from distkeras.trainers import TrainingError

    class Transposed(AsynchronousDistributedTrainer):
        def allocate_worker(self):
            return TransposedWorker(self.master_model)

    trainer = Transposed(keras_model=build_mlp(16), worker_optimizer="adam",
                         loss="categorical_crossentropy", num_workers=2)
    # It said only "PeerClosedError: Connection closed" (the server's reason was in a log).
    # Not retried either: every retry would commit the same.
    with pytest.raises(TrainingError, match=r"partition \d failed: InvalidUpdateError: "
                       r"TransposedWorker.commit\(\): the update's "
                       r"array 0 is float32\[16, 784\]; the model's weight 0 is "
                       r"float32\[784, 16\]"):
        trainer.train(fashion_train.limit(128))


def test_checked_update_wants_one_array_per_weight():
    from distkeras.transport.exchange_checks import checked_update

    spec = [((2, 3), np.dtype("float32")), ((3,), np.dtype("float32"))]
    layers = [np.ones((2, 3)), np.ones(3, "float32")]
    update = checked_update(layers, spec, "W.commit()")
    assert update.dtype == object and [a.dtype for a in update] == ["float32"] * 2
    with pytest.raises(ValueError, match=r"W.commit\(\) takes one array per weight of the "
                       r"model \(2, .*Received: float32\[3\]"):
        checked_update(np.ones(3, "float32"), spec, "W.commit()")
    with pytest.raises(ValueError, match="it has 2, the update holds 1"):
        checked_update(layers[:1], spec, "W.commit()")
    with pytest.raises(ValueError, match=r"array 1 is int64\[3\]"):
        checked_update([layers[0], np.ones(3, "int64")], spec, "W.commit()")


class TypoParameterServer(SocketParameterServer):
    def handle_commit(self, conn, addr):
        data = recv_data(conn)
        with self.mutex:
            self.center_variable = self.center_variable + data["deltaa"]  # a typo


def test_a_handler_that_raises_is_named_and_stops_the_workers_at_once(fashion_train,
                                                                     monkeypatch):
    """The workers saw only their closed connection ("PeerClosedError"), and Spark
    retried each of them, the handler raising again each time."""
    from distkeras.trainers import TrainingError

    class Typo(AsynchronousDistributedTrainer):
        def allocate_worker(self):
            return MyWorker(self.master_model)

        def allocate_parameter_server(self):
            return TypoParameterServer(self.master_model, self.master_port)

    trainer = Typo(keras_model=build_mlp(16), worker_optimizer="adam",
                   loss="categorical_crossentropy", num_workers=2, communication_window=2)
    monkeypatch.setattr(launch, "new_job_tag", lambda run: "distkeras-test-typo-server")
    with pytest.raises(TrainingError,
                       match=r"The TypoParameterServer failed: KeyError: 'deltaa'"):
        trainer.train(fashion_train.limit(256), verbose=0)
    tracker = fashion_train.sparkSession.sparkContext.statusTracker()
    attempts = [tracker.getStageInfo(stage) for job in
                fashion_train.sparkSession.sparkContext._jsc.sc().statusTracker()
                .getJobIdsForTag("distkeras-test-typo-server")
                for stage in tracker.getJobInfo(job).stageIds]
    # Each worker's first attempt at most (cancelled): none retried.
    assert sum(stage.numFailedTasks for stage in attempts if stage is not None) <= 2
