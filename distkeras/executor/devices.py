"""The GPUs Spark assigned a task, made the only ones its Keras backend sees.

A task given GPUs (``spark.task.resource.gpu.amount``) sets ``CUDA_VISIBLE_DEVICES`` to
them before Keras (and JAX, torch or TensorFlow) loads in its Python worker, and puts it
back afterwards: PySpark reuses that process for later tasks, which may be given other
GPUs. A process whose Keras already loaded with other GPUs visible cannot change them;
the task's work then runs in a fresh child process (`TaskDevices.call`), or, where it
cannot (prediction keeps its model in the process), is refused with what to change. A
task given no GPU changes nothing. See docs/gpus.md.
"""

import contextlib
import logging
import os
import re
import struct
import subprocess
import sys
import threading

from distkeras.errors import DistkerasError

logger = logging.getLogger(__name__)

CUDA_DEVICES = "CUDA_VISIBLE_DEVICES"
# Allocation on demand, so that tasks sharing a GPU (an amount below 1) do not each
# reserve most of it at start; a user's own setting (spark.executorEnv.*) is kept.
SHARING_SETTINGS = {
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",  # JAX takes 75% of the GPU at start without it
    "TF_FORCE_GPU_ALLOW_GROWTH": "true",  # TensorFlow maps nearly all of it without it
}
# Set by the user instead of the preallocation: JAX's share of the GPU.
JAX_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
_ADDRESS = re.compile(r"^(0|[1-9][0-9]*)$")

# The CUDA_VISIBLE_DEVICES this process's Keras loaded with, once a task that pinned
# devices saw it loaded ("" for none visible, None for all of them).
_LOADED = {}


class DeviceConflictError(DistkerasError, RuntimeError):
    """This Python process's Keras already runs on other GPUs than its task was given."""


def owned_devices(addresses, visible=None):
    """The ``CUDA_VISIBLE_DEVICES`` entries of the GPU ``addresses`` Spark assigned a task.

    As TorchDistributor maps them: where ``CUDA_VISIBLE_DEVICES`` is already set (by YARN,
    Kubernetes' device plugin or a container runtime), the addresses are indices into it;
    else they are the devices themselves.

    Args:
        addresses: The task's GPU addresses (``TaskContext.resources()["gpu"].addresses``).
        visible: The process's ``CUDA_VISIBLE_DEVICES`` (None: not set).

    Returns:
        A list of device entries (strings).

    Raises:
        ValueError: When an address is not a plain number, or indexes past ``visible``.
    """
    addresses = [str(address) for address in addresses]
    bad = [address for address in addresses if not _ADDRESS.match(address)]
    if bad:
        raise ValueError(
            f"Spark assigned this task the GPU addresses {addresses}; {bad} are not GPU "
            "indices (whole numbers, no leading zeros) as CUDA_VISIBLE_DEVICES takes them. "
            "Make the GPU discovery script (spark.executor.resource.gpu.discoveryScript) "
            "print indices, for example {\"name\": \"gpu\", \"addresses\": [\"0\", \"1\"]}.")
    if visible is None:
        return addresses
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    outside = [address for address in addresses if int(address) >= len(entries)]
    if outside:
        raise ValueError(
            f"Spark assigned this task the GPU addresses {addresses}, read as indices into "
            f"this executor's CUDA_VISIBLE_DEVICES={visible!r}, which has {len(entries)} "
            f"entries: {outside} are past its end. The discovery script must count the GPUs "
            "CUDA_VISIBLE_DEVICES lists, from 0 (Spark's getGpusResources.sh does).")
    return [entries[int(address)] for address in addresses]


def assigned_addresses():
    """The GPU addresses Spark assigned the running task; [] outside a task or with none."""
    from pyspark import TaskContext  # a Spark task's side only: the driver never calls it

    context = TaskContext.get()
    if context is None:
        return []
    gpus = context.resources().get("gpu")
    return list(gpus.addresses) if gpus is not None else []


def _loaded_with():
    """The CUDA_VISIBLE_DEVICES this process's Keras loaded with, or False if not loaded."""
    if "keras" not in sys.modules:
        return False
    return _LOADED.get("devices", os.environ.get(CUDA_DEVICES))


class TaskDevices:
    """What `task_devices` found: the devices of the task and whether its work must run in
    a fresh process (`call`)."""

    def __init__(self, devices, loaded_with):
        self.devices = devices  # the CUDA_VISIBLE_DEVICES value, None with no GPU assigned
        self.loaded_with = loaded_with  # the value Keras here loaded with (False: not yet)
        self.needs_child = devices is not None and loaded_with is not False and \
            loaded_with != devices

    def refuse_if_needs_child(self):
        """Raises `DeviceConflictError` when Keras here already runs on other GPUs (the
        task side that cannot run its work in a child process calls this)."""
        if self.needs_child:
            raise DeviceConflictError(
                f"This task was assigned the GPUs CUDA_VISIBLE_DEVICES={self.devices} but "
                "its Python worker process, which Spark reuses between tasks, already "
                f"loaded Keras with CUDA_VISIBLE_DEVICES={self.loaded_with}, which cannot "
                "change in a running process. Set spark.python.worker.reuse=false (a fresh "
                "Python process per task), or give each executor one GPU "
                "(spark.executor.resource.gpu.amount=1).")

    def call(self, function, batches):
        """``function(batches)``, here, or in a fresh Python process where Keras here
        already runs on other GPUs (`run_in_child`)."""
        if not self.needs_child:
            return function(batches)
        logger.info("Keras in this Python worker runs on CUDA_VISIBLE_DEVICES=%s; this "
                    "task's GPUs are %s: training in a fresh child process.",
                    self.loaded_with, self.devices)
        return run_in_child(function, batches)


@contextlib.contextmanager
def task_devices(addresses=None):
    """Makes the GPUs Spark assigned the running task the only ones its backend sees, for
    the block; the first thing a task side does.

    Sets ``CUDA_VISIBLE_DEVICES`` (`owned_devices`) and on-demand GPU memory
    (`SHARING_SETTINGS`, unless the user set those or ``XLA_PYTHON_CLIENT_MEM_FRACTION``),
    and restores the environment after the block. A task given no GPU changes nothing.

    Args:
        addresses: The task's GPU addresses; None reads them from Spark's `TaskContext`.

    Yields:
        A `TaskDevices`.

    Raises:
        ValueError: When the addresses do not name devices (`owned_devices`).
    """
    if addresses is None:
        addresses = assigned_addresses()
    if not addresses:
        yield TaskDevices(None, _loaded_with())
        return
    devices = ",".join(owned_devices(addresses, os.environ.get(CUDA_DEVICES)))
    found = TaskDevices(devices, _loaded_with())
    settings = {CUDA_DEVICES: devices}
    settings.update((name, value) for name, value in SHARING_SETTINGS.items()
                    if name not in os.environ)
    if JAX_FRACTION in os.environ:  # the user's share of the GPU, preallocated
        settings.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    logger.debug("Task devices: CUDA_VISIBLE_DEVICES=%s (addresses %s)", devices, addresses)
    try:
        yield found
    finally:
        if found.loaded_with is False and "keras" in sys.modules:
            _LOADED["devices"] = devices  # Keras loaded during this task, with these
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def keras_devices():
    """The devices Keras computes on in this process, in words (``"cpu:0"``,
    ``"cuda:0, cuda:1"``), by its backend; Keras must be loaded."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax  # the backend Keras loaded: no new import

        return ", ".join(f"{device.platform}:{device.id}" for device in jax.devices())
    if backend == "torch":
        import torch  # the backend Keras loaded: no new import

        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if backend == "tensorflow":
        import tensorflow as tf  # the backend Keras loaded: no new import

        gpus = tf.config.list_logical_devices("GPU")
        return ", ".join(gpu.name for gpu in gpus) if gpus else "cpu"
    return backend


def log_driver_devices(name):
    """Says, once a training starts, where its driver side computes: Keras's devices in
    this process (validation, BatchNormalization's statistics) and the CPU (the parameter
    server's numpy)."""
    logger.info("%s: the driver's Keras (validation, BatchNormalization's statistics) "
                "runs on %s; the parameter server's updates on the CPU (numpy). The workers "
                "run on the devices Spark gives their tasks.", name, keras_devices())


# -- a task's work in a fresh Python process ------------------------------------------

def _send_frame(stream, data):
    stream.write(struct.pack(">Q", len(data)))
    stream.write(data)
    stream.flush()


def _read_frame(stream):
    header = stream.read(8)
    if len(header) < 8:
        return None
    (size,) = struct.unpack(">Q", header)
    return stream.read(size)


def run_in_child(function, batches):
    """``function(batches)`` run in a fresh Python process: ``batches`` (Arrow record
    batches) stream to it over a pipe, and its result or exception comes back.

    The child inherits this process's environment (its CUDA_VISIBLE_DEVICES), its
    ``sys.path`` and its Spark `TaskContext`; the pipes are local to the machine (the
    function and its result travel as cloudpickle, as Spark ships the function itself).

    Raises:
        The child's exception, or `DistkerasError` when the child died without one.
    """
    import json

    from pyspark import TaskContext, cloudpickle  # what Spark ships tasks with

    context = TaskContext.get()  # the child's too: workers read their attempt from it
    context = None if context is None else (type(context), dict(vars(context)))
    read_result, write_result = os.pipe()
    boot = ("import sys; sys.path[:0] = __import__('json').loads(sys.argv[1]); "
            "from distkeras.executor.devices import child_main; child_main(int(sys.argv[2]))")
    child = subprocess.Popen([sys.executable, "-c", boot, json.dumps(sys.path),
                              str(write_result)],
                             stdin=subprocess.PIPE, pass_fds=(write_result,))
    os.close(write_result)
    reply = {}
    with os.fdopen(read_result, "rb") as results:
        reader = threading.Thread(target=lambda: reply.update(frame=_read_frame(results)),
                                  daemon=True)
        reader.start()
        try:
            _send_frame(child.stdin, cloudpickle.dumps((function, context)))
            _send_batches(child.stdin, batches)
        except BrokenPipeError:  # the child stopped reading: its reply says why
            pass
        finally:
            with contextlib.suppress(BrokenPipeError):
                child.stdin.close()
        reader.join()
    code = child.wait()
    frame = reply.get("frame")
    if frame is None:
        raise DistkerasError(f"The child process that trained this task's GPUs exited "
                             f"with code {code} and no result (the executor's log says why).")
    try:
        kind, value = cloudpickle.loads(frame)
    except Exception as error:  # an exception class that cannot be rebuilt here
        raise DistkerasError(f"The child process's result could not be read: {error}") \
            from error
    if kind == "error":
        raise value
    return value


def _send_batches(stream, batches):
    """Writes ``batches``, each an Arrow record batch or None (`epochs.EPOCH_END`), as
    tagged frames, then the end."""
    import pyarrow as pa

    for batch in batches:
        if batch is None:
            stream.write(b"N")
            continue
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        stream.write(b"B")
        _send_frame(stream, sink.getvalue())
    stream.write(b".")
    stream.flush()


def _received_batches(stream):
    import pyarrow as pa

    while True:
        tag = stream.read(1)
        if tag == b"N":
            yield None
        elif tag == b"B":
            yield pa.ipc.open_stream(_read_frame(stream)).read_next_batch()
        else:  # the end, or a parent that went away
            return


def child_main(result_fd):
    """The child's side of `run_in_child`: reads the function, runs it on the batches that
    follow on stdin, writes ``("ok", result)`` or ``("error", exception)`` to
    ``result_fd``."""
    from pyspark import TaskContext, cloudpickle  # the parent sends the function with it

    _die_with_parent()
    source = sys.stdin.buffer
    frame = _read_frame(source)
    if frame is None:  # the parent failed before it sent the function: it raises why
        return
    function, context = cloudpickle.loads(frame)
    if context is not None:  # the parent's task, as `TaskContext.get()` returns it
        kind, state = context
        task = object.__new__(kind)
        vars(task).update(state)
        TaskContext._setTaskContext(task)
    try:
        reply = ("ok", function(_received_batches(source)))
    except Exception as error:  # all of them go back to the parent, which raises them
        reply = ("error", error)
    try:
        frame = cloudpickle.dumps(reply)
    except Exception as error:  # an exception that does not pickle: its text goes back
        frame = cloudpickle.dumps(("error", DistkerasError(f"{type(reply[1]).__name__}: "
                                                           f"{reply[1]} ({error})")))
    with os.fdopen(result_fd, "wb") as results:
        _send_frame(results, frame)


def _die_with_parent():
    """Asks Linux to kill this child when its parent (the task's Python worker, which
    Spark kills to cancel a task) dies; elsewhere the child ends with its input."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError) as error:  # not Linux
        logger.debug("The child is not tied to its parent: %s", error)
