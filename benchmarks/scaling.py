"""Scaling per core: 1 worker on 1 core against 2 workers on 2 cores, and plain fit on each.

A worker alone on this 2-core machine already uses both cores (JAX spreads a step over every
core it may use, as `fit` does), so "2 workers against 1 worker on the same machine" cannot
show how distkeras scales. This runs `benchmarks/training.py` twice, each time with the
whole job (driver, JVM, executors) restricted to the first N cores, and compares:

* ADAG with 2 workers on 2 cores against ADAG with 1 worker on 1 core (the scaling),
* ADAG with 1 worker against `keras.Model.fit` on the same single core (the per-worker cost),
* `fit` on 2 cores against `fit` on 1 core (what one process gets from a second core).

    python benchmarks/scaling.py [--window 12] [--repeat 2] [--limit N]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

import distkeras  # noqa: E402,F401  (JAX as the Keras backend for report.machine())

from training import FIT, _rate, _ratio  # noqa: E402


def run_training(cores, runs, window, repeat, limit):
    """Runs training.py restricted to ``cores`` cores; returns its results by name."""
    with tempfile.NamedTemporaryFile(suffix=".json") as output:
        command = [sys.executable, os.path.join(os.path.dirname(__file__), "training.py"),
                   "--cores", str(cores), "--window", str(window), "--repeat", str(repeat),
                   "--json", output.name, "--runs", *runs]
        if limit:
            command += ["--limit", str(limit)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        with open(output.name, encoding="utf-8") as handle:
            data = json.load(handle)
    return data["samples"], data["results"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    import report

    samples, on_one = run_training(1, ["fit", "adag1"], args.window, args.repeat, args.limit)
    _, on_two = run_training(2, ["fit", "adag1", "adag2"], args.window, args.repeat,
                             args.limit)
    one_worker = f"ADAG, 1 worker, window {args.window}"
    two_workers = f"ADAG, 2 workers, window {args.window}"
    rows = []
    for cores, results in ((1, on_one), (2, on_two)):
        for name, (whole, steps, accuracy) in results.items():
            rows.append([cores, name, _rate(whole), _rate(steps), f"{accuracy:.4f}"])
    scaling = on_two[two_workers][0] / on_one[one_worker][0]
    scaling_steps = _ratio(on_two[two_workers][1], on_one[one_worker][1])  # "-": a single window
    body = (f"{samples} samples, 1 epoch, batch 32, Adam; best of {args.repeat} runs; "
            "`local[2]`; each block is one process tree restricted to that many cores "
            "(`--cores`), executors warmed up before timing.\n\n"
            + report.table(["cores", "run", "samples/s (whole train())",
                            "samples/s (steps only)", "test accuracy"], rows)
            + "\n\n"
            + f"- ADAG 2 workers on 2 cores / ADAG 1 worker on 1 core: **{scaling:.2f}x** "
              f"(steps only {scaling_steps}x).\n"
            + f"- ADAG 1 worker / `fit`, both on 1 core: "
              f"**{on_one[one_worker][0] / on_one[FIT][0]:.2f}** "
              f"(steps only {_ratio(on_one[one_worker][1], on_one[FIT][0])}).\n"
            + f"- ADAG 1 worker / `fit`, both on 2 cores: "
              f"{on_two[one_worker][0] / on_two[FIT][0]:.2f}.\n"
            + f"- `fit` on 2 cores / `fit` on 1 core: {on_two[FIT][0] / on_one[FIT][0]:.2f}x; "
              f"ADAG 2 workers / 1 worker, both on 2 cores: "
              f"{on_two[two_workers][0] / on_two[one_worker][0]:.2f}x.")
    report.write_section(f"Scaling per core (window {args.window})", body)


if __name__ == "__main__":
    main()
