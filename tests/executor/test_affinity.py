"""Workers sharing a machine each claim their own cores, and give them back."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from distkeras.executor import affinity

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"),
                                reason="CPU affinity is Linux only")

# Holds its claim until stdin closes, so several of them hold claims at the same time.
_CLAIMANT = textwrap.dedent("""
    import json, os, sys, threading
    from distkeras.executor import affinity
    affinity.LOCK_FOLDER = sys.argv[1]
    threading.Thread(target=threading.Event().wait, daemon=True).start()  # pinned too
    with affinity.claimed_cores(int(sys.argv[2])) as cores:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
        seen = [sorted(os.sched_getaffinity(t)) for t in threads]
        print(json.dumps({"cores": sorted(cores), "threads": seen}), flush=True)
        sys.stdin.read()
    print(json.dumps(sorted(os.sched_getaffinity(0))), flush=True)
""")


def _start(folder, workers):
    return subprocess.Popen([sys.executable, "-c", _CLAIMANT, str(folder), str(workers)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_two_workers_get_disjoint_cores_and_give_them_back(tmp_path):
    everything = sorted(os.sched_getaffinity(0))
    first, second = _start(tmp_path, 2), _start(tmp_path, 2)
    try:
        claims = [json.loads(process.stdout.readline()) for process in (first, second)]
        for claim in claims:
            assert claim["cores"]
            # Every thread of the process runs on the claimed cores only.
            assert all(cores == claim["cores"] for cores in claim["threads"])
        assert not set(claims[0]["cores"]) & set(claims[1]["cores"])
        assert len(claims[0]["cores"]) == len(everything) // 2
        restored = []
        for process in (first, second):
            process.stdin.close()
            restored.append(json.loads(process.stdout.readline()))
        assert restored == [everything, everything]
    finally:
        for process in (first, second):
            process.kill()
            process.wait()


def test_a_lone_worker_keeps_every_core():
    everything = set(os.sched_getaffinity(0))
    with affinity.claimed_cores(1) as cores:
        assert cores == everything
        assert os.sched_getaffinity(0) == everything
    with affinity.claimed_cores(None) as cores:
        assert cores == everything


def test_a_killed_worker_frees_its_cores(tmp_path):
    holder = _start(tmp_path, 2)
    claimed = json.loads(holder.stdout.readline())["cores"]
    holder.kill()
    holder.wait()
    again = _start(tmp_path, 2)
    try:
        assert json.loads(again.stdout.readline())["cores"] == claimed
    finally:
        again.kill()
        again.wait()


def test_pinning_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("DISTKERAS_PIN_CORES", "0")
    everything = set(os.sched_getaffinity(0))
    with affinity.claimed_cores(8) as cores:
        assert cores == everything
        assert os.sched_getaffinity(0) == everything


@pytest.mark.parametrize("master, conf, tasks, expected", [
    ("local", {}, 4, 1),
    ("local[2]", {}, 2, 2),
    ("local[2,4]", {}, 5, 2),
    ("local[4]", {}, 1, 1),
    ("local[*]", {}, 1000, os.cpu_count()),
    ("local[4]", {"spark.task.cpus": "2"}, 4, 2),
    ("spark://host:7077", {}, 4, None),
    ("spark://host:7077", {"spark.executor.cores": "8", "spark.task.cpus": "2"}, 16, 4),
    ("yarn", {"spark.executor.cores": "4"}, 2, 2),
])
def test_workers_per_machine(master, conf, tasks, expected):
    assert affinity.workers_per_machine(
        master, tasks, conf.get("spark.task.cpus", 1),
        conf.get("spark.executor.cores")) == expected


def test_an_unusable_lock_folder_leaves_the_worker_unpinned(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the lock folder should be")
    monkeypatch.setattr(affinity, "LOCK_FOLDER", str(blocker))
    everything = set(os.sched_getaffinity(0))
    with affinity.claimed_cores(2) as cores:
        assert cores == everything
        assert os.sched_getaffinity(0) == everything
    assert "runs unpinned" in caplog.text
