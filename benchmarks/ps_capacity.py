"""Parameter server capacity: the real server against simulated workers in other processes.

Each simulated worker is a process (multiprocessing, spawn) that speaks the real protocol
(`distkeras.networking`): it connects, presents the run's token, pulls the center, then
commits a real-sized float32 update and pulls (``ACTION_PULL_UNLESS_OWN``, as
`WindowedWorker.communicate` does) ``--commits`` times, either as fast as the server lets
it or on a schedule of ``--rate`` commits per second (a worker's steps/s over its window),
each worker at its own random phase. No model compute.

The server runs in this process; its CPU time (``time.process_time``, every thread) over
the measured span, divided by the commit+pull pairs served, is the figure that holds on a
machine with more cores: one server core sustains ``1 / (CPU s per pair)`` pairs per
second. Wall-clock rates on this shared 2-core machine are printed, not trusted.

    python benchmarks/ps_capacity.py --params 1e6 --workers 1 4 16 64 --commits 60
    python benchmarks/ps_capacity.py --params 1e7 --workers 8 --commits 20 --rate 10
    python benchmarks/ps_capacity.py --params 1e7 --workers 4 --commits 10 --compare-reuse 3
    python benchmarks/ps_capacity.py --params 1e7 --workers 4 --commits 8 --breakdown
    python benchmarks/ps_capacity.py --operations --params 1e7
    python benchmarks/ps_capacity.py --accuracy 30000
    python benchmarks/ps_capacity.py --params 1e7 --workers 2 --commits 8 \
        --compression none bfloat16 topk
    python benchmarks/ps_capacity.py --params 1e7 --workers 4 --commits 10 --shards 1 2

``--compression`` runs each case once per compression given, side by side, and prints
each one's server CPU and bytes per pair as a ratio of the first's; ``bytes_per_pair`` is
counted on the workers' sockets, both ways. ``--reuse-buffers`` serves with the opt-in
``reuse_buffers``; ``--compare-reuse`` alternates it with the default; ``--breakdown``
adds the server's CPU in each operation; ``--operations`` times the array operations
alone; ``--accuracy`` trains ADAG on Spark with and without ``reuse_server_buffers``.
``--shards`` serves a sharded center (`server_shards`: shard 0 here, the others in child
processes) and runs each case once per count given; the server CPU is summed over this
process and the shard processes, and the workers exchange with every shard at once
(`ShardLinks`).
docs/scaling.md holds the results.

Output: one Markdown table row per case (and ``--json PATH``: the same as JSON).
"""

import argparse
import json
import math
import multiprocessing
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import numpy as np  # noqa: E402

LAYERS = 4  # the simulated model: LAYERS Dense layers of one width (kernel + bias each)
SERVERS = ("adag", "downpour", "dynsgd")


def layer_width(params):
    """The width w whose LAYERS Dense(w -> w) layers hold about ``params`` parameters."""
    return max(1, int(round((-1 + math.sqrt(1 + 4 * params / LAYERS)) / 2)))


def weight_spec(params):
    """``[(shape, dtype)]`` of the simulated model's weights."""
    width = layer_width(params)
    return [shape for _ in range(LAYERS) for shape in ((width, width), (width,))]


def build_model(params):
    """A Keras model of LAYERS Dense layers holding about ``params`` parameters (zeros:
    the values do not change the server's work)."""
    import keras

    width = layer_width(params)
    layers = [keras.Input((width,))]
    layers += [keras.layers.Dense(width, kernel_initializer="zeros") for _ in range(LAYERS)]
    return keras.Sequential(layers)


def make_server(kind, model, reuse_buffers=False, compression=None, shards=1):
    from distkeras import parameter_servers
    from distkeras.transport.server_shards import sharded_server

    if shards > 1:
        cls = {"adag": parameter_servers.ADAGParameterServer,
               "downpour": parameter_servers.DeltaParameterServer,
               "dynsgd": parameter_servers.DynSGDParameterServer}[kind]
        return sharded_server(cls, model, shards, reuse_buffers=reuse_buffers,
                              compression=compression)
    if kind == "dynsgd":
        if reuse_buffers:
            raise ValueError("--reuse-buffers: only the adding servers (adag, downpour) "
                             "reuse their buffers")
        return parameter_servers.DynSGDParameterServer(model, 0, compression=compression)
    cls = {"adag": parameter_servers.ADAGParameterServer,
           "downpour": parameter_servers.DeltaParameterServer}[kind]
    return cls(model, 0, reuse_buffers=reuse_buffers, compression=compression)


def counting_connection(sock, max_frame_bytes):
    """A `networking.Connection` that counts the bytes it sends and receives."""
    from distkeras.transport import networking

    class Counting(networking.Connection):
        sent = received = 0

        def sendall(self, data):
            super().sendall(data)
            self.sent += memoryview(data).nbytes

        def recv_into(self, buffer, nbytes):
            count = super().recv_into(buffer, nbytes)
            self.received += count
            return count

    return Counting(sock, max_frame_bytes=max_frame_bytes)


def commit_fields(shapes, compression, seed):
    """What a simulated worker commits, every time: a float32 ``"delta"`` or its
    compressed fields (`compression.Encoder`, error feedback off: the same each time)."""
    from distkeras.transport import compression as codecs
    from distkeras.transport.networking import weights_array

    rng = np.random.default_rng(seed)
    # Small finite values: every commit is applied, and the center stays finite.
    delta = weights_array((rng.standard_normal(shape) * 1e-7).astype(np.float32)
                          for shape in shapes)
    if compression is None:
        return {"delta": delta}
    encoder = codecs.Encoder(codecs.parse(compression), [(shape, np.float32)
                                                        for shape in shapes], False)
    return encoder.encode(delta)[0]


class _OneServer:
    """A worker's exchanges with one server, as `ShardLinks` makes them with shards."""

    def __init__(self, sock):
        self.sockets = [sock]

    def commit(self, message):
        from distkeras.transport import networking

        networking.send_action(self.sockets[0], networking.ACTION_COMMIT)
        networking.send_data(self.sockets[0], message)

    def pull(self, action):
        from distkeras.transport import networking

        networking.send_action(self.sockets[0], action)
        return networking.recv_data(self.sockets[0])


def worker_main(host, ports, token, worker_id, shapes, commits, period, seed, ready, go,
                results, compression=None):
    """One simulated worker (a spawned process): connect (to every shard), authenticate,
    pull, then ``commits`` commit+pull pairs, one every ``period`` seconds (0: back to
    back)."""
    from distkeras.executor.shard_links import ShardLinks
    from distkeras.transport import networking

    nbytes = sum(4 * int(np.prod(shape)) for shape in shapes)
    sockets = []
    for port in ports:
        sockets.append(counting_connection(networking.connect(host, port),
                                           2 * nbytes + (1 << 20)))
        networking.authenticate(sockets[-1], token, worker_id)
    links = (_OneServer(sockets[0]) if len(sockets) == 1
             else ShardLinks(sockets, [(shape, np.float32) for shape in shapes]))
    fields = commit_fields(shapes, compression, seed)
    last_update = links.pull(networking.ACTION_PULL).get("num_updates", 0)
    ready.put(worker_id)
    go.wait()
    rng = np.random.default_rng(seed)
    for each in sockets:
        each.sent = each.received = 0
    start = time.monotonic()
    phase = rng.uniform(0, period) if period else 0.0
    latencies, with_weights, sparse, late = [], 0, 0, 0
    for index in range(commits):
        if period:
            due = start + phase + index * period
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            else:
                late += 1
        began = time.perf_counter()
        links.commit({**fields, "worker_id": worker_id, "last_update": last_update})
        reply = links.pull(networking.ACTION_PULL_UNLESS_OWN)
        latencies.append(time.perf_counter() - began)
        last_update = reply.get("num_updates", last_update)
        with_weights += "center" in reply
        sparse += "indices" in reply
    end = time.monotonic()
    wire_bytes = sum(each.sent + each.received for each in sockets)
    for each in sockets:
        networking.send_action(each, networking.ACTION_QUIT)
        networking.close_socket(each.sock)
    results.put({"worker_id": worker_id, "commits": commits, "start": start, "end": end,
                 "median_latency": float(np.median(latencies)), "with_weights": with_weights,
                 "sparse": sparse, "bytes": wire_bytes, "late": late, "cpu": time.process_time()})


def process_cpu_seconds(pid):
    """The CPU seconds (user + system) process ``pid`` has used, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_case(params, workers, commits, rate=None, server_kind="adag", model=None,
             host="127.0.0.1", reuse_buffers=False, compression=None, shards=1):
    """Serves ``workers`` simulated workers of ``commits`` pairs each; returns the figures.

    Returns:
        A dict: params, workers, the server's CPU seconds per commit+pull pair, pairs per
        second per server core (their inverse), the wall-clock pairs per second, the
        server's cores busy (CPU s / wall s), the pulls that carried weights, ...
    """
    model = model if model is not None else build_model(params)
    shapes = [tuple(weight.shape) for weight in model.get_weights()]
    real_params = sum(int(np.prod(shape)) for shape in shapes)
    server = make_server(server_kind, model, reuse_buffers, compression, shards)
    server.transport.expect_workers(workers)
    server.start()
    ports = [server.port] + list(server.shards.ports if server.shards else [])
    pids = server.shards.pids() if server.shards else []
    context = multiprocessing.get_context("spawn")
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    period = 1.0 / rate if rate else 0.0
    processes = [context.Process(
        target=worker_main, daemon=True,
        args=(host, ports, server.token, index, shapes, commits, period, 1000 + index,
              ready, go, results, compression)) for index in range(workers)]
    try:
        for process in processes:
            process.start()
        for _ in processes:
            ready.get(timeout=600)
        shard_cpu = [process_cpu_seconds(pid) for pid in pids]
        cpu_start, wall_start = time.process_time(), time.monotonic()
        go.set()
        reports = [results.get(timeout=3600) for _ in processes]
        cpu, wall = time.process_time() - cpu_start, time.monotonic() - wall_start
        # The shard processes' CPU, summed with this one's: the server's, all shards.
        cpu += sum(process_cpu_seconds(pid) - began for pid, began in zip(pids, shard_cpu))
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()
        server.stop()
    if server.transport.errors:
        raise RuntimeError(f"The server failed: {server.transport.errors}")
    pairs = sum(report["commits"] for report in reports)
    if server.num_updates != pairs:
        raise RuntimeError(f"{pairs} commits sent, {server.num_updates} applied.")
    # The span from the first worker's first commit to the last one's end.
    span = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    return {
        "params": real_params, "workers": workers,
        "server": server_kind + (" reuse" if reuse_buffers else ""), "shards": shards,
        "compression": compression or "none",
        "commits_per_worker": commits, "rate_per_worker": rate,
        "server_cpu_s": cpu, "wall_s": wall,
        "cpu_ms_per_pair": 1e3 * cpu / pairs,
        "pairs_per_core_s": pairs / cpu,
        "pairs_per_wall_s": pairs / span,
        "server_cores_busy": cpu / wall,
        "pulls_with_weights": sum(r["with_weights"] for r in reports) / pairs,
        "pulls_sparse": sum(r["sparse"] for r in reports) / pairs,
        "late_commits": sum(r["late"] for r in reports) / pairs,
        "median_latency_ms": 1e3 * float(np.median([r["median_latency"] for r in reports])),
        # Measured on the workers' sockets (loopback: the server's are the same bytes).
        "bytes_per_pair": sum(r["bytes"] for r in reports) / pairs,
    }


def operation_costs(params, repeat=10):
    """CPU milliseconds of the array operations a commit+pull may cost the server, on one
    flat float32 array of ``params`` values (one thread, no sockets): what decides
    between the designs that could lift the ceiling (docs/scaling.md)."""
    import ml_dtypes

    from distkeras.transport import center_writes

    rng = np.random.default_rng(0)
    center = rng.random(params, dtype=np.float32)
    update = (rng.random(params, dtype=np.float32) * 1e-3).astype(np.float32)
    spare = np.empty_like(center)
    half, brain = update.astype(np.float16), update.astype(ml_dtypes.bfloat16)

    def fresh_pages():
        np.empty(4 * params, np.uint8).fill(1)  # a new buffer's pages, first written

    operations = {
        "write a fresh buffer (a commit read into new memory)": fresh_pages,
        "center + update into new memory (the server's add)": lambda: center + update,
        "center + update into a reused buffer (reuse_buffers)":
            lambda: np.add(center, update, out=spare),
        "isfinite check of the update": lambda: np.isfinite(update).all(),
        "float32 -> float16 (a float16 pull)": lambda: center.astype(np.float16),
        "float16 -> float32 (a float16 commit)": lambda: half.astype(np.float32),
        "float32 -> bfloat16 (ml_dtypes)": lambda: center.astype(ml_dtypes.bfloat16),
        "bfloat16 -> float32 (ml_dtypes)": lambda: brain.astype(np.float32),
        "center + bfloat16 update into a reused buffer (numpy casting with ml_dtypes)":
            lambda: np.add(center, brain, out=spare),
        "center + bfloat16 update into a reused buffer, widened in chunks and checked "
        "finite (the server's add)":
            lambda: center_writes.add_bfloat16(center, brain.view(np.uint16), spare),
    }
    costs = {}
    for name, operation in operations.items():
        operation()
        began = time.process_time()
        for _ in range(repeat):
            operation()
        costs[name] = 1e3 * (time.process_time() - began) / repeat
    return costs


def accuracy_check(rows, workers=2, window=12):
    """Test accuracy of ADAG on Spark ``local[2]`` (``rows`` Fashion-MNIST rows, 1 epoch,
    the 784-500-500-10 MLP) with the default server and with ``reuse_server_buffers``."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import report

    spark, train, test = report.fashion_mnist_setup(limit=rows, packed=True)
    import keras

    from distkeras.trainers import ADAG

    accuracies = {}
    for reuse in (False, True):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((784,)),
                                  keras.layers.Dense(500, activation="relu"),
                                  keras.layers.Dense(500, activation="relu"),
                                  keras.layers.Dense(10, activation="softmax")])
        trainer = ADAG(model, "adam", "categorical_crossentropy", num_workers=workers,
                       communication_window=window, reuse_server_buffers=reuse)
        trained = trainer.train(train, verbose=0)
        predicted = trained.predict(test[0], batch_size=1000, verbose=0).argmax(axis=1)
        accuracies[reuse] = float((predicted == test[1]).mean())
    spark.stop()
    return accuracies


def timed_server_operations():
    """Wraps the server's reads, sends, checks and rule applications with per-thread CPU
    timers (benchmark only); returns the Counter of CPU seconds they fill, by name."""
    import collections

    # The modules themselves, not the face `distkeras.parameter_servers`: the servers look
    # these names up where they are defined.
    from distkeras.transport import center, center_writes, parameter_servers

    spent = collections.Counter()

    def timed(owner, name, label):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            began = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] += time.thread_time() - began

        setattr(owner, name, wrapper)

    timed(parameter_servers, "recv_data", "read a commit or a request")
    timed(center, "send_data", "send a pull")  # the center part answers pulls
    timed(center.CenterExchange, "model_update", "isfinite check")
    timed(parameter_servers.SocketParameterServer, "apply_rule", "add (under the lock)")
    timed(center_writes.CenterWrites, "add_bfloat16", "add (under the lock)")
    timed(center_writes.CenterWrites, "add_sparse", "add (under the lock)")
    timed(center_writes, "read_finite", "check a compressed commit")
    return spent


def compare_reuse(params, workers, commits, rounds):
    """Alternates the default server and ``reuse_buffers`` ``rounds`` times each, on one
    model, so both meet the same load on a shared machine."""
    model = build_model(params)
    results = []
    for _ in range(rounds):
        for reuse in (False, True):
            results.append(run_case(int(params), workers, commits, model=model,
                                    reuse_buffers=reuse))
            print(table(results[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    return results


HEADER = ["params", "workers", "server", "shards", "compression", "rate/worker", "pairs",
          "server CPU ms/pair", "pairs/s per server core", "pairs/s (wall)",
          "server cores busy", "pulls with weights", "sparse pulls", "MB/pair",
          "median latency ms"]


def row(result):
    rate = result["rate_per_worker"]
    return [f"{result['params'] / 1e6:.3g}M", result["workers"], result["server"],
            result.get("shards", 1), result.get("compression", "none"), "flat out" if not rate else f"{rate:g}/s",
            result["workers"] * result["commits_per_worker"],
            f"{result['cpu_ms_per_pair']:.2f}", f"{result['pairs_per_core_s']:.0f}",
            f"{result['pairs_per_wall_s']:.0f}", f"{result['server_cores_busy']:.2f}",
            f"{result['pulls_with_weights']:.2f}", f"{result.get('pulls_sparse', 0):.2f}",
            f"{result['bytes_per_pair'] / 1e6:.3f}", f"{result['median_latency_ms']:.1f}"]


def table(results):
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(str(cell) for cell in row(r)) + " |" for r in results]
    return "\n".join(lines)


def ratios(results):
    """Each case's server CPU and bytes per pair as a ratio of those of the case run just
    before it with the first compression (a repeated ``--workers`` count: its own round):
    a Markdown table."""
    lines = ["| params | workers | compression | server CPU ms/pair | x first | "
             "bytes/pair | x first |", "|---|---|---|---|---|---|---|"]
    base = None
    for result in results:
        if result["compression"] == results[0]["compression"]:
            base = result
        lines.append(
            f"| {result['params'] / 1e6:.3g}M | {result['workers']} | "
            f"{result['compression']} | {result['cpu_ms_per_pair']:.2f} | "
            f"{result['cpu_ms_per_pair'] / base['cpu_ms_per_pair']:.3f} | "
            f"{result['bytes_per_pair']:.0f} | "
            f"{result['bytes_per_pair'] / base['bytes_per_pair']:.4f} |")
    return "\n".join(lines)


def shard_ratios(results):
    """Each case's server CPU per pair (summed over its shard processes) and wall pairs/s
    as a ratio of those of the case with the first shard count before it: Markdown."""
    lines = ["| params | workers | shards | server CPU ms/pair (all shards) | x first | "
             "pairs/s (wall) | x first |", "|---|---|---|---|---|---|---|"]
    base = None
    for result in results:
        if result["shards"] == results[0]["shards"]:
            base = result
        lines.append(
            f"| {result['params'] / 1e6:.3g}M | {result['workers']} | {result['shards']} | "
            f"{result['cpu_ms_per_pair']:.2f} | "
            f"{result['cpu_ms_per_pair'] / base['cpu_ms_per_pair']:.3f} | "
            f"{result['pairs_per_wall_s']:.1f} | "
            f"{result['pairs_per_wall_s'] / base['pairs_per_wall_s']:.3f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, nargs="+", default=[1e6],
                        help="model sizes in parameters (1e6 10e6 100e6)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 16],
                        help="simulated worker counts")
    parser.add_argument("--commits", type=int, default=40, help="commit+pull pairs per worker")
    parser.add_argument("--rate", type=float, default=None,
                        help="commits per second per worker (default: as fast as served)")
    parser.add_argument("--server", choices=SERVERS, default="adag")
    parser.add_argument("--accuracy", type=int, metavar="ROWS",
                        help="only train ADAG (2 workers, window 12) on ROWS rows with "
                             "and without reuse_server_buffers and print the accuracies")
    parser.add_argument("--compare-reuse", type=int, metavar="ROUNDS",
                        help="alternate the default server and --reuse-buffers ROUNDS times")
    parser.add_argument("--breakdown", action="store_true",
                        help="also print the server's CPU ms per pair in each operation")
    parser.add_argument("--operations", action="store_true",
                        help="only time the array operations behind a commit+pull")
    parser.add_argument("--reuse-buffers", action="store_true",
                        help="the server's opt-in reuse_buffers (adag, downpour)")
    parser.add_argument("--compression", nargs="+", default=["none"],
                        choices=("none", "bfloat16", "topk"),
                        help="the exchanges' compression; several: each case once per "
                             "compression, side by side, with ratios to the first")
    parser.add_argument("--topk-fraction", type=float, default=0.01,
                        help="top-k's share of each layer's entries (default 0.01)")
    parser.add_argument("--shards", type=int, nargs="+", default=[1],
                        help="server shard processes; several: each case once per count, "
                             "side by side, with the server CPU's ratio to the first")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.commits < 1 or min(args.workers) < 1 or min(args.params) < 1:
        parser.error("--commits, --workers and --params must be at least 1")
    if args.accuracy:
        accuracies = accuracy_check(args.accuracy)
        print("| server | test accuracy |\n|---|---|")
        for reuse, value in accuracies.items():
            print(f"| {'reuse_server_buffers=True' if reuse else 'default'} | {value:.4f} |")
        return accuracies
    if args.operations:
        for params in args.params:
            print(f"\n{params / 1e6:.3g}M parameters, CPU ms per operation:\n")
            print("| operation | CPU ms |\n|---|---|")
            for name, cost in operation_costs(int(params)).items():
                print(f"| {name} | {cost:.2f} |")
        return None
    spent = timed_server_operations() if args.breakdown else None
    results = []
    for params in args.params:
        if args.compare_reuse:
            for workers in args.workers:
                results += compare_reuse(params, workers, args.commits, args.compare_reuse)
            continue
        model = build_model(params)
        for workers in args.workers:
            for name in args.compression:
                compression = {"none": None, "bfloat16": "bfloat16",
                               "topk": f"topk:{args.topk_fraction:g}"}[name]
                for shards in args.shards:
                    results.append(run_case(int(params), workers, args.commits, args.rate,
                                            args.server, model,
                                            reuse_buffers=args.reuse_buffers,
                                            compression=compression, shards=shards))
                    print(table(results[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(results))
    if len(args.compression) > 1:
        print("\n" + ratios(results))
    if len(args.shards) > 1:
        print("\n" + shard_ratios(results))
    if spent is not None:
        pairs = sum(r["workers"] * r["commits_per_worker"] for r in results)
        print("\n| server operation | CPU ms per pair (all cases) |\n|---|---|")
        for label, seconds in spent.items():
            print(f"| {label} | {1e3 * seconds / pairs:.2f} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
    return results


if __name__ == "__main__":
    main()
