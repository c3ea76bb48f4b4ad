"""Checkpoints of a training: the center variable and the update count (a parameter-server
training's, saved as it runs), and after an epoch its count and the optimizer's state
(AllReduceTrainer's, whose replicas are one model: its weights are the "center").

A checkpoint is one frame of the wire format (JSON header, raw arrays: no pickle) written
atomically through `distkeras.data.storage`, so it may live on any path the cluster's
filesystem understands (``hdfs://``, ``s3a://``, a local folder).
"""

import logging
import time

import numpy as np

from distkeras.data import storage
from distkeras.transport import networking

logger = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.dkc"


def checkpoint_path(folder):
    """The checkpoint file inside ``folder``."""
    return folder.rstrip("/") + "/" + CHECKPOINT_NAME


def save_checkpoint(folder, server, trainer_name, run_id=None):
    """Writes the server's center and update count (read under its lock), atomically;
    ``run_id`` names the run that wrote it (a retried Spark stage of that run resumes it)."""
    with server.mutex:
        center, num_updates = server.center_variable, server.num_updates
    message = {"center": center, "num_updates": num_updates, "trainer": trainer_name,
               "time": time.time()}
    if run_id is not None:
        message["run"] = run_id
    storage.write_bytes(checkpoint_path(folder), networking.encode_message(message))
    return num_updates


def save_epoch_checkpoint(folder, weights, optimizer_state, epoch, steps, trainer_name):
    """Writes the model's ``weights`` and ``optimizer_state`` after ``epoch`` epochs (and
    ``steps`` steps) atomically, as a checkpoint that `load_epoch_checkpoint` resumes (and
    a parameter-server trainer's ``resume`` can start from: its center is ``weights``)."""
    message = {"center": list(weights), "num_updates": int(steps), "epoch": int(epoch),
               "trainer": trainer_name, "time": time.time()}
    if optimizer_state:
        # A frame of its own: every list of arrays in the checkpoint's frame is checked
        # against the model's weights when it is read.
        message["optimizer"] = np.frombuffer(
            networking.encode_message({"state": list(optimizer_state)}), np.uint8)
    storage.write_bytes(checkpoint_path(folder), networking.encode_message(message))


def load_epoch_checkpoint(folder, weight_spec, trainer_name):
    """Reads the checkpoint in ``folder`` for a run that goes on after its epoch.

    Args:
        folder: The ``checkpoint_dir``.
        weight_spec: The model's ``(shape, dtype)`` per weight.
        trainer_name: The class name of the trainer resuming (a checkpoint written by
            another is resumed with a warning, from its epoch 0: it counts no epochs).

    Returns:
        ``(weights, optimizer_state or None, epochs done, steps done)``, or None when
        the folder holds no checkpoint.

    Raises:
        ValueError: If the checkpoint does not match the model, or is damaged.
    """
    checkpoint = load_checkpoint(folder, weight_spec)
    if checkpoint is None:
        return None
    written_by = checkpoint.get("trainer")
    if written_by and written_by != trainer_name:
        logger.warning("The checkpoint in %s was written by %s; resuming it with %s%s.",
                       folder, written_by, trainer_name,
                       "" if "epoch" in checkpoint else " from its weights, at epoch 1")
    optimizer_state = None
    if checkpoint.get("optimizer") is not None:
        data = checkpoint["optimizer"].tobytes()
        try:
            optimizer_state = list(networking.decode_message(
                data, max_frame_bytes=len(data) + 1)["state"])
        except (networking.ProtocolError, KeyError) as error:
            raise ValueError(
                f"The checkpoint {checkpoint_path(folder)} is damaged (its optimizer "
                f"state: {error!r}). Delete it to start from the model's weights, or put "
                "back a good copy to resume from.") from error
    return (list(checkpoint["center"]), optimizer_state, int(checkpoint.get("epoch", 0)),
            int(checkpoint.get("num_updates", 0)))


def load_checkpoint(folder, weight_spec):
    """Reads the checkpoint in ``folder``, checked against the model's shapes.

    Returns:
        The message dict (``center``, ``num_updates``, ``trainer``, ``time``), or None when
        the folder holds no checkpoint.

    Raises:
        ValueError: If the checkpoint does not match the model, or is damaged.
    """
    path = checkpoint_path(folder)
    try:
        data = storage.read_bytes(path)
    except FileNotFoundError:
        return None
    try:
        return networking.decode_message(data, max_frame_bytes=len(data) + 1,
                                         weight_spec=weight_spec)
    except networking.ProtocolError as error:
        _check_whole(path, data)
        raise ValueError(f"The checkpoint in {folder} does not fit this model: {error}") \
            from error


def _check_whole(path, data):
    """Refuses a checkpoint that is no whole frame, whatever the model: a file cut short
    (by a copy; our writes are atomic) is no other model's checkpoint.

    Raises:
        ValueError: Naming the file, and what to do with it.
    """
    try:
        networking.decode_message(data, max_frame_bytes=len(data) + 1)
    except networking.ProtocolError as error:
        raise ValueError(
            f"The checkpoint {path} is damaged ({error}): it is cut short or no distkeras "
            "checkpoint. Delete it to start from the model's weights, or put back a good "
            "copy to resume from.") from error


def restore(server, folder, trainer_name):
    """Puts the last checkpoint in ``folder`` (its center and update count) into a fresh
    ``server``; without one, warns and leaves the server at the model's weights.

    Args:
        server: A parameter server not yet started.
        folder: The ``checkpoint_dir``.
        trainer_name: The class name of the trainer resuming (a checkpoint written by
            another is resumed with a warning: its update rule differed).
    """
    shards = getattr(server, "shards", None)  # a sharded center's: all shards' weights
    checkpoint = load_checkpoint(folder, server.center.weight_spec if shards is None
                                 else shards.weight_spec)
    if checkpoint is None:
        logger.warning("No checkpoint in %s: starting from the model's weights.", folder)
        return
    written_by = checkpoint.get("trainer")
    if written_by and written_by != trainer_name:
        # The weights fit (they were checked), but the update rule that made them differs.
        logger.warning("The checkpoint in %s was written by %s; resuming it with %s.",
                       folder, written_by, trainer_name)
    server.center_variable = checkpoint["center"]
    server.num_updates = int(checkpoint["num_updates"])
    logger.info("Resuming from %s (%s updates)", folder, server.num_updates)
