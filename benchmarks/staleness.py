"""Staleness at scale: accuracy of DOWNPOUR, ADAG, AEASGD and DynSGD against the number of
workers, with real training and simulated worker schedules (no Spark, no sockets).

Each simulated worker holds its own replica (weights and Adam state) and its own even
partition of the Fashion-MNIST rows, and trains real minibatch steps of a small MLP (one
compiled window of steps, Keras's stateless API on JAX). The workers' schedules are an
event simulation: a worker's window takes ``window * speed * jitter`` time units, its
``speed`` drawn once per worker (lognormal, sigma ``--speed-sigma``: machines differ) and
``jitter`` per window (lognormal, sigma ``--jitter-sigma``: a step's time varies). At each
window's end, in simulated time order, the worker exchanges with the center exactly as its
`distkeras.workers` class does, through the real rules of
`distkeras.algorithms.update_rules`, so a commit is as stale as the other workers' commits
since its pull make it.

    python benchmarks/staleness.py --workers 1 4 8 16 32 64 --rows 20000 --epochs 2 \\
        --compression none bfloat16 topk --plot docs/staleness.png --json staleness.json

``--compression`` runs each algorithm and worker count once per compression, through the
workers' real `distkeras.transport.compression.Encoder` (error feedback included): a
commit adds to the center what its compression kept; a bfloat16 pull is the center cut
to bfloat16 (`truncated_bfloat16`) unless only the worker's own commit moved it; a top-k
pull is the float32 center, as the sparse reply rebuilds it.

Output: a Markdown table (test accuracy of the center per algorithm, compression and
worker count) and, with ``--plot``, a PNG of the same.
"""

import argparse
import heapq
import json
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import numpy as np  # noqa: E402
import report  # noqa: E402  (benchmarks/report.py, beside this script)

# Each algorithm's trainer defaults (distkeras/trainers.py).
ALGORITHMS = {"DOWNPOUR": {"window": 5}, "ADAG": {"window": 12}, "DynSGD": {"window": 5},
              "AEASGD": {"window": 32, "rho": 5.0, "learning_rate": 0.1}}


class Replicas:
    """A small MLP whose window of Adam steps runs on any replica's weights and state."""

    def __init__(self, hidden=64, learning_rate=1e-3, seed=0):
        import jax
        import keras

        keras.utils.set_random_seed(seed)
        self.model = keras.Sequential([keras.Input((784,)),
                                       keras.layers.Dense(hidden, activation="relu"),
                                       keras.layers.Dense(10, activation="softmax")])
        self.optimizer = keras.optimizers.Adam(learning_rate)
        self.optimizer.build(self.model.trainable_variables)
        loss_fn = keras.losses.SparseCategoricalCrossentropy()
        model, optimizer = self.model, self.optimizer

        def loss(trainable, x, y):
            predictions, _ = model.stateless_call(trainable, [], x, training=True)
            return loss_fn(y, predictions)

        grad = jax.grad(loss)

        def window(trainable, state, xs, ys):
            def step(carry, batch):
                trainable, state = carry
                trainable, state = optimizer.stateless_apply(state, grad(trainable, *batch),
                                                             trainable)
                return (trainable, state), None

            (trainable, state), _ = jax.lax.scan(step, (trainable, state), (xs, ys))
            return trainable, state

        self._window = jax.jit(window)

        def predict(trainable, x):
            return model.stateless_call(trainable, [], x, training=False)[0]

        self._predict = jax.jit(predict)

    def initial(self):
        """The initial weights (numpy object array) and a fresh optimizer state."""
        from distkeras.transport.networking import weights_array

        return weights_array(np.asarray(v) for v in self.model.trainable_variables), \
            [np.array(v) for v in self.optimizer.variables]  # count, rate, moments

    def train(self, weights, state, xs, ys):
        """Runs ``len(xs)`` Adam steps from ``weights``; returns (weights, state)."""
        from distkeras.transport.networking import weights_array

        trainable, state = self._window(list(weights), state, xs, ys)
        return weights_array(np.asarray(v) for v in trainable), state

    def accuracy(self, weights, images, labels):
        predictions = np.asarray(self._predict(list(weights), images))
        return float((predictions.argmax(axis=1) == labels).mean())


class SimWorker:
    """One simulated worker: its partition's batches, its replica and its schedule."""

    def __init__(self, index, images, labels, batch_size, epochs, window, speed):
        count = len(images) // batch_size
        order = [batch for _ in range(epochs) for batch in range(count)]
        self.index, self.window, self.speed = index, window, speed
        self.xs = images[:count * batch_size].reshape(count, batch_size, -1)
        self.ys = labels[:count * batch_size].reshape(count, batch_size)
        self.order = order
        self.position = 0
        self.weights = self.pulled = self.state = None
        self.last_update = 0
        self.encoder = None  # the worker's compression `Encoder`, if the run compresses

    def next_window(self):
        """The indices of this worker's next window of batches (fewer at the end)."""
        batches = self.order[self.position:self.position + self.window]
        self.position += len(batches)
        return batches


def simulate(algorithm, num_workers, replicas, images, labels, batch_size, epochs,
             speed_sigma, jitter_sigma, seed, compression=None):
    """Trains ``num_workers`` simulated workers of ``algorithm``, their exchanges
    compressed as ``compression`` (None, ``"bfloat16"``, ``"topk"``, ``"topk:F"``) says;
    returns the center and the staleness of every commit (others' commits between a
    worker's pull and commit)."""
    from distkeras.algorithms import update_rules
    from distkeras.transport import compression as codecs

    options = ALGORITHMS[algorithm]
    rng = np.random.default_rng(seed)
    center, initial_state = replicas.initial()
    parts = np.array_split(np.arange(len(images)), num_workers)
    workers = [SimWorker(i, images[part], labels[part], batch_size, epochs, options["window"],
                         rng.lognormal(0.0, speed_sigma)) for i, part in enumerate(parts)]
    num_updates = 0
    events = []  # (time the worker's current window ends, worker index, its batches)

    def schedule(worker, now):
        batches = worker.next_window()
        if batches:
            duration = len(batches) * worker.speed * rng.lognormal(0.0, jitter_sigma)
            heapq.heappush(events, (now + duration, worker.index, batches))

    compression = codecs.parse(compression)
    spec = [(layer.shape, layer.dtype) for layer in center]
    for worker in workers:
        worker.weights = worker.pulled = center  # every worker pulls the center first
        worker.state = [np.array(value) for value in initial_state]
        if compression is not None:
            # Elastic averaging keeps no residual: what was not sent stays in the weights.
            worker.encoder = codecs.Encoder(compression, spec,
                                            error_feedback=algorithm != "AEASGD")
        schedule(worker, 0.0)
    staleness = []
    while events:
        # The window that ends first exchanges first. It trained from the weights of its
        # worker's last exchange, whatever happened meanwhile: it is computed now.
        now, index, batches = heapq.heappop(events)
        worker = workers[index]
        worker.weights, worker.state = replicas.train(
            worker.weights, worker.state, worker.xs[batches], worker.ys[batches])
        staleness.append(num_updates - worker.last_update)
        center, num_updates = exchange(algorithm, options, worker, center, num_updates,
                                       update_rules)
        schedule(worker, now)
    return center, staleness


def exchange(algorithm, options, worker, center, num_updates, update_rules):
    """One worker's exchange at its window's end, as its `distkeras.workers` class does;
    returns the new center and update count."""
    if algorithm == "AEASGD":
        # Pull C, E = rho * lr * (W - C), W -= E, commit E (the server adds it).
        elastic = update_rules.elastic_difference(worker.weights, pulled_center(worker, center),
                                                  options["rho"], options["learning_rate"])
        elastic = sent(worker, elastic)
        worker.weights = worker.weights - elastic
        worker.last_update = num_updates + 1
        return update_rules.add_update(center, elastic), num_updates + 1
    alone = num_updates == worker.last_update  # no other commit since this worker's pull
    if algorithm == "ADAG":
        update = sent(worker, update_rules.adag_residual(worker.weights, worker.pulled,
                                                         options["window"]))
        center = update_rules.add_update(center, update)
    elif algorithm == "DOWNPOUR":
        update = sent(worker, update_rules.downpour_delta(worker.weights, worker.pulled))
        center = update_rules.add_update(center, update)
    elif algorithm == "DynSGD":
        center = update_rules.dynsgd_update(
            center, sent(worker, update_rules.downpour_delta(worker.weights, worker.pulled)),
            num_updates, worker.last_update)
    num_updates += 1
    # Pull: continue from the center. ADAG's and DOWNPOUR's server sends no weights when
    # only this worker's commit moved it: the worker adds its commit to what it pulled.
    if alone and algorithm != "DynSGD":
        worker.weights = worker.pulled = update_rules.add_update(worker.pulled, update)
    else:
        worker.weights = worker.pulled = pulled_center(worker, center)
    worker.last_update = num_updates
    return center, num_updates


def sent(worker, update):
    """What the server applies of ``update``: itself, or what the worker's compression
    kept of it plus what its earlier commits left out."""
    return update if worker.encoder is None else worker.encoder.encode(update)[1]


def pulled_center(worker, center):
    """The center as a pull brings it to ``worker``: cut to bfloat16 under bfloat16, else
    float32 (a top-k run's sparse reply rebuilds it)."""
    from distkeras.transport import compression as codecs
    from distkeras.transport.networking import weights_array

    if worker.encoder is None or worker.encoder.compression.kind != codecs.BFLOAT16:
        return center
    return weights_array(layer.astype(np.float32)
                         for layer in codecs.truncated_bfloat16(center))


def load_rows(rows, test_rows):
    """``rows`` shuffled training images and ``test_rows`` test images, in [0, 1]."""
    from distkeras.datasets import load_fashion_mnist_numpy

    images, labels = load_fashion_mnist_numpy("train")
    order = np.random.default_rng(0).permutation(len(images))[:rows]
    train = (images[order].reshape(len(order), -1).astype("float32") / 255.0,
             labels[order].astype("int32"))
    images, labels = load_fashion_mnist_numpy("test")
    test = (images[:test_rows].reshape(-1, 784).astype("float32") / 255.0,
            labels[:test_rows].astype("int32"))
    return train, test


def label(result):
    """A result's row and line label: its algorithm, window and compression."""
    compression = result.get("compression", "none")
    return f"{result['algorithm']} ({result['window']})" + (
        "" if compression == "none" else f", {compression}")


def plot(results, worker_counts, path):
    """Test accuracy against the number of workers, one line per algorithm and
    compression (a colour per algorithm, a line style per compression)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    compressions = list(dict.fromkeys(r.get("compression", "none") for r in results))
    styles = ["-", "--", ":", "-."]
    for place, algorithm in enumerate(ALGORITHMS):
        for compression in compressions:
            points = [(r["workers"], r["accuracy"]) for r in results
                      if r["algorithm"] == algorithm
                      and r.get("compression", "none") == compression]
            if points:
                xs, ys = zip(*points)
                axis.plot(xs, ys, marker="o", color=f"C{place}",
                          linestyle=styles[compressions.index(compression) % len(styles)],
                          label=label({"algorithm": algorithm, "compression": compression,
                                       "window": ALGORITHMS[algorithm]["window"]}))
    axis.set_xscale("log", base=2)
    axis.set_xticks(worker_counts, [str(count) for count in worker_counts])
    axis.set_xlabel("workers")
    axis.set_ylabel("test accuracy of the center")
    axis.set_ylim(0, 1)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize="small", ncol=1 if len(compressions) == 1 else 2)
    axis.set_title("Fashion-MNIST MLP, simulated asynchronous workers")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--algorithms", nargs="+", choices=list(ALGORITHMS),
                        default=list(ALGORITHMS))
    parser.add_argument("--compression", nargs="+", default=["none"], type=compression_name,
                        help="none, bfloat16, topk or topk:F: each algorithm and worker "
                             "count once per compression")
    parser.add_argument("--rows", type=int, default=20000, help="training rows")
    parser.add_argument("--test-rows", type=int, default=10000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--speed-sigma", type=float, default=0.1)
    parser.add_argument("--jitter-sigma", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", help="write the plot to this PNG")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--include", nargs="+", default=[],
                        help="JSON files of earlier runs whose results join the table and plot")
    args = parser.parse_args(argv)
    if min(args.workers) < 1 or args.rows < args.batch_size * max(args.workers):
        parser.error("every worker needs at least one batch: --rows must be at least "
                     "--batch-size times the largest --workers, and --workers at least 1")
    (images, labels), (test_images, test_labels) = load_rows(args.rows, args.test_rows)
    replicas = Replicas(args.hidden, seed=args.seed)
    results = []
    earlier = {(r["algorithm"], r.get("compression", "none"))
               for r in report.included(args.include)}
    for algorithm in args.algorithms:
        for compression in args.compression:
            if (algorithm, compression) in earlier:
                continue
            for count in args.workers:
                began = time.process_time()
                center, staleness = simulate(
                    algorithm, count, replicas, images, labels, args.batch_size, args.epochs,
                    args.speed_sigma, args.jitter_sigma, args.seed,
                    None if compression == "none" else compression)
                results.append({"algorithm": algorithm, "workers": count,
                                "window": ALGORITHMS[algorithm]["window"],
                                "compression": compression,
                                "accuracy": replicas.accuracy(center, test_images,
                                                              test_labels),
                                "mean_staleness": float(np.mean(staleness)),
                                "commits": len(staleness),
                                "cpu_s": time.process_time() - began})
                print(results[-1], file=sys.stderr, flush=True)
                if args.json:  # after every point: a long run keeps what it measured
                    with open(args.json, "w", encoding="utf-8") as handle:
                        json.dump(results, handle, indent=1)
    results = report.included(args.include) + results
    header = ["algorithm (window)"] + [f"{count} workers" for count in args.workers]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in dict.fromkeys(label(r) for r in sorted(
            results, key=lambda r: list(ALGORITHMS).index(r["algorithm"]))):
        cells = {r["workers"]: f"{r['accuracy']:.4f} (staleness {r['mean_staleness']:.1f})"
                 for r in results if label(r) == name}
        lines.append(f"| {name} | " + " | ".join(cells.get(count, "-")
                                                 for count in args.workers) + " |")
    print("\n".join(lines))
    if args.plot:
        plot(results, args.workers, args.plot)
    return results


def compression_name(text):
    """``--compression``'s value, checked: none or a trainer's ``compression``."""
    from distkeras.transport import compression as codecs

    if text != "none":
        try:
            codecs.parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"{text!r}: none, or {error}") from None
    return text


if __name__ == "__main__":
    main()
