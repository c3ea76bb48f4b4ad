"""The scaling benchmarks (benchmarks/ps_capacity.py, benchmarks/staleness.py) run for a
tiny case: the real server, real sockets, simulated workers in spawned processes."""

import json
import os
import subprocess
import sys

import numpy as np

from test_benchmark_scripts import BENCHMARKS, load_script


def test_ps_capacity_serves_every_commit_of_its_simulated_workers(tmp_path):
    output = tmp_path / "capacity.json"
    run = subprocess.run(
        [sys.executable, os.path.join(BENCHMARKS, "ps_capacity.py"), "--params", "2000",
         "--workers", "1", "2", "--commits", "3", "--json", str(output)],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    results = json.loads(output.read_text())
    assert [result["workers"] for result in results] == [1, 2]
    for result in results:
        # The 4 Dense(w -> w) layers of the simulated model hold about --params.
        assert 1500 < result["params"] < 2500
        assert result["server_cpu_s"] > 0 and result["cpu_ms_per_pair"] > 0
    # A lone worker's pulls carry no weights: only its own commits moved the center.
    assert results[0]["pulls_with_weights"] == 0
    # Measured on the sockets: the commit's 4 bytes per parameter and the frames' headers
    # (a lone worker's pulls carry none); the pulls' 4 more with 2 workers.
    assert 4 * results[0]["params"] < results[0]["bytes_per_pair"] < 4.5 * results[0]["params"]
    assert 4 * results[1]["params"] < results[1]["bytes_per_pair"] < 8.5 * results[1]["params"]
    assert "| 2 | adag | 1 | none | flat out | 6 |" in run.stdout


def test_ps_capacity_serves_a_sharded_center_and_sums_its_cpu(tmp_path):
    output = tmp_path / "capacity.json"
    run = subprocess.run(
        [sys.executable, os.path.join(BENCHMARKS, "ps_capacity.py"), "--params", "20000",
         "--workers", "2", "--commits", "3", "--server", "dynsgd", "--shards", "1", "2",
         "--json", str(output)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr  # it raises when a commit was not applied
    one, two = json.loads(output.read_text())
    assert [one["shards"], two["shards"]] == [1, 2]
    assert one["params"] == two["params"] and two["server_cpu_s"] > 0
    # The same weights travel, split over two connections (one more frame header each).
    weights = 4 * two["params"] * (1 + two["pulls_with_weights"])
    assert weights < two["bytes_per_pair"] < weights + 4000
    assert "server CPU ms/pair (all shards)" in run.stdout


def test_ps_capacity_measures_each_compression_side_by_side(tmp_path):
    output = tmp_path / "capacity.json"
    run = subprocess.run(
        [sys.executable, os.path.join(BENCHMARKS, "ps_capacity.py"), "--params", "20000",
         "--workers", "2", "--commits", "3", "--compression", "none", "bfloat16", "topk",
         "--json", str(output)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    none, bfloat16, topk = json.loads(output.read_text())
    assert [none["compression"], bfloat16["compression"], topk["compression"]] == \
        ["none", "bfloat16", "topk:0.01"]
    assert all(result["params"] == none["params"] for result in (bfloat16, topk))
    # The weights' bytes, 4 or 2 per entry, in each commit and each pull that carries them,
    # plus the frames' headers; top-k's commits are 1% of the entries at 8 bytes each.
    for result, size in ((none, 4), (bfloat16, 2)):
        weights = size * result["params"] * (1 + result["pulls_with_weights"])
        assert weights < result["bytes_per_pair"] < weights + 2000
    assert topk["bytes_per_pair"] < 4 * none["params"] * (topk["pulls_with_weights"] + 0.1)
    assert "x first" in run.stdout


def test_ps_capacity_model_width_matches_the_parameter_count():
    capacity = load_script("ps_capacity")
    for params in (1e6, 1e7, 1e8):
        width = capacity.layer_width(params)
        count = capacity.LAYERS * (width * width + width)
        assert abs(count - params) / params < 0.01


def test_ps_capacity_refuses_zero_commits():
    run = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "ps_capacity.py"),
                          "--commits", "0"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--commits" in run.stderr


def test_staleness_runs_real_training_for_a_tiny_case(tmp_path):
    output = tmp_path / "staleness.json"
    plot = tmp_path / "staleness.png"
    run = subprocess.run(
        [sys.executable, os.path.join(BENCHMARKS, "staleness.py"), "--workers", "1", "2",
         "--rows", "640", "--test-rows", "200", "--epochs", "1", "--hidden", "8",
         "--algorithms", "DOWNPOUR", "AEASGD", "--json", str(output), "--plot", str(plot)],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    results = json.loads(output.read_text())
    assert [(r["algorithm"], r["workers"]) for r in results] == [
        ("DOWNPOUR", 1), ("DOWNPOUR", 2), ("AEASGD", 1), ("AEASGD", 2)]
    # 20 batches: DOWNPOUR's windows of 5 make 4 commits, 2 workers of 10 batches 2 + 2;
    # AEASGD's window of 32 one per worker (the short last window).
    assert [r["commits"] for r in results] == [4, 4, 1, 2]
    assert results[0]["mean_staleness"] == 0 and results[1]["mean_staleness"] > 0
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in results)
    assert plot.stat().st_size > 1000
    assert "| DOWNPOUR (5) | " in run.stdout


def test_staleness_counts_the_others_commits_since_a_workers_pull():
    staleness = load_script("staleness")
    rng = np.random.default_rng(0)
    images = rng.random((32 * 20, 784), dtype=np.float32)
    labels = rng.integers(0, 10, 32 * 20).astype("int32")
    replicas = staleness.Replicas(hidden=4)
    # Equal speeds, no jitter: two workers alternate, each commit one update stale
    # (the other's) after the first.
    _, counts = staleness.simulate("DynSGD", 2, replicas, images, labels, 32, 1, 0.0, 0.0, 0)
    assert counts == [0, 1, 1, 1]
    _, counts = staleness.simulate("DynSGD", 4, replicas, images, labels, 32, 1, 0.0, 0.0, 0)
    assert counts == [0, 1, 2, 3]


def test_ps_capacity_compares_reuse_buffers_and_breaks_the_server_cpu_down(tmp_path):
    output = tmp_path / "compare.json"
    run = subprocess.run(
        [sys.executable, os.path.join(BENCHMARKS, "ps_capacity.py"), "--params", "2000",
         "--workers", "2", "--commits", "3", "--compare-reuse", "1", "--breakdown",
         "--json", str(output)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    results = json.loads(output.read_text())
    assert [r["server"] for r in results] == ["adag", "adag reuse"]
    for operation in ("read a commit or a request", "add (under the lock)", "send a pull"):
        assert f"| {operation} | " in run.stdout


def test_ps_capacity_times_the_array_operations():
    capacity = load_script("ps_capacity")
    costs = capacity.operation_costs(1000, repeat=2)
    assert len(costs) == 10 and all(cost >= 0 for cost in costs.values())
    assert "center + update into a reused buffer (reuse_buffers)" in costs
    assert any("widened in chunks" in name for name in costs)  # the server's bfloat16 add


def test_staleness_sends_through_the_workers_compression():
    staleness = load_script("staleness")
    rng = np.random.default_rng(0)
    images = rng.random((32 * 20, 784), dtype=np.float32)
    labels = rng.integers(0, 10, 32 * 20).astype("int32")
    replicas = staleness.Replicas(hidden=4)

    def center(algorithm, compression):
        weights, _ = staleness.simulate(algorithm, 2, replicas, images, labels, 32, 1, 0.1,
                                        0.25, 0, compression)
        return np.concatenate([layer.reshape(-1) for layer in weights])

    for algorithm in staleness.ALGORITHMS:
        plain = center(algorithm, None)
        # Top-k of every entry sends the whole update: the same run, bit for bit.
        assert np.array_equal(center(algorithm, "topk:1"), plain), algorithm
        # bfloat16 and 1% top-k change what reaches the center, not its scale.
        for compression in ("bfloat16", "topk"):
            changed = center(algorithm, compression)
            assert not np.array_equal(changed, plain), (algorithm, compression)
            assert np.abs(changed - plain).max() < 0.1, (algorithm, compression)


def test_staleness_pulls_the_center_cut_to_bfloat16():
    staleness = load_script("staleness")
    from distkeras.transport import compression as codecs
    from distkeras.transport.networking import weights_array

    center = weights_array([np.array([1.0 + 2 ** -12, -3.3], np.float32)])
    worker = staleness.SimWorker(0, np.zeros((32, 784), np.float32), np.zeros(32, "int32"),
                                 32, 1, 5, 1.0)
    assert staleness.pulled_center(worker, center) is center
    worker.encoder = codecs.Encoder(codecs.parse("bfloat16"), [((2,), np.float32)])
    pulled = staleness.pulled_center(worker, center)[0]
    assert pulled.dtype == np.float32 and not np.any(pulled.view(np.uint32) & 0xFFFF)
    assert pulled[0] == 1.0 and abs(pulled[1] + 3.3) < 3.3 * 2 ** -7


def test_staleness_crosses_compressions_with_worker_counts(tmp_path):
    output = tmp_path / "staleness.json"
    run = subprocess.run(
        [sys.executable, os.path.join(BENCHMARKS, "staleness.py"), "--workers", "1", "2",
         "--rows", "640", "--test-rows", "200", "--epochs", "1", "--hidden", "8",
         "--algorithms", "ADAG", "--compression", "none", "bfloat16", "topk:0.05",
         "--json", str(output), "--plot", str(tmp_path / "staleness.png")],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    results = json.loads(output.read_text())
    assert [(r["compression"], r["workers"]) for r in results] == [
        ("none", 1), ("none", 2), ("bfloat16", 1), ("bfloat16", 2), ("topk:0.05", 1),
        ("topk:0.05", 2)]
    assert "| ADAG (12), topk:0.05 | " in run.stdout and "| ADAG (12) | " in run.stdout
    bad = subprocess.run(
        [sys.executable, os.path.join(BENCHMARKS, "staleness.py"), "--compression", "int8"],
        capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "topk:F" in bad.stderr
