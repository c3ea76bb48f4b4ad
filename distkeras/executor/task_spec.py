"""What a Spark task needs to train one partition: one immutable `TaskSpec`.

The driver builds the spec (the trainer's `_configure_worker`, then the server's address
once it listens) and Spark ships it, with the worker that holds it, to the executors in
the task's closure (cloudpickle). Nothing in it travels over the parameter server's
socket, which carries no pickle.

A worker reads its settings from its spec. Its dist-keras attribute names
(``worker.batch_size``, ``worker.token``, ...) stay, as `SpecSetting` descriptors: reading
one reads the spec, and setting one (seed 000's and dist-keras's scripts do) replaces the
spec by a copy where that field holds the new value.
"""

import dataclasses
import numbers
from typing import Any, Optional


def _positive_int(name, value):
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"TaskSpec.{name} must be a positive integer or None. "
                         f"Received: {value!r}")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """Everything a worker's Spark task is told by the driver, frozen.

    None means "not set": a worker built alone (tests, seed 000's scripts) leaves most
    fields None, and the trainer fills them from its own settings (`filled`). Dict
    fields are the spec's own copies: read them, do not change them.

    Attributes:
        model_bytes: The model as the bytes of a `.keras` archive.
        optimizer: The worker's optimizer, serialized (name or Keras config).
        loss: The loss, serialized.
        loss_weights: Loss weights for multi-output models.
        metrics: The metrics, serialized.
        weighted_metrics: The compiled model's weighted metrics, serialized.
        execution_options: The compiled model's ``jit_compile``, ``run_eagerly`` and
            ``steps_per_execution``.
        custom_objects: The user's Keras objects by name (see `keras_io.custom_objects`).
        backend: The driver's Keras backend, selected on the executor before Keras loads.
        seed_states: The master model's seed generator states (see
            `model_state.seed_states`), which the `.keras` bytes do not hold.
        features_col: The input column, or a list of them for multi-input models.
        label_col: The target column, or a list of them for multi-output models.
        sample_weight_col: The column of per-row sample weights, or None.
        class_table: The class weights as a lookup table (see `data.feed`), or None.
        batch_size: Rows per minibatch.
        num_epoch: Passes over the data.
        learning_rate: For update rules that have one.
        workers_per_machine: Workers that share a machine (see `executor.affinity`).
        first_iterations: ``{worker_id: its first iteration}`` for trainers that run a job
            per epoch; None: each worker counts from its own ``iteration``.
        master_host: The parameter server's address, as executors reach it.
        master_port: The parameter server's port.
        token: The secret the worker presents to the driver's server (not in the repr).
        connect_timeout: Seconds to wait when connecting to the parameter server.
        progress_address: ``(host, port)`` of the driver's progress server, or None.
        communication_window: Local steps between two commits.
        overlap_communication: Exchange with the server while the next window trains.
        compression: The exchanges' compression, as `transport.compression.parse` reads
            it (``"bfloat16"``, ``"topk:0.01"``), or None.
        shard_ports: The ports of the parameter server's other shards (``master_port``
            serves the first), or None for one server (`transport.shard_layout`).
        history_every_seconds: How often the steps' records travel with the commits;
            None: the worker class's ``HISTORY_EVERY_SECONDS``.
        algorithm: The `algorithms.Algorithm` a windowed worker runs (its
            hyperparameters), or None.
        optimizer_state: The optimizer state a sequential worker starts from, or None.
        return_optimizer_state: Whether a sequential worker returns its optimizer state.
        seed: An ensemble member's seed (its index is added).
    """

    model_bytes: bytes = dataclasses.field(default=b"", repr=False)
    optimizer: Any = None
    loss: Any = None
    loss_weights: Any = None
    metrics: Any = None
    weighted_metrics: Any = None
    execution_options: dict = dataclasses.field(default_factory=dict)
    custom_objects: dict = dataclasses.field(default_factory=dict)
    backend: Optional[str] = None
    seed_states: Any = dataclasses.field(default=None, repr=False)
    features_col: Any = None
    label_col: Any = None
    sample_weight_col: Optional[str] = None
    class_table: Any = dataclasses.field(default=None, repr=False)
    batch_size: Optional[int] = None
    num_epoch: Optional[int] = None
    learning_rate: Optional[float] = None
    workers_per_machine: Optional[int] = None
    first_iterations: Optional[dict] = None
    master_host: Optional[str] = None
    master_port: Optional[int] = None
    token: Optional[str] = dataclasses.field(default=None, repr=False)
    connect_timeout: float = 60.0
    progress_address: Optional[tuple] = None
    communication_window: Optional[int] = None
    overlap_communication: bool = False
    compression: Optional[str] = None
    shard_ports: Optional[tuple] = None
    history_every_seconds: Optional[float] = None
    algorithm: Any = None
    optimizer_state: Any = dataclasses.field(default=None, repr=False)
    return_optimizer_state: bool = False
    seed: Optional[int] = None

    def __post_init__(self):
        if not isinstance(self.model_bytes, (bytes, bytearray)):
            raise TypeError("TaskSpec.model_bytes must be the bytes of a .keras archive "
                            "(distkeras.utils.serialize_model(model)). Received: "
                            f"{type(self.model_bytes).__name__}")
        for name in ("batch_size", "num_epoch", "communication_window"):
            _positive_int(name, getattr(self, name))
        for name in ("execution_options", "custom_objects"):
            if not isinstance(getattr(self, name), dict):
                raise TypeError(f"TaskSpec.{name} must be a dict. Received: "
                                f"{type(getattr(self, name)).__name__}")

    def replace(self, **changes):
        """A copy with ``changes`` (field names and values).

        Raises:
            TypeError: Naming a change that is no field of the spec.
        """
        self._check_names(changes)
        return dataclasses.replace(self, **changes)

    def filled(self, **defaults):
        """A copy where each field of ``defaults`` that is None here takes its value
        there: the trainer's settings for what the worker's constructor left unset."""
        self._check_names(defaults)
        return dataclasses.replace(self, **{name: value for name, value in defaults.items()
                                            if getattr(self, name) is None})

    @classmethod
    def _check_names(cls, values):
        unknown = sorted(set(values) - {field.name for field in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"TaskSpec has no field {', '.join(unknown)}; see "
                            "distkeras.executor.task_spec.TaskSpec for its fields.")


class SpecSetting:
    """A worker attribute that is a field of the worker's `TaskSpec`.

    Reading it reads ``worker.spec``; setting it replaces ``worker.spec`` by a copy where
    the field holds the new value (the spec itself never changes).

    Args:
        field: The spec's field; None: the attribute's own name.
    """

    def __init__(self, field=None):
        self.field = field

    def __set_name__(self, owner, name):
        if self.field is None:
            self.field = name

    def __get__(self, worker, owner=None):
        if worker is None:
            return self
        return getattr(worker.spec, self.field)

    def __set__(self, worker, value):
        worker.spec = worker.spec.replace(**{self.field: value})
