"""Per-step history: compact on the worker, and any number of steps fits in one frame."""

import math

from distkeras import networking, workers


def test_long_history_travels_in_one_frame():
    log = workers.HistoryLog()
    for step in range(50_000):  # far beyond what a JSON header may hold
        record = {"worker_id": 3, "iteration": step + 1, "timestamp": 1.5e9 + step,
                  "batch_size": 32, "loss": 1.0 / (step + 1)}
        if step % 2:
            record["accuracy"] = 0.5
        log.append(record)
    message = {"worker_id": 3, **workers.pack_history(log.drain())}
    decoded = networking.decode_message(networking.encode_message(message))
    records = workers.history_records(workers.unpack_history(decoded))
    assert len(records) == 50_000
    assert records[0] == {"worker_id": 3, "iteration": 1, "timestamp": 1.5e9,
                          "batch_size": 32, "loss": 1.0}
    assert records[1]["accuracy"] == 0.5 and "accuracy" not in records[2]
    assert math.isclose(records[-1]["loss"], 1.0 / 50_000)
    assert log.size == 0 and log.columns == {}


def test_empty_history_round_trips():
    decoded = networking.decode_message(networking.encode_message(
        {"worker_id": 0, **workers.pack_history({})}))
    assert workers.history_records(workers.unpack_history(decoded)) == []


def test_a_loss_that_became_nan_stays_nan_and_a_missing_metric_stays_missing():
    """A diverged step's loss is NaN in the history, not a record without a loss."""
    log = workers.HistoryLog()
    log.append({"worker_id": 0, "iteration": 1, "batch_size": 32, "loss": 2.5,
                "accuracy": 0.25})
    log.append({"worker_id": 0, "iteration": 2, "batch_size": 32, "loss": float("nan")})
    decoded = networking.decode_message(networking.encode_message(
        {"worker_id": 0, **workers.pack_history(log.drain())}))
    first, second = workers.history_records(workers.unpack_history(decoded))
    assert first["loss"] == 2.5 and first["accuracy"] == 0.25
    assert math.isnan(second["loss"]) and "accuracy" not in second
