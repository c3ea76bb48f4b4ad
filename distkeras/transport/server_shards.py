"""A sharded center: shard 0 served in this process, each other shard by a child process
running the same server class on its slice (`shard_layout`).

Threads would share the interpreter's lock; processes give each shard its own core. A
shard IS a parameter server built on its slice (`shard_layout.SliceModel`): the same
transport, center, rule and checks, with its own lock, update count and staleness. The
children speak to the driver over a local pipe between parent and child
(multiprocessing's, never a network socket: the center's slice, its count, its handlers'
errors); workers reach every shard over TCP with the run's one token.

A child whose handler raises, or that exits while it should serve (killed, out of
memory), fails the run as a handler error of shard 0 does: a thread of the driver
watches every child, adds the error, naming the shard, to shard 0's transport's
``errors`` and calls its ``on_error`` (the trainer cancels the workers' Spark job).
"""

import multiprocessing
import threading
from multiprocessing.connection import wait

from distkeras.algorithms import update_rules
from distkeras.transport import compression as codecs
from distkeras.transport.networking import weights_array
from distkeras.transport.parameter_servers import AlgorithmServer
from distkeras.transport.shard_layout import SliceModel, join, shard_layout, split

# Seconds a child has to start serving (a spawned interpreter imports the server).
START_SECONDS = 120.0
# Seconds between the watcher's looks at whether the shards are stopping.
_WATCH_SECONDS = 0.2


def sharded_server(server_class, model, num_shards, master_port=0, **kwargs):
    """A parameter server of ``server_class`` over shard 0 of ``model``'s weights, whose
    ``shards`` (`ServerShards`) start the other shards when it starts.

    Args:
        server_class: An `AlgorithmServer` class whose rule is its algorithm's (not a
            `handle_commit` of its own).
        model: The master `keras.Model`.
        num_shards: Shards, 2 or more.
        master_port: Shard 0's port; the others' are picked by the OS.
        **kwargs: The server's other arguments (``reuse_buffers``, ``algorithm``).

    Raises:
        ValueError: If the server cannot be sharded (the escape hatch's own
            ``handle_commit``), or the layout leaves a shard empty.

    Notes:
        bfloat16 compression shards as float32 does: each shard reads and sends its
        slice in bfloat16. Top-k commits are split by key range (`ShardLinks`): each
        shard takes at most its pieces' share of each layer's entries.
    """
    if not (isinstance(server_class, type) and issubclass(server_class, AlgorithmServer)
            and server_class.handle_commit is AlgorithmServer.handle_commit):
        raise ValueError(
            f"{getattr(server_class, '__name__', server_class)} applies commits with a "
            "handle_commit of its own (the escape hatch), which reads whole-model commits: "
            "it cannot serve a shard. Use num_server_shards=1, or an algorithm's trainer.")
    weights = model.get_weights()
    spec = [(weight.shape, weight.dtype) for weight in weights]
    layout = shard_layout(spec, num_shards)
    flags = update_rules.trainable_flags(model)
    slices = [(split(weights, pieces), [flags[layer] for layer, _, _ in pieces])
              for pieces in layout]
    caps = topk_caps(codecs.parse(kwargs.get("compression")), spec, layout)
    server = server_class(SliceModel(*slices[0]), master_port, **kwargs)
    take_topk_parts(server, caps[0])
    server.shards = ServerShards(model, spec, layout, server_class, kwargs, slices[1:],
                                 caps[1:])
    return server


def topk_caps(compression, weight_spec, layout):
    """Per shard, the most entries of a top-k commit that each of its pieces can get
    (its layer's count, at most the piece's size); None per shard without top-k."""
    if compression is None or compression.kind != codecs.TOPK:
        return [None] * len(layout)
    counts = codecs.topk_counts(compression, weight_spec)
    return [[min(stop - start, counts[layer]) for layer, start, stop in pieces]
            for pieces in layout]


def take_topk_parts(server, caps):
    """Makes a shard's server take its part of each top-k commit: at most ``caps``."""
    if caps is not None:
        server.center.topk_counts = caps
        server.center.topk_at_most = True


class ServerShards:
    """The other shards of a sharded center, as child processes: started, read, written
    and stopped with the server that holds this part (shard 0's).

    Args:
        model: The master `keras.Model` (the final model's architecture).
        weight_spec: ``[(shape, dtype)]`` of its weights.
        layout: `shard_layout` of its weights.
        server_class: The server class every shard runs.
        kwargs: Its arguments besides the model and the port.
        slices: ``(pieces, trainable flags)`` of shards 1 to S-1.
        caps: `topk_caps` of shards 1 to S-1.

    Notes:
        While no child runs (before `start`, after `stop`) the children's slices and
        counts are kept here: a checkpoint restored before the start reaches them, and
        the final model is read after the stop.
    """

    def __init__(self, model, weight_spec, layout, server_class, kwargs, slices, caps):
        self.model = model
        self.weight_spec = weight_spec
        self.layout = layout
        self._server_class = server_class
        self._kwargs = kwargs
        self._flags = [flags for _, flags in slices]
        self._caps = caps
        self._kept = [(list(weights), 0) for weights, _ in slices]  # while none runs
        self._children = []  # (process, pipe)
        self._reports = []  # per child, the pipe its handlers' errors come back on
        self._watcher = None
        self._stopping = threading.Event()
        self.ports = ()

    def start(self, transport, num_updates):
        """Starts the children, each serving its slice where ``transport`` (shard 0's
        `SocketTransport`) serves, with its token, from ``num_updates`` updates."""
        context = multiprocessing.get_context("spawn")
        host, token = transport.host, transport.token
        max_pending_handshakes = transport.max_pending_handshakes
        self._stopping.clear()
        for (weights, _), flags, caps in zip(self._kept, self._flags, self._caps):
            parent, child = context.Pipe()
            reports, reporter = context.Pipe(duplex=False)
            process = context.Process(
                target=_serve_shard, daemon=True, name="distkeras-shard",
                args=(child, reporter, self._server_class, (weights, flags, caps),
                      num_updates, self._kwargs, host, token, max_pending_handshakes))
            process.start()
            child.close()
            reporter.close()
            self._children.append((process, parent))
            self._reports.append(reports)
        ports = []
        for process, pipe in self._children:
            if not pipe.poll(START_SECONDS):
                raise RuntimeError(f"A parameter server shard did not start within "
                                   f"{START_SECONDS:.0f} s (pid {process.pid}).")
            try:
                reply = pipe.recv()
            except EOFError:
                process.join(timeout=10.0)
                raise RuntimeError(
                    f"A parameter server shard exited as it started (exit code "
                    f"{process.exitcode}). Each shard is a spawned Python process, which "
                    "imports the driver's main script: start the training under "
                    "`if __name__ == \"__main__\":` there, as multiprocessing requires, or "
                    "use num_server_shards=1.") from None
            if isinstance(reply, str):
                raise RuntimeError(f"A parameter server shard failed to start: {reply}")
            ports.append(reply)
        self.ports = tuple(ports)
        self._watcher = threading.Thread(target=self._watch, args=(transport,), daemon=True,
                                         name="distkeras-shard-watch")
        self._watcher.start()

    def _watch(self, transport):
        """Until the shards stop: each child's handler error, and a child's exit, become
        an error of ``transport`` (shard 0's), told to its ``on_error`` as it happens."""
        sentinels = {process.sentinel: shard for shard, (process, _)
                     in enumerate(self._children, start=1)}
        reports = {pipe: shard for shard, pipe in enumerate(self._reports, start=1)}
        while not self._stopping.is_set() and (sentinels or reports):
            for ready in wait(list(reports) + list(sentinels), _WATCH_SECONDS):
                if self._stopping.is_set():
                    return
                if ready in reports:
                    try:
                        message = ready.recv()
                    except (EOFError, OSError):  # the child has gone: its sentinel tells
                        del reports[ready]
                        continue
                    self._fail(transport, self._shard_error(reports[ready], message))
                elif ready in sentinels:
                    shard = sentinels.pop(ready)
                    process = self._children[shard - 1][0]
                    process.join(timeout=1.0)
                    self._fail(transport, self._shard_error(shard, _exited(process.exitcode)))

    def _shard_error(self, shard, cause):
        """The error of child ``shard`` (1 to S-1), naming it."""
        pid = self._children[shard - 1][0].pid
        return f"parameter server shard {shard} of {len(self._children) + 1} (pid {pid}): " \
            f"{cause}"

    @staticmethod
    def _fail(transport, error):
        with transport.lock:
            transport.errors.append(error)
        if transport.on_error is not None:
            transport.on_error(error)

    def _ask(self, *command):
        """Each child's reply to ``command``.

        Raises:
            RuntimeError: If a child has exited (killed, or out of memory).
        """
        if not self._children:  # none runs: what they left, or will start from
            return list(self._kept) if command[0] == "get" else [None] * len(self._kept)
        try:
            for _, pipe in self._children:
                pipe.send(command)
            return [pipe.recv() for _, pipe in self._children]
        except (EOFError, OSError) as error:
            exited = [process.pid for process, _ in self._children if not process.is_alive()]
            raise RuntimeError(f"A parameter server shard has exited (pids {exited}): "
                               f"{type(error).__name__}: {error}") from error

    def pids(self):
        """The children's process ids (none before `start` or after `stop`)."""
        return [process.pid for process, _ in self._children]

    def counts(self):
        """Each child's update count (a commit reaches the shards one after another)."""
        return [count for _, count in self._ask("get")]

    def gather(self, own):
        """The whole center: ``own`` (shard 0's slice) joined with the children's."""
        return join([own] + [weights for weights, _ in self._ask("get")], self.layout,
                     self.weight_spec)

    def scatter(self, weights):
        """Gives every child its slice of ``weights``; returns shard 0's slice.

        Notes:
            The update count is shard 0's: the children start from it (a checkpoint's,
            restored before the start).
        """
        pieces = [[piece.copy() for piece in split(weights, own)] for own in self.layout[1:]]
        if not self._children:
            self._kept = [(new, count) for (_, count), new in zip(self._kept, pieces)]
        for (_, pipe), piece in zip(self._children, pieces):
            pipe.send(("set", piece))
        for _, pipe in self._children:
            pipe.recv()
        return weights_array(piece.copy() for piece in split(weights, self.layout[0]))

    def stop(self, grace_seconds=1.0):
        """Stops the children, keeping their last slices and counts; returns their
        handlers' errors."""
        if not self._children:
            return []
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None
        try:
            replies = self._ask("stop", grace_seconds)
        except RuntimeError as error:  # the run's error: the slices of that child are lost
            replies = None
            errors = [str(error)]
        # What the handlers reported that the watcher has not read.
        late = [self._shard_error(shard, message)
                for shard, pipe in enumerate(self._reports, start=1)
                for message in _unread(pipe)]
        for process, pipe in self._children:
            process.join(timeout=10.0)
            if process.is_alive():
                process.terminate()
            pipe.close()
        for pipe in self._reports:
            pipe.close()
        self._children, self._reports = [], []
        if replies is None:
            return errors + late
        self._kept = [(weights, count) for weights, count in replies]
        return late


def _exited(exitcode):
    """What a child's exit code says, for its error."""
    if exitcode is not None and exitcode < 0:
        return f"the process has exited (killed by signal {-exitcode})"
    return f"the process has exited (exit code {exitcode})"


def _unread(pipe):
    """The messages waiting in ``pipe`` (a closed one's included)."""
    messages = []
    try:
        while pipe.poll():
            messages.append(pipe.recv())
    except (EOFError, OSError):  # closed: nothing more
        pass
    return messages


def _serve_shard(pipe, reporter, server_class, piece, count, kwargs, host, token, pending):
    """A child's life: serve the slice (``piece``: its weights, trainable flags and
    `topk_caps`) until the driver says stop (the pipe's commands: ``get``, ``set``,
    ``stop``), telling ``reporter`` each handler's error."""
    weights, flags, caps = piece
    report_lock = threading.Lock()

    def report(error):
        with report_lock:  # the connections' threads report through one pipe
            reporter.send(error)

    try:
        server = server_class(SliceModel(weights, flags), 0, host, **kwargs)
        take_topk_parts(server, caps)
        server.center.num_updates = count
        server.transport.token = token
        server.transport.max_pending_handshakes = pending
        server.transport.on_error = report
        server.start()
    except Exception as error:  # told to the driver, which raises it
        pipe.send(f"{type(error).__name__}: {error}")
        return
    pipe.send(server.port)
    center = server.center
    while True:
        try:
            command, *args = pipe.recv()
        except EOFError:  # the driver is gone
            server.stop(0.0)
            return
        if command == "get":
            with center.mutex:  # the rules replace the center, never change it in place
                weights, count = center.center_variable, center.num_updates
            pipe.send((list(weights), count))
        elif command == "set":
            with center.mutex:
                center.center_variable = weights_array(args[0])
            pipe.send(None)
        else:
            server.stop(args[0])  # its handlers' errors went to ``reporter`` as they came
            pipe.send((list(center.center_variable), center.num_updates))
            return
