"""distkeras against elephas, side by side, on the same Fashion-MNIST job.

Trains the 784-500-500-10 MLP (relu, softmax, Adam at its default learning rate, batch 32,
categorical crossentropy) on the 60,000 training images with 2 workers on ``local[2]``
Spark, for 1 and 3 epochs: first with elephas 7.3.0 (synchronous mode, asynchronous mode
with frequency 'epoch' and 'batch'), then with distkeras's ADAG and DOWNPOUR. Reports the
wall time of each training call, samples per second and test accuracy on the 10,000 test
images, and writes the table into benchmarks/results.md ("elephas side by side").

elephas pins numpy<2, TensorFlow 2.19 and PySpark 4.0, so it runs in its own virtual
environment ``.venv-elephas/``, built here on first use (a stamp file marks it done), and in
its own process (benchmarks/elephas_run.py); the two Spark sessions never overlap.

    .venv/bin/python benchmarks/elephas.py [--epochs 1 3] [--limit N] [--skip-install]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VENV = os.path.join(ROOT, ".venv-elephas")
REQUIREMENT = "elephas==7.3.0"
STAMP = os.path.join(VENV, "distkeras-benchmark.stamp")
MODE_NAMES = {
    "synchronous": "SparkModel (synchronous)",
    "asynchronous-epoch": "AsynchronousSparkModel, frequency='epoch'",
    "asynchronous-batch": "AsynchronousSparkModel, frequency='batch'",
}

sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import report  # noqa: E402  (stdlib only at import; Keras comes after Spark starts)


def venv_python():
    """The elephas virtual environment's interpreter."""
    return os.path.join(VENV, "bin", "python")


class InstallError(RuntimeError):
    """Building .venv-elephas failed; the message holds the end of pip's output."""


def stamp_matches():
    """Whether the stamp says .venv-elephas holds REQUIREMENT."""
    if not os.path.exists(STAMP):
        return False
    with open(STAMP, encoding="utf-8") as handle:
        return handle.readline().strip() == REQUIREMENT


def run_step(command):
    """Runs one install step; raises InstallError with the end of its output if it fails."""
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        output = (done.stdout + done.stderr)[-3000:]
        raise InstallError(f"`{' '.join(command)}` exited with {done.returncode}:\n{output}")
    return done.stdout


def ensure_venv(python, skip_install):
    """Builds ``.venv-elephas`` with elephas unless its stamp says it is already there.

    Args:
        python: A Python 3.11 interpreter to build the venv from.
        skip_install: Trust the venv as it is (it must exist).
    """
    if skip_install or stamp_matches():
        if not os.path.exists(venv_python()):
            raise SystemExit(f"{venv_python()} is missing; run without --skip-install.")
        return
    started = time.time()
    print(f"Building {VENV} with {REQUIREMENT} (from {python}) ...", flush=True)
    run_step([python, "-m", "venv", VENV])
    run_step([venv_python(), "-m", "pip", "install", "--quiet", REQUIREMENT])
    packages = run_step([venv_python(), "-m", "pip", "freeze"])
    # The stamp's first line is what was asked for; the rest, what pip resolved.
    with open(STAMP, "w", encoding="utf-8") as handle:
        handle.write(REQUIREMENT + "\n" + packages)
    print(f"Built in {time.time() - started:.0f} s.", flush=True)


def run_elephas(args):
    """Runs benchmarks/elephas_run.py in the elephas venv.

    Returns:
        Its results (see elephas_run.py), or ``{"error": ..., "log": ...}`` where the
        process failed before writing any.
    """
    folder = tempfile.mkdtemp(prefix="elephas-bench-")
    output, log = os.path.join(folder, "results.json"), os.path.join(folder, "run.log")
    command = [venv_python(), os.path.join(HERE, "elephas_run.py"), "--output", output,
               "--epochs", *map(str, args.epochs), "--tf-threads", str(args.tf_threads)]
    if args.limit:
        command += ["--limit", str(args.limit)]
    # Our venv's Spark settings must not leak into elephas's PySpark.
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PYSPARK_", "SPARK_", "VIRTUAL_ENV"))}
    print("elephas:", " ".join(command), f"(log: {log})", flush=True)
    load = os.getloadavg()
    with open(log, "w", encoding="utf-8") as handle:
        code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env,
                              cwd=ROOT, check=False).returncode
    with open(log, encoding="utf-8", errors="replace") as handle:
        tail = handle.read()[-3000:]
    if not os.path.exists(output):
        return {"error": f"elephas_run.py exited with code {code} and wrote no results",
                "log": tail}
    with open(output, encoding="utf-8") as handle:
        results = json.load(handle)
    results["load"] = load
    if code:
        results["error"] = f"elephas_run.py exited with code {code} after some runs"
        results["log"] = tail
    return results


def run_ours(args):
    """ADAG, DOWNPOUR and AveragingTrainer with 2 workers on local[2], in this process.

    Returns:
        The 1, 5 and 15 minute load averages before the first run, and one dict per run:
        trainer, window, epochs, samples, wall_s, samples_per_s, test_accuracy.
    """
    load = os.getloadavg()
    spark, train, (test_images, test_labels) = report.fashion_mnist_setup(
        limit=args.limit, packed=args.our_features == "packed")
    from distkeras.trainers import ADAG, DOWNPOUR, AveragingTrainer
    from fashion_mnist import build_mlp, test_accuracy

    samples = train.count()
    runs = []
    # AveragingTrainer does what elephas's synchronous mode does: average the replicas'
    # weights once per epoch.
    for cls in (ADAG, DOWNPOUR, AveragingTrainer):
        for epochs in args.epochs:
            trainer = cls(build_mlp(), worker_optimizer="adam",
                          loss="categorical_crossentropy", metrics=["accuracy"],
                          num_workers=2, batch_size=32, num_epoch=epochs)
            model = trainer.train(train)
            seconds = trainer.get_training_time()
            run = {"trainer": cls.__name__,
                   "window": getattr(trainer, "communication_window", None),
                   "epochs": epochs, "samples": samples, "wall_s": seconds,
                   "samples_per_s": samples * epochs / seconds,
                   "test_accuracy": test_accuracy(model, test_images, test_labels)}
            print(json.dumps(run), flush=True)
            runs.append(run)
    spark.stop()
    return load, runs


def result_rows(elephas, ours):
    """The rows of the main table, elephas's first."""
    rows = []
    for run in elephas.get("runs", []):
        name = MODE_NAMES[run["mode"]]
        if "error" in run:
            rows.append(["elephas", name, run["epochs"], "failed", "-", run["error"][:120]])
        else:
            rows.append(["elephas", name, run["epochs"], f"{run['wall_s']:.1f}",
                         f"{run['samples_per_s']:.0f}", f"{run['test_accuracy']:.4f}"])
    for run in ours:
        rows.append(["distkeras", _our_name(run), run["epochs"],
                     f"{run['wall_s']:.1f}", f"{run['samples_per_s']:.0f}",
                     f"{run['test_accuracy']:.4f}"])
    return rows


def _our_name(run):
    if run["window"] is None:
        return run["trainer"]
    return f"{run['trainer']}, window {run['window']}"


def ratio_rows(elephas, ours, epoch_counts):
    """For each elephas run: our fastest run at the same epochs with equal or better test
    accuracy, and the ratio of samples per second ("none" when no run of ours is as
    accurate)."""
    rows = []
    for epochs in epoch_counts:
        for run in elephas.get("runs", []):
            if run["epochs"] != epochs or "error" in run:
                continue
            rivals = [mine for mine in ours if mine["epochs"] == epochs
                      and mine["test_accuracy"] >= run["test_accuracy"]]
            theirs = (f"{MODE_NAMES[run['mode']]} ({run['samples_per_s']:.0f}, "
                      f"{run['test_accuracy']:.4f})")
            if not rivals:
                rows.append([epochs, "none as accurate", theirs, "-"])
                continue
            best = max(rivals, key=lambda mine: mine["samples_per_s"])
            rows.append([epochs, f"{_our_name(best)} ({best['samples_per_s']:.0f}, "
                                 f"{best['test_accuracy']:.4f})", theirs,
                         f"{best['samples_per_s'] / run['samples_per_s']:.2f}x"])
    return rows


NOTES = """\
What each run does (elephas 7.3.0 source, `elephas/spark_model.py` and `elephas/worker.py`):

- elephas `SparkModel` (synchronous): one Spark job per epoch. Each of the 2 workers rebuilds
  the model from the broadcast weights with a fresh Adam, runs `model.fit` for one epoch on
  its partition (half the data), and returns its weight change; the driver averages the two
  changes and applies them. Model averaging once per epoch; Adam's state restarts each epoch.
- elephas `AsynchronousSparkModel`, mode='asynchronous', frequency='epoch': one Spark job; a
  Flask HTTP parameter server runs in a child process of the driver. At the start of each
  epoch a worker pulls the weights, fits one epoch on its partition, and pushes its change,
  which the server adds as is (the two workers' changes are summed, not averaged).
- elephas `AsynchronousSparkModel`, frequency='batch': as above, but a worker pulls the
  whole model over HTTP before every batch and pushes its change after it (two transfers
  of the 2.6 MB of weights per batch): DOWNPOUR with a window of 1.
- distkeras ADAG / DOWNPOUR: one Spark job; the driver's parameter server (TCP) gets a
  commit every `window` steps (ADAG: the change divided by the window; DOWNPOUR: the
  change); the worker pulls the center after each commit. Default windows (12 and 5).
- distkeras AveragingTrainer: elephas's synchronous scheme; one Spark job per epoch, each
  worker trains its partition and the driver averages the replicas' weights.

Timed: elephas's `fit` call and distkeras's `train()` (`get_training_time()`), each with
its data already cached in Spark and its executors' Python workers warmed up (Keras or
TensorFlow imported) beforehand; both include shipping the data to the workers, rebuilding
the model there and compiling (elephas's `fit` also repartitions its RDD into 2
partitions, a shuffle, on every call). Samples/s = training images x epochs / wall time.
One run each, on 2 cores shared with other work (load averages above): a single number can
be off by tens of percent, so read the ratios as rough."""


def versions_line(elephas):
    """The elephas side's versions and thread setting, in words."""
    found = elephas.get("versions")
    if not found:
        return "elephas side: no versions (it did not start)."
    threads = elephas.get("tf_threads")
    setting = (f"{threads} TensorFlow thread(s) per executor (`TF_NUM_INTRAOP_THREADS`, "
               "as distkeras's one XLA thread per worker)" if threads else
               "TensorFlow's default thread pools")
    return (f"elephas side (`.venv-elephas`): elephas {found['elephas']}, TensorFlow "
            f"{found['tensorflow']}, Keras {found['keras']}, PySpark {found['pyspark']}, numpy "
            f"{found['numpy']}, Python {found['python']}; {setting}.")


def failures(elephas):
    """What failed on the elephas side, with the errors, as Markdown (empty if nothing)."""
    parts = []
    if "error" in elephas:
        parts.append(f"**elephas failed**: {elephas['error']}. Last lines of its log:\n\n"
                     f"```\n{elephas.get('log', '').strip()}\n```")
    for run in elephas.get("runs", []):
        if "error" in run:
            parts.append(f"**elephas {MODE_NAMES[run['mode']]}, {run['epochs']} epoch(s) "
                         f"failed**: `{run['error']}`\n\n```\n{run['traceback'].strip()}\n```")
    return "\n\n".join(parts)


def distkeras_line():
    """The distkeras commit measured, and its uncommitted changes under distkeras/."""
    def git(*command):
        return subprocess.run(["git", *command], cwd=ROOT, capture_output=True, text=True,
                              check=False).stdout

    changed = [line[3:] for line in git("status", "--porcelain", "--", "distkeras").splitlines()]
    extra = f", with uncommitted changes to {', '.join(changed)}" if changed else ""
    return f"distkeras side: commit {git('rev-parse', '--short', 'HEAD').strip() or 'unknown'}{extra}."


def load_note(elephas_load, our_load):
    """The machine's load averages as each side started: the cores were shared."""
    def words(load):
        return "/".join(f"{value:.1f}" for value in load) if load else "not measured"

    return ("Load average (1/5/15 min) on the 2 cores when each side started, other "
            f"work included: elephas {words(elephas_load)}, distkeras {words(our_load)}.")


def section_body(elephas, ours, our_context, args, total_s):
    """The Markdown body of the doc section.

    Args:
        elephas: run_elephas's results.
        ours: run_ours's runs.
        our_context: The load averages as our side started, and distkeras_line().
        args: The command line.
        total_s: The whole run's seconds.
    """
    our_load, measured = our_context
    samples = ours[0]["samples"] if ours else elephas.get("samples")
    body = [f"{samples} training images, 2 workers, `local[2]`, MLP 784-500-500-10, Adam, "
            f"batch 32, epochs {' and '.join(map(str, args.epochs))}; whole run "
            f"{total_s / 60:.1f} min. distkeras reads its features "
            + ("packed (binary float32 rows, `load_fashion_mnist(packed=True)`); elephas "
               "reads numpy arrays from its RDD." if args.our_features == "packed" else
               "as `array<float>`; elephas reads numpy arrays from its RDD."), versions_line(elephas) + " " + measured,
            load_note(elephas.get("load"), our_load),
            report.table(["library", "mode / trainer", "epochs", "wall time (s)",
                          "samples/s", "test accuracy"], result_rows(elephas, ours))]
    ratios = ratio_rows(elephas, ours, args.epochs)
    if ratios:
        body.append("For each elephas run, our fastest run at the same epochs with equal or "
                    "better test accuracy (issue 6's bar: at least 3x):\n\n"
                    + report.table(["epochs", "distkeras (samples/s, accuracy)",
                                    "elephas (samples/s, accuracy)", "ratio"], ratios))
    failed = failures(elephas)
    if failed:
        body.append(failed)
    body.append(NOTES)
    return "\n\n".join(body)


def default_python():
    """A Python 3.11 interpreter to build the elephas venv from."""
    return shutil.which("python3.11") or sys.executable


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--limit", type=int, default=None,
                        help="train on the first N images only (default: all 60,000)")
    parser.add_argument("--skip-install", action="store_true",
                        help="use .venv-elephas as it is")
    parser.add_argument("--python", default=default_python(),
                        help="Python 3.11 to build .venv-elephas from (default python3.11)")
    parser.add_argument("--tf-threads", type=int, default=1,
                        help="TensorFlow threads per elephas executor (0: TF's default)")
    parser.add_argument("--our-features", choices=["packed", "array"], default="packed",
                        help="distkeras's features: packed float32 bytes (its fast path, "
                             "default) or array<float>")
    parser.add_argument("--no-write", action="store_true",
                        help="print the section, leave benchmarks/results.md alone")
    args = parser.parse_args()
    started = time.time()
    try:
        ensure_venv(args.python, args.skip_install)
    except InstallError as error:
        elephas = {"error": "building .venv-elephas failed", "log": str(error)}
    else:
        elephas = run_elephas(args)
    if "error" in elephas:
        print("elephas side FAILED:", elephas["error"], elephas.get("log", ""), flush=True)
    measured = distkeras_line()  # Before the import: others may be editing distkeras/.
    load, ours = run_ours(args)
    body = section_body(elephas, ours, (load, measured), args, time.time() - started)
    if args.no_write:
        print(body)
    else:
        report.write_section("elephas side by side", body)
    print(f"total {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
