"""Punchcard's own overhead and responsiveness, with a real job on full Fashion-MNIST.

Measures, in one run: Spark's start-up in a fresh process; a job submitted through the
client (ADAG, 2 workers) from submit to its first training step and from its last step to
the model in the client's hands; the median and 95th percentile of `/api/state` answers
while 20 clients poll once a second during training; and the job's test accuracy against the
same trainer run directly.

    python benchmarks/punchcard.py [--limit N]
"""

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))


def spark_startup_seconds():
    code = ("import time; t = time.time(); from distkeras.session import local_spark_session; "
            "s = local_spark_session('local[2]'); s.range(1).count(); print(time.time() - t)")
    start = time.time()
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout
    return float(output.strip().splitlines()[-1]), time.time() - start


def milliseconds(statistic, latencies):
    """``statistic`` of the latencies in ms; '-' where none was timed (a job that trained
    before the clients polled while it ran)."""
    return f"{statistic(latencies) * 1e3:.1f}" if latencies else "-"


def main():
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None,
                        help="train on the first N images only (default: all 60,000)")
    args = parser.parse_args()
    import waitress

    import report
    from distkeras.datasets import load_fashion_mnist_numpy, to_arrow_table, write_parquet
    from distkeras.tools.experiments import build_mlp, test_accuracy
    from distkeras.job_deployment import Job, Punchcard
    from distkeras.punchcard.app import create_app
    from distkeras.punchcard.protocol import SECRET_HEADER
    from distkeras.punchcard.secrets_file import append_entry, generate_secret, make_entry
    from distkeras.trainers import ADAG

    folder = tempfile.mkdtemp(prefix="punchcard-bench-")
    images, labels = load_fashion_mnist_numpy("train")
    images, labels = images[:args.limit], labels[:args.limit]
    data_path = os.path.join(folder, "fashion.parquet")
    write_parquet(to_arrow_table(images, labels), data_path)
    secret = generate_secret()
    append_entry(os.path.join(folder, "secrets.json"), make_entry("bench", secret))
    punchcard = Punchcard(os.path.join(folder, "secrets.json"), os.path.join(folder, "work"),
                          master="local[2]")
    server = waitress.create_server(create_app(punchcard), host="127.0.0.1", port=0,
                                    threads=24)
    threading.Thread(target=server.run, daemon=True).start()
    url = f"http://127.0.0.1:{server.effective_port}"

    spark_in_process, spark_process = spark_startup_seconds()
    trainer = ADAG(keras_model=build_mlp(), worker_optimizer="adam",
                   loss="categorical_crossentropy", metrics=["accuracy"], num_workers=2,
                   communication_window=6)
    job = Job(secret, "bench", data_path, 1, 2, trainer)
    latencies, stop = [], threading.Event()

    def poll():
        request = urllib.request.Request(url + "/api/state", headers={SECRET_HEADER: secret})
        while not stop.is_set():
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    response.read()
            except urllib.error.HTTPError as error:
                # wait_completion() destroys the finished job as it fetches the model
                # (nothing else does here), so a client polling between that and ``stop``
                # finds no job: its end, not an error.
                if error.code == 404:
                    return
                raise
            if job.state == "running":
                latencies.append(time.perf_counter() - started)
            stop.wait(1.0)

    submitted = time.time()
    job.send(url)
    pollers = [threading.Thread(target=poll) for _ in range(20)]
    for thread in pollers:
        thread.start()
    job.wait_completion(poll_interval=0.1)
    in_hand = time.time()
    stop.set()
    for thread in pollers:
        thread.join()
    history = job.get_history()
    first_step = min(record["timestamp"] for record in history)
    last_step = max(record["timestamp"] for record in history)
    test_images, test_labels = load_fashion_mnist_numpy("test")
    test_images = test_images.reshape(len(test_images), -1).astype("float32") / 255.0
    job_accuracy = test_accuracy(job.get_trained_model(), test_images, test_labels)
    server.close()
    punchcard.close()

    # The same trainer, run directly, for the accuracy comparison.
    from distkeras.session import local_spark_session

    spark = local_spark_session("local[2]")
    from distkeras.trainers import ADAG as DirectADAG

    direct = DirectADAG(keras_model=build_mlp(), worker_optimizer="adam",
                        loss="categorical_crossentropy", metrics=["accuracy"], num_workers=2,
                        communication_window=6)
    direct_accuracy = test_accuracy(direct.train(spark.read.parquet(data_path), verbose=0),
                                    test_images, test_labels)
    spark.stop()
    before = first_step - submitted
    after = in_hand - last_step
    rows = [
        ["Spark start-up in a fresh process (python + JVM + session)", f"{spark_process:.1f}"],
        ["submit -> first training step", f"{before:.1f}"],
        ["last training step -> model in the client's hands", f"{after:.1f}"],
        ["server overhead beyond Spark's start-up (sum of both, minus start-up)",
         f"{before + after - spark_process:.1f}"],
        ["/api/state median under 20 clients polling once a second (ms)",
         milliseconds(statistics.median, latencies)],
        ["/api/state 95th percentile (ms)",
         milliseconds(lambda values: sorted(values)[int(0.95 * (len(values) - 1))],
                      latencies)],
        ["test accuracy: job through Punchcard / same trainer run directly",
         f"{job_accuracy:.4f} / {direct_accuracy:.4f}"],
    ]
    body = ("ADAG, 2 workers (1 executor x 2 processes), window 6, Fashion-MNIST Parquet "
            f"({len(labels)} training images), {len(latencies)} timed `/api/state` answers.\n\n"
            + report.table(["measure", "seconds (unless stated)"], rows))
    report.write_section("Punchcard: overhead and responsiveness", body)


if __name__ == "__main__":
    main()
