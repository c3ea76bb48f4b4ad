"""The center variable: the weights a parameter server holds, its lock, and the pull and
commit exchanges that read and change it.

`CenterVariable` holds the weights, the lock and the update count (what every server of a
run has, the progress server too). `CenterExchange` adds what the pull and commit protocol
keeps: the pull itself, each commit's checks (shapes, finite values), its count and
staleness, and the refused ones. The commit itself is the server's
(`SocketParameterServer.commit_action`); `refusing_nonfinite` guards the rule it applies.

A server whose rule adds each commit to the center exactly as sent (``C += update``)
says so to `pull_unchanged`: a worker whose own commits are the only updates since its
last pull can then ask for the center "unless only mine changed it" and, when so, compute
it itself (``C_pull + update``, the same float32 additions), which saves sending the
weights back. That is every exchange of a lone worker.
"""

import collections
import contextlib
import sys
import threading

import numpy as np

from distkeras.errors import DistkerasError
from distkeras.transport import compression as codecs
from distkeras.transport import networking
from distkeras.transport.networking import send_data, weights_array
from distkeras.keras_io.archives import deserialize_model, serialize_model


class RefusedUpdate(DistkerasError):
    """A well-formed commit that is not applied (for example NaN or infinite values)."""


# Floating-point errors that make a rule's new center non-finite from finite operands: a
# float32 sum past 3.4e38 overflows to inf, and inf - inf or 0 * inf gives NaN. Raising
# costs nothing: numpy reads the FPU's flags after every ufunc anyway (to warn by default).
_NON_FINITE_ERRORS = {"over": "raise", "invalid": "raise"}


@contextlib.contextmanager
def refusing_nonfinite(allow_nonfinite=False):
    """Raises `RefusedUpdate` where the arithmetic inside overflows or gives NaN.

    Args:
        allow_nonfinite: Let it through instead (the epoch barrier's centers).

    Raises:
        RefusedUpdate: If a float operation inside overflowed or was invalid.
    """
    if allow_nonfinite:
        yield
        return
    try:
        with np.errstate(**_NON_FINITE_ERRORS):
            yield
    except FloatingPointError as error:
        raise RefusedUpdate(f"applying it would make the center non-finite ({error})") \
            from None


def _reference_counts(weights):
    """``sys.getrefcount`` of ``weights`` (an object array of layers) and of each layer."""
    return sys.getrefcount(weights), [sys.getrefcount(layer) for layer in weights]


def unshared(weights, unheld):
    """Whether nothing but its caller holds ``weights`` or any of its layers: no pull
    still sending it, no view of a layer, no epoch end or trainer keeping it.

    Args:
        weights: An object array of layers, held by one variable of the caller.
        unheld: ``weights_array([np.empty(0)])``, made by the caller and held the same way.

    Notes:
        CPython's reference counts, compared with those of ``unheld`` read the same way:
        what the interpreter itself counts (arguments, loop variables; fewer in newer
        versions) cancels out.
    """
    unheld_array, (unheld_layer,) = _reference_counts(unheld)
    array, layers = _reference_counts(weights)
    return array <= unheld_array and all(count <= unheld_layer for count in layers)


class CenterVariable:
    """Holds the center variable, its lock (``mutex``) and the update counter.

    Args:
        model: The master `keras.Model`; its weights are the initial center variable.
    """

    def __init__(self, model):
        self.model = model
        self.center_variable = weights_array(model.get_weights())
        self.num_updates = 0
        self.mutex = threading.RLock()
        self.weight_spec = [(weight.shape, weight.dtype) for weight in self.center_variable]
        model_bytes = sum(weight.nbytes for weight in self.center_variable)
        # Room for two copies of the weights (Experimental sends the delta and the center).
        self.max_frame_bytes = 2 * model_bytes + (1 << 20)

    def get_model(self):
        """Returns a copy of the master model holding the center variable."""
        model = deserialize_model(serialize_model(self.model))
        with self.mutex:
            model.set_weights(list(self.center_variable))
        return model


class CenterExchange(CenterVariable):
    """A center variable with what its pulls and commits keep; the server gives the rule.

    Args:
        model: The master `keras.Model`; its weights are the initial center variable.
    """

    def __init__(self, model):
        CenterVariable.__init__(self, model)
        self.staleness = []
        self.allow_nonfinite = False
        # The workers' optimizer learning rate that the driver's callbacks set
        # (ReduceLROnPlateau, LearningRateScheduler): sent with every pull once set.
        self.optimizer_learning_rate = None
        self.refused = 0
        self.refused_by_worker = {}  # worker id: commits refused (NaN, ...)
        # The run's `compression.Compression` (set by the server), the top-k commits of a
        # rule that adds them as sent (`log_sparse`), and the last bfloat16 pull.
        self.compression = None
        # A shard's top-k commits carry at most ``topk_counts`` entries, not exactly.
        self.topk_at_most = False
        self.sparse_log = None
        self._log_bytes = 0
        self._bfloat16_pull = (None, None)

    def prepare_connection(self, conn):
        """Sets a new connection's counts: the update it last pulled, and its commits
        since (applied, and received: a refused one is not applied)."""
        conn.last_pull_update = 0
        conn.own_updates = conn.own_commits = 0
        conn.counted = False
        conn.pulled = False

    def next_update(self, conn):
        """Counts one applied commit and records its staleness. Call under ``self.mutex``.

        Staleness is the number of updates by others since this worker's last pull.
        """
        self.staleness.append((conn.worker_id, self.num_updates - conn.last_pull_update))
        self.num_updates += 1
        conn.own_updates += 1
        conn.counted = True

    def model_update(self, update):
        """Checks that a commit's update is a list of arrays, one per layer.

        Lists of arrays were checked against the model's shapes and dtypes as they arrived;
        a single array or a number would broadcast into every layer (and could change their
        dtype), so they are refused.

        Raises:
            ProtocolError: If the update is not a list of arrays shaped like the model.
            RefusedUpdate: If it holds NaN or infinite values (unless ``allow_nonfinite``):
                the commit is dropped with a warning, the connection stays open.
        """
        if not (isinstance(update, np.ndarray) and update.dtype == object
                and len(update) == len(self.weight_spec)):
            raise networking.ProtocolError(
                "A commit must carry a list of arrays shaped like the model's weights.")
        if not self.allow_nonfinite and not all(np.isfinite(layer).all() for layer in update):
            raise RefusedUpdate("it holds NaN or infinite values")
        return update

    def compress(self, compression, adds_commits_as_sent):
        """Serves the pulls of a run with ``compression`` (a `compression.Compression`
        or None); a top-k run whose rule adds commits as sent logs them (`log_sparse`)."""
        self.compression = compression
        if compression is None:
            return
        self.topk_counts = codecs.topk_counts(compression, self.weight_spec)
        self.starts = codecs.offsets(self.weight_spec)
        if compression.kind == codecs.TOPK and adds_commits_as_sent:
            self.sparse_log = collections.deque()

    def handle_pull(self, conn, addr, sparse_allowed=True):
        """Sends the center variable and the update count read under one lock.

        With compression, the center travels as the run's compression says: bfloat16, or
        (top-k, a rule that adds commits as sent) only the other workers' top-k commits
        since this connection's last pull when those are fewer bytes (`sparse_since`)
        and ``sparse_allowed``.
        """
        with self.mutex:
            # Handlers replace the center variable, or change it in place only where
            # nothing else holds it (top-k), so this reference stays a consistent
            # snapshot after the lock is released.
            center = self.center_variable
            num_updates = self.num_updates
            sparse = self.sparse_since(conn, num_updates) if sparse_allowed else None
            own = conn.own_updates
            conn.last_pull_update = num_updates
            conn.own_updates = conn.own_commits = 0
            conn.pulled = True
        if sparse is not None:
            send_data(conn, self._pull_reply(num_updates=num_updates, indices=sparse[0],
                                             values=sparse[1], own=own))
            return
        # Rebound, not kept: a bfloat16 pull leaves the float32 center free while it
        # sends, for the next commit to write into (`center_writes.CenterWrites`).
        center = self._wire_center(center, num_updates)
        send_data(conn, self._pull_reply(center=center, num_updates=num_updates))

    def _wire_center(self, center, num_updates):
        """``center`` as a pull sends it: bfloat16 (`compression.truncated_bfloat16`)
        when the run's compression is, made once per update count."""
        if self.compression is None or self.compression.kind != codecs.BFLOAT16:
            return center
        with self.mutex:
            made_at, made = self._bfloat16_pull
        if made_at != num_updates:
            made = codecs.truncated_bfloat16(center)
            with self.mutex:
                self._bfloat16_pull = (num_updates, made)
        return made

    def log_sparse(self, conn, indices, values):
        """Keeps an applied top-k commit for the pulls of other workers; call under
        ``mutex`` before `next_update` counts it. The log keeps the latest commits up to
        the model's float32 bytes: a sparse reply is never larger than a full pull."""
        if self.sparse_log is None:
            return
        entry = (self.num_updates, conn, indices.copy(), values.copy())
        self.sparse_log.append(entry)
        self._log_bytes += indices.nbytes + values.nbytes
        while self._log_bytes > self._sparse_limit():
            _, _, old_indices, old_values = self.sparse_log.popleft()
            self._log_bytes -= old_indices.nbytes + old_values.nbytes

    def _sparse_limit(self):
        return sum(weight.nbytes for weight in self.center_variable)

    def sparse_since(self, conn, num_updates):
        """``(indices, values)`` of the other workers' top-k commits applied since
        ``conn``'s last pull, or None when a full pull must answer (its first pull, a
        refused commit of its own, commits no longer logged). Call under ``mutex``."""
        log = self.sparse_log
        if log is None or not conn.pulled or conn.own_updates != conn.own_commits:
            return None
        since = conn.last_pull_update
        if since < num_updates and (not log or log[0][0] > since):
            return None
        indices, values = [], []
        for number, owner, entry_indices, entry_values in reversed(log):
            if number < since:
                break
            if owner is not conn:
                indices.append(entry_indices)
                values.append(entry_values)
        if not indices:
            return np.zeros(0, np.uint32), np.zeros(0, np.float32)
        return np.concatenate(indices[::-1]), np.concatenate(values[::-1])

    def _pull_reply(self, **fields):
        """A pull's reply: ``fields``, and the workers' learning rate once the driver set
        one."""
        if self.optimizer_learning_rate is not None:
            fields["optimizer_learning_rate"] = float(self.optimizer_learning_rate)
        return fields

    def pull_unchanged(self, conn, commits_applied_as_sent):
        """Answers ``{"unchanged": True}`` without the weights when the center moved only
        by this connection's commits since its last pull, every one of them applied, and
        the server's rule adds commits as sent.

        Args:
            conn: The connection that asked.
            commits_applied_as_sent: Whether the server's rule is ``C += update``.

        Returns:
            Whether it answered; if not, the server answers with a full pull.
        """
        if not commits_applied_as_sent:
            return False
        with self.mutex:
            num_updates = self.num_updates
            own = conn.own_updates
            only_own = (num_updates - conn.last_pull_update == own
                        and own == conn.own_commits)
            if only_own:
                conn.pulled = True
                conn.last_pull_update = num_updates
                conn.own_updates = conn.own_commits = 0
        if only_own:
            fields = {"unchanged": True, "num_updates": num_updates}
            if self.sparse_log is not None:
                # Top-k: how many of the worker's commits it stands for (a sharded
                # center's worker joins it with other shards' sparse replies).
                fields["own"] = own
            send_data(conn, self._pull_reply(**fields))
        return only_own
