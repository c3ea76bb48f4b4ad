"""A worker's links to a sharded center: one connection per shard, used in parallel.

A commit is split by key range (`shard_layout.split`) and each shard gets its slice,
with the update count that shard last answered (DynSGD's staleness is per shard); a pull
asks every shard and joins the slices into the model's dtypes (a bfloat16 pull's slices
become float32, exactly). A top-k commit's entries go to the shard whose keys hold them,
their indices rebased to its keys; the shards' sparse pull replies join into one when
each counts the same commits of this worker, else the worker pulls each shard's center.
Threads carry the other shards' exchanges: socket I/O releases the interpreter's lock.
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from distkeras.transport import compression as codecs
from distkeras.transport import networking
from distkeras.transport.shard_layout import is_layers, join, shard_layout, split

# The fields of a sparse (top-k) pull reply.
_SPARSE = ("indices", "values", "own")


class ShardLinks:
    """The connections of one worker to every shard of the center.

    Args:
        sockets: One authenticated `networking.Connection` per shard, shard 0's first
            (the worker's own, which also carries its history and goodbye).
        weight_spec: ``[(shape, dtype)]`` of the model's weights.
    """

    def __init__(self, sockets, weight_spec):
        self.sockets = list(sockets)
        self.weight_spec = weight_spec
        self.layout = shard_layout(weight_spec, len(self.sockets))
        self.last_updates = [0] * len(self.sockets)
        # Where each shard's keys start among the weights flattened end to end, and the end.
        starts = codecs.offsets(weight_spec)
        self.key_starts = np.array([int(starts[pieces[0][0]]) + pieces[0][1]
                                    for pieces in self.layout] + [int(starts[-1])], np.int64)
        self._pool = ThreadPoolExecutor(len(self.sockets) - 1,
                                        thread_name_prefix="distkeras-shard")

    def _each(self, exchange, shards=None):
        """``[exchange(k) for k in shards]``, shard 0 (when in) here, the others on the
        pool, all at once; raises the first error once all have ended."""
        shards = list(range(len(self.sockets))) if shards is None else shards
        futures = {shard: self._pool.submit(exchange, shard) for shard in shards if shard}
        results = {}
        error = None
        if 0 in shards:
            try:
                results[0] = exchange(0)
            except (OSError, networking.ProtocolError) as failure:
                error = failure
        for shard, future in futures.items():
            try:
                results[shard] = future.result()
            except (OSError, networking.ProtocolError) as failure:
                error = error or failure
        if error is not None:
            raise error
        return [results[shard] for shard in shards]

    def commit(self, message):
        """Sends each shard its slice of ``message`` (every field with one array per
        layer is split; ``last_update`` becomes that shard's)."""
        layers = len(self.weight_spec)
        indices = message.get("indices")
        bounds = None if indices is None else np.searchsorted(indices, self.key_starts)

        def send(shard):
            part = {name: split(value, self.layout[shard]) if is_layers(value, layers)
                    else value for name, value in message.items()}
            if "last_update" in part:
                part["last_update"] = self.last_updates[shard]
            if bounds is not None:  # top-k: this shard's entries, at its own keys
                begin, end = bounds[shard], bounds[shard + 1]
                part["indices"] = (indices[begin:end].astype(np.int64)
                                   - self.key_starts[shard]).astype(np.uint32)
                part["values"] = message["values"][begin:end]
            networking.send_action(self.sockets[shard], networking.ACTION_COMMIT)
            networking.send_data(self.sockets[shard], part)

        self._each(send)

    def pull(self, action):
        """Asks every shard with ``action`` (a pull, or a pull unless only this worker's
        commits moved it) and joins the replies.

        Returns:
            Shard 0's reply (its update count, the learning rate), with the joined
            ``center``, or a top-k run's joined sparse reply (``indices`` at the model's
            keys, ``values``, ``own``); or ``unchanged`` when every shard answered so. A
            shard that answered ``unchanged`` while another did not is asked again with
            a full pull (top-k: its reply joins the others' as one of no entries);
            sparse replies that do not join (their ``own`` counts differ, or another
            shard sent its center) are asked again for the center.
        """
        def ask(action):
            def exchange(shard):
                networking.send_action(self.sockets[shard], action)
                return networking.recv_data(self.sockets[shard])
            return exchange

        replies = self._each(ask(action))
        unchanged = [shard for shard, reply in enumerate(replies)
                     if reply.get("unchanged") is True]
        if unchanged and len(unchanged) < len(replies):
            if all("indices" in reply or shard in unchanged
                   for shard, reply in enumerate(replies)):
                # Top-k: a shard that only this worker's commits moved is a sparse reply
                # of no entries (the others' commits reach the shards at different times).
                for shard in unchanged:
                    reply = {name: value for name, value in replies[shard].items()
                             if name != "unchanged"}
                    replies[shard] = {**reply, "indices": np.zeros(0, np.uint32),
                                      "values": np.zeros(0, np.float32)}
                unchanged = []
            else:
                for shard, reply in zip(unchanged, self._each(ask(networking.ACTION_PULL),
                                                              unchanged)):
                    replies[shard] = reply
        sparse = [shard for shard, reply in enumerate(replies) if "indices" in reply]
        if sparse and not (len(sparse) == len(replies)
                           and len({replies[shard].get("own") for shard in sparse}) == 1):
            # Replies that do not join (a shard far behind, or one that refused a commit
            # the others applied): each shard's center instead.
            for shard, reply in zip(sparse, self._each(ask(networking.ACTION_PULL_CENTER),
                                                       sparse)):
                replies[shard] = reply
            sparse = []
        for shard, reply in enumerate(replies):
            self.last_updates[shard] = reply.get("num_updates", 0)
        joined = {name: value for name, value in replies[0].items() if name not in _SPARSE}
        if len(unchanged) == len(replies):
            return joined
        if sparse:
            joined["indices"] = np.concatenate(
                [(replies[shard]["indices"].astype(np.int64) + self.key_starts[shard])
                 .astype(np.uint32) for shard in sparse])
            joined["values"] = np.concatenate([replies[shard]["values"] for shard in sparse])
            joined["own"] = replies[0]["own"]
            return joined
        centers = [reply.get("center") for reply in replies]
        if any(center is None for center in centers):
            raise networking.ProtocolError("A shard's pull reply carries no center.")
        joined["center"] = join(centers, self.layout, self.weight_spec)
        return joined

    def goodbye(self):
        """Tells the other shards this worker is done (shard 0 is told by the worker)."""
        for sock in self.sockets[1:]:
            networking.send_action(sock, networking.ACTION_QUIT)

    def close(self):
        """Closes the other shards' connections (shard 0's is the worker's)."""
        for sock in self.sockets[1:]:
            networking.close_socket(sock)
        self._pool.shutdown(wait=False)
