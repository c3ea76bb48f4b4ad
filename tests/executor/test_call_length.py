"""How many steps a compiled call runs: chosen per model by timing (`jax_steps.CallLength`)."""

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from distkeras.executor import jax_steps  # noqa: E402
from distkeras.executor.jax_steps import CallLength  # noqa: E402
from distkeras.executor.replica import ModelReplica  # noqa: E402
from distkeras.workers import Worker  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX backend only")


class ScriptedClock:
    """Stands in for `_ready_time` (counting the calls, each a wait) and `_now`."""

    def __init__(self, step_seconds, window_step_seconds, compile_seconds=0.5):
        self.now = 0.0
        self.step_seconds, self.window_step_seconds = step_seconds, window_step_seconds
        self.compile_seconds = compile_seconds
        self.calls = 0
        self.steps = 0

    def __call__(self, state):
        self.calls += 1
        return self.now

    def install(self, monkeypatch):
        monkeypatch.setattr(jax_steps, "_ready_time", self)
        monkeypatch.setattr(jax_steps, "_now", lambda: self.now)


def _drive(choice, clock, steps, windows, window_length=6):
    """Runs ``steps`` single steps, then ``windows`` windows while the choice wants them,
    advancing the scripted clock by their durations; returns the windows run in one call."""
    for _ in range(steps):
        choice.before_step()
        clock.now += clock.compile_seconds if clock.steps == 0 else clock.step_seconds
        clock.steps += 1
        choice.after_step(None)
    ran = 0
    for _ in range(windows):
        if not choice.wants_one_call():
            break
        choice.before_window(None)
        clock.now += clock.window_step_seconds * window_length
        choice.after_window(None, window_length)
        ran += 1
    return ran


@pytest.mark.parametrize("step_ms, window_step_ms, compile_s, expected, tried", [
    (20.0, 1.0, 0.5, False, False),  # long steps (a convolution): no scan is even tried
    (1.0, 0.5, 0.5, True, True),     # short steps that a scan runs faster: kept
    (1.0, 0.5, 4.0, False, False),   # a compile too long for a trial to pay (a Transformer)
    (1.0, 0.95, 0.5, False, True),   # a scan that saves under 10%: not worth it
    (1.0, 2.0, 0.5, False, True),    # a scan slower than single steps: dropped
])
def test_the_choice_follows_the_measured_times(monkeypatch, step_ms, window_step_ms,
                                               compile_s, expected, tried):
    clock = ScriptedClock(step_ms / 1000, window_step_ms / 1000, compile_s)
    clock.install(monkeypatch)
    choice = CallLength()
    assert choice.wants_one_call() is False  # single steps first, to time them
    settle_and_time = 1 + CallLength.SETTLE_STEPS + CallLength.TIMED_STEPS
    _drive(choice, clock, settle_and_time, windows=3)
    assert choice.compile_seconds == pytest.approx(compile_s)
    assert choice.step_seconds == pytest.approx(step_ms / 1000)
    assert choice.one_call is expected
    assert choice.wants_one_call() is expected
    # Three waits for the steps (the compile, the timed span), two more for a trial window.
    assert clock.calls == (5 if tried else 3)
    calls = clock.calls
    _drive(choice, clock, 20, windows=3)
    assert clock.calls == calls  # decided: never blocks again


def test_a_fixed_choice_is_never_timed(monkeypatch):
    clock = ScriptedClock(0.001, 0.0001)
    clock.install(monkeypatch)
    for fixed in (True, False):
        choice = CallLength(fixed)
        _drive(choice, clock, 30, windows=3)
        assert choice.wants_one_call() is fixed and clock.calls == 0


def _model(steps_per_execution=1):
    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="adam", loss="categorical_crossentropy",
                  steps_per_execution=steps_per_execution)
    return model


def _batches(count):
    rng = np.random.default_rng(1)
    return [(rng.normal(size=(16, 6)).astype("float32"),
             np.eye(3, dtype="float32")[rng.integers(0, 3, 16)]) for _ in range(count)]


def test_steps_per_execution_above_one_runs_windows_in_one_call():
    replica = ModelReplica(_model(steps_per_execution=4), lambda logs, size: None)
    assert replica.prefers_window(_batches(4))
    replica = ModelReplica(_model(), lambda logs, size: None)
    assert not replica.prefers_window(_batches(4))  # undecided: single steps first


class RecordingWorker(Worker):
    """A worker whose steps are recorded as one call per window or one per step."""

    def __init__(self, model):
        super().__init__(model)
        self.calls = []
        self.model = ModelReplica(model, lambda logs, size: self.calls.append("step"),
                                  lambda logs, size, count: self.calls.append(count))


@pytest.mark.parametrize("one_call", [True, False])
def test_a_worker_trains_the_same_weights_either_way(one_call):
    """Whatever the choice, the worker's steps are the same steps (to float tolerance)."""
    worker = RecordingWorker(_model())
    worker.model._fast_step.call_length = CallLength(one_call)
    for start in range(0, 12, 6):
        worker.train_steps(_batches(12)[start:start + 6])
    assert worker.iteration == 13
    assert worker.calls == ([6, 6] if one_call else ["step"] * 12)
    reference = _model()
    for x, y in _batches(12):
        reference.train_on_batch(x, y)
    for mine, theirs in zip(worker.model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)


def test_a_real_model_times_its_steps_and_decides():
    """On a real model the choice is made after a bounded number of steps, and stays."""
    worker = RecordingWorker(_model())
    batches = _batches(6)
    for _ in range(8):
        worker.train_steps(batches)
    choice = worker.model._fast_step.call_length
    assert choice.step_seconds is not None and choice.one_call in (True, False)
    if choice.one_call:
        assert choice.window_step_seconds < choice.step_seconds
    assert worker.calls[-1] == (6 if choice.one_call else "step")
