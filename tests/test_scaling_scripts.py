"""The scaling benchmarks (benchmarks/ps_capacity.py, benchmarks/staleness.py) run for a
tiny case: the real server, real sockets, simulated workers in spawned processes."""

import json
import os
import subprocess
import sys

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
        assert result["bytes_per_pair"] == 8 * result["params"]
        assert result["server_cpu_s"] > 0 and result["cpu_ms_per_pair"] > 0
    # A lone worker's pulls carry no weights: only its own commits moved the center.
    assert results[0]["pulls_with_weights"] == 0
    assert "| 2 | adag | flat out | 6 |" in run.stdout


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
