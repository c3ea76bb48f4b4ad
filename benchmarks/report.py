"""Writes a benchmark's full table into benchmarks/results.md, under its own heading.

docs/benchmarks.md keeps today's figure for each question, copied from there by hand."""

import json
import os
import platform
import re
import sys
import time

DOC = os.path.join(os.path.dirname(__file__), "results.md")


def machine(backend=None):
    """One line naming the machine and the versions that matter.

    Args:
        backend: The Keras backend(s) to name; default: this process's.
    """
    import jax
    import keras
    import numpy
    import pyspark

    cores = os.cpu_count()
    backend = backend or keras.backend.backend()
    return (f"{platform.machine()}, {cores} cores, Python {platform.python_version()}, "
            f"Keras {keras.__version__} ({backend}), JAX {jax.__version__}, "
            f"PySpark {pyspark.__version__}, numpy {numpy.__version__}")


def table(header, rows):
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def included(paths):
    """The records that earlier runs of a benchmark wrote with its ``--json``."""
    records = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            records += json.load(handle)
    return records


def write_section(title, body, backend=None, doc=DOC):
    """Replaces (or appends) the section ``## title`` of benchmarks/results.md.

    Args:
        title: The section's heading.
        body: Its text, after the command line and the machine's line.
        backend: The Keras backend(s) measured, where not this process's.
        doc: The document, if not benchmarks/results.md.
    """
    command = "python " + " ".join(sys.argv)
    section = (f"## {title}\n\n`{command}`\n\n{time.strftime('%Y-%m-%d')}, {machine(backend)}\n\n"
               f"{body.strip()}\n")
    text = open(doc, encoding="utf-8").read() if os.path.exists(doc) else \
        "# Benchmark results\n\nEach section: the last run of its command, in full.\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with open(doc, "w", encoding="utf-8") as handle:
        handle.write(text.rstrip("\n") + "\n")
    print(section)


def fashion_mnist_setup(master="local[2]", limit=None, packed=False):
    """Spark (started before Keras), warmed executors, the cached training DataFrame
    (features packed as float32 bytes with ``packed=True``) and the 10,000 test images as
    ``(images, labels)`` in [0, 1]."""
    from distkeras.session import local_spark_session, warm_up_executors

    spark = local_spark_session(master)
    warm_up_executors(spark, 2)
    from distkeras.datasets import load_fashion_mnist, load_fashion_mnist_numpy

    # Two even partitions (Spark's split of the Parquet file is uneven); 1-worker runs
    # coalesce them without a shuffle.
    train = load_fashion_mnist(spark, "train", limit=limit, num_partitions=2,
                               packed=packed).cache()
    train.count()
    images, labels = load_fashion_mnist_numpy("test")
    return spark, train, (images.reshape(len(images), -1).astype("float32") / 255.0, labels)
