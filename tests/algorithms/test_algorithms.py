"""The Algorithm API and the two algorithms written on it, DiLoCo and FedAdam.

Golden values for their server arithmetic (`update_rules`), each replayed exactly through
a real worker and a real parameter server on 127.0.0.1 (no Spark; the hand replay in
numpy, as tests/executor/test_workers.py does for the built-ins), and what one declaration of
hyperparameters gives: the trainer's constructor, `get_config`, checks, the command line's
flags and the registry.
"""

import inspect

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from distkeras import algorithms, trainers  # noqa: E402
from distkeras.algorithms import update_rules  # noqa: E402
from distkeras.training import registry  # noqa: E402 (its `metadata` is patched)
from distkeras.algorithms import Algorithm, Hyperparameter  # noqa: E402
from distkeras.executor.windowed import WindowedWorker  # noqa: E402
from distkeras.transport.networking import weights_array  # noqa: E402
from distkeras.transport.parameter_servers import AlgorithmServer  # noqa: E402
from replay_support import (  # noqa: E402
    LEARNING_RATE, assert_close, checkpoint_weights, get, keras_copy, minus, observed,
    others_commit, run_worker, windows)
from worker_support import small_model  # noqa: E402

F32 = np.float32


def w(*layers):
    return weights_array([np.array(layer, F32) for layer in layers])


# -- golden arithmetic -------------------------------------------------------------------


def test_nesterov_outer_step_golden():
    center, delta = w([1.0, 2.0], [4.0]), w([0.5, -1.0], [2.0])
    # g = -0.5 * delta = [-0.25, 0.5]; v = g; C -= 0.5 * (0.5 * v + g) = [-0.1875, 0.375].
    # The second weight is not trainable: C - g, no momentum.
    first, velocity = update_rules.nesterov_outer_step(center, delta, None, 0.5, 0.5, 0.5,
                                                       [True, False])
    assert [layer.tolist() for layer in first] == [[1.1875, 1.625], [5.0]]
    assert velocity[0].tolist() == [-0.25, 0.5]
    # g = [-1, 0]; v = 0.5 * v + g = [-1.125, 0.25]; step 0.5 * (0.5 v + g).
    second, velocity = update_rules.nesterov_outer_step(first, w([1.0, 0.0], [0.0]),
                                                        velocity, 0.5, 0.5, 1.0,
                                                        [True, False])
    assert [layer.tolist() for layer in second] == [[1.96875, 1.5625], [5.0]]
    assert velocity[0].tolist() == [-1.125, 0.25]
    assert all(layer.dtype == F32 for layer in second)
    assert center[0].tolist() == [1.0, 2.0]  # arguments left as they were


def test_adam_outer_step_golden():
    center, delta = w([1.0, -1.0], [4.0]), w([0.5, -0.5], [2.0])
    # m = 0.5 * delta; v = 0.25 * delta**2 = 0.0625; C += 0.25 * m / (0.25 + 0.25).
    first, moments = update_rules.adam_outer_step(center, delta, None, 0.25, 0.5, 0.75, 0.25,
                                                  trainable=[True, False])
    assert [layer.tolist() for layer in first] == [[1.125, -1.125], [6.0]]
    assert moments[0][0].tolist() == [0.25, -0.25]
    assert moments[1][0].tolist() == [0.0625, 0.0625]
    second, _ = update_rules.adam_outer_step(first, w([-1.0, 0.0], [0.0]), moments,
                                             0.25, 0.5, 0.75, 0.25)
    m = np.array([0.125 - 0.5, -0.125])
    v = np.array([0.75 * 0.0625 + 0.25, 0.75 * 0.0625])
    np.testing.assert_allclose(second[0], [1.125, -1.125] + 0.25 * m / (np.sqrt(v) + 0.25),
                               rtol=1e-6)
    assert second[0].dtype == F32
    # A staleness discount of 0.5 scales a trainable weight's change before the moments
    # (d = 1, m = 1, v = 0.25 * 1, C += 0.5 * 1 / (0.5 + 0.5)); a non-trainable one whole.
    third, (m, v) = update_rules.adam_outer_step(w([0.0], [1.0]), w([2.0], [2.0]), None, 0.5,
                                                 0.0, 0.75, 0.5, 0.5, [True, False])
    assert [layer.tolist() for layer in third] == [[0.5], [3.0]]
    assert (m[0].tolist(), v[0].tolist()) == ([1.0], [0.25])


# -- through a real worker and server -------------------------------------------------


def train(algorithm, others=None):
    model = small_model()
    model.set_weights(list(checkpoint_weights()))
    server = observed(AlgorithmServer, others)(model, algorithm=algorithm)
    return server, run_worker(server, WindowedWorker,
                              keras.optimizers.Adam(LEARNING_RATE), algorithm=algorithm)


def replay(rule, others):
    """Trains each window from the pulled center, commits ``W - S``, and the center
    becomes ``rule(center, change, staleness, state)``; the worker goes on from it."""
    model = keras_copy()
    center, count = list(checkpoint_weights()), 0
    start, pulled_count = center, count
    if others is not None:
        center, count = [c + p for c, p in zip(center, others)], count + 1
    model.set_weights(start)
    state, commits = {}, []
    for window in windows():
        for x, y in window:
            model.train_on_batch(x, y)
        change = minus(get(model), start)
        center = rule(center, change, count - pulled_count, state)
        commits.append(change)
        count += 1
        start, pulled_count = center, count
        if others is not None:
            center, count = [c + p for c, p in zip(center, others)], count + 1
        model.set_weights(start)
    return center, get(model), commits


def diloco_by_hand(lr, mu):
    def rule(center, change, staleness, state):
        velocity = state.get("v", [np.zeros_like(c) for c in center])
        gradient = [-(d * F32(1.0 / (staleness + 1))) for d in change]
        velocity = [F32(mu) * v + g for v, g in zip(velocity, gradient)]
        state["v"] = velocity
        return [c - F32(lr) * (F32(mu) * v + g) for c, v, g in zip(center, velocity, gradient)]
    return rule


def fedadam_by_hand(lr, b1, b2, eps):
    def rule(center, change, staleness, state):
        change = [d * F32(1.0 / (staleness + 1)) for d in change]
        m = state.get("m", [np.zeros_like(c) for c in center])
        v = state.get("v", [np.zeros_like(c) for c in center])
        m = [F32(b1) * a + F32(1 - b1) * d for a, d in zip(m, change)]
        v = [F32(b2) * a + F32(1 - b2) * d * d for a, d in zip(v, change)]
        state["m"], state["v"] = m, v
        return [c + F32(lr) * a / (np.sqrt(b) + F32(eps)) for c, a, b in zip(center, m, v)]
    return rule


CASES = {
    "DiLoCo": (algorithms.DiLoCo(), diloco_by_hand(0.5, 0.5)),
    "FedAdam": (algorithms.FedAdam(), fedadam_by_hand(0.01, 0.0, 0.99, 0.01)),
}


@pytest.mark.parametrize("others", [None, others_commit()], ids=["alone", "others-commit"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_center_becomes_what_the_rule_says(name, others):
    algorithm, rule = CASES[name]
    server, worker = train(algorithm, others)
    want_center, want_weights, want_commits = replay(rule, others)
    sent = [update for update, _ in server.applied]
    assert len(sent) == len(want_commits) == len(windows())
    for index, (got, want) in enumerate(zip(sent, want_commits)):
        assert_close(got, want, f"commit {index}")
    assert [context.staleness for _, context in server.applied] == \
        [0 if others is None else 1] * len(sent)
    assert_close(server.center_variable, want_center, "the server's center")
    assert_close(worker.model.get_weights(), want_weights, "the worker's weights")


class HalfStep(Algorithm):
    """The tutorial's rule: commit half the window's change; the center adds it."""

    def commit(self, weights, pulled, context):
        return 0.5 * (weights - pulled)


def test_a_rule_in_a_few_lines_runs_through_the_framework_on_the_window_path():
    def rule(center, change, staleness, state):
        return [c + F32(0.5) * d for c, d in zip(center, change)]

    server, worker = train(HalfStep())
    assert not worker.has_own_step()  # its windows run in one compiled call on JAX
    want_center, want_weights, _ = replay(rule, None)
    assert_close(server.center_variable, want_center, "the server's center")
    assert_close(worker.model.get_weights(), want_weights, "the worker's weights")
    trainer = trainers.trainer_for(HalfStep)(small_model(), num_workers=3)
    assert type(trainer).__name__ == "HalfStepTrainer" and trainer.communication_window == 5
    assert isinstance(trainer.allocate_worker().algorithm, HalfStep)


def test_hyperparameters_declared_once_make_the_trainer_its_config_flags_and_checks():
    from distkeras import cli

    parameters = list(inspect.signature(trainers.DiLoCo.__init__).parameters)
    window = parameters.index("communication_window")
    assert parameters[window + 1:window + 3] == ["outer_learning_rate", "outer_momentum"]
    trainer = trainers.DiLoCo(small_model(), "adam", "categorical_crossentropy",
                              outer_momentum=0.25)
    assert trainer.communication_window == 20
    config = trainer.get_config()
    assert config["outer_learning_rate"] == 0.5 and config["outer_momentum"] == 0.25
    rebuilt = trainers.DiLoCo.from_config(config, keras_model=small_model())
    assert rebuilt.get_config() == config
    assert rebuilt.make_algorithm().outer_momentum == 0.25
    inner = trainers.DiLoCo(small_model(), "adam", "mse", learning_rate=0.25)
    assert inner._workers_optimizer()["config"]["learning_rate"] == 0.25
    options = cli.trainer_options(trainers.FedAdam)
    assert {"server_learning_rate": 0.01, "beta_1": 0.0, "beta_2": 0.99,
            "epsilon": 0.01}.items() <= options.items()
    for bad, match in [({"outer_momentum": 1.0}, "outer_momentum"),
                       ({"outer_learning_rate": -1}, "outer_learning_rate"),
                       ({"reuse_server_buffers": True}, "reuse_server_buffers")]:
        with pytest.raises(ValueError, match=match):
            trainers.DiLoCo(small_model(), "adam", "mse", **bad).validate_arguments()
    with pytest.raises(TypeError, match="no hyperparameter beta_3; it has: "
                                        "server_learning_rate, beta_1, beta_2, epsilon"):
        algorithms.FedAdam(beta_3=0.5)


def test_the_registry_runs_the_new_trainers_and_algorithm_plug_ins(monkeypatch):
    assert registry.get_trainer_class("DiLoCo") is trainers.DiLoCo
    assert registry.get_trainer_class("FedAdam") is trainers.FedAdam

    class EntryPoint:
        name = "HalfStep"

        @staticmethod
        def load():
            return HalfStep

    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: [EntryPoint])
    plugged = registry.get_trainer_class("HalfStep")
    assert issubclass(plugged, trainers.AlgorithmTrainer) and plugged.algorithm is HalfStep


def test_hyperparameter_is_a_declaration():
    parameter = Hyperparameter("rho", 5.0)
    assert parameter.check is None and parameter.doc == ""
    assert algorithms.AEASGD().get_config() == {"rho": 5.0, "learning_rate": 0.1}


@pytest.mark.parametrize("name, overlaps", [
    ("DOWNPOUR", True), ("ADAG", True), ("DynSGD", True), ("DiLoCo", True),
    ("FedAdam", True), ("AEASGD", False), ("EAMSGD", False), ("Experimental", False)])
def test_only_algorithms_that_commit_then_pull_their_update_alone_overlap(name, overlaps):
    """AEASGD pulls first; Experimental's overlapped commit would lack the center it
    pulled, which its server needs: both are refused on the driver."""
    trainer = getattr(trainers, name)(small_model(), "adam", "mse",
                                      overlap_communication=True)
    worker = trainer.allocate_worker()
    worker.overlap_communication = True
    assert getattr(algorithms, name)().overlaps is overlaps
    if overlaps:
        worker.check_overlap()
        return
    with pytest.raises(ValueError, match="cannot overlap communication"):
        worker.check_overlap()


def test_the_command_line_offers_each_hyperparameter_with_its_line_and_default(capsys):
    from distkeras import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--trainer", "DiLoCo", "--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for text in ("--outer-momentum OUTER_MOMENTUM the outer SGD's Nesterov momentum, in "
                 "[0, 1) (default: 0.5)", "--outer-learning-rate OUTER_LEARNING_RATE"):
        assert text in out
