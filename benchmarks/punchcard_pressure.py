"""Punchcard under pressure: withheld bodies, large bodies and downloads (issue #47).

Starts `distkeras punchcard` on 127.0.0.1 in its own process (--connection-limit 100), then
measures: a legitimate `GET /api/state`'s latency alone and while clients send whole
headers and withhold their bodies (any secret, three times the connection limit, each
back as soon as it is dropped); the server process's peak memory (VmHWM, reset before
each) under concurrent downloads of a large model and concurrent large submissions of
one secret. Writes the section "Punchcard under pressure: measured" of docs/reliability.md.

    python benchmarks/punchcard_pressure.py [--withholders 300] [--model-mb 100]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "punchcard"))

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "reliability.md")


def _latencies(url, secret, count=20):
    """Seconds of ``count`` state requests (inf: not answered 404 within 60 s)."""
    from punchcard_support import call_api

    seconds = []
    for _ in range(count):
        start = time.perf_counter()
        try:
            answered = call_api(url, "/api/state", secret, timeout=60)[0] == 404
        except OSError:
            answered = False
        seconds.append(time.perf_counter() - start if answered else float("inf"))
        time.sleep(0.25)
    return seconds


def _summary(seconds):
    return (f"median {statistics.median(seconds) * 1000:.1f} ms, max "
            f"{max(seconds) * 1000:.1f} ms, {sum(s == float('inf') for s in seconds)} "
            "unanswered")


def main():
    import report
    from punchcard_support import call_api, free_port, reachable, wait_for
    from test_punchcard_pressure import (_concurrently, _download, _headers, _job_row,
                                         _peak_rss, _reset_peak_rss, _withhold)

    from distkeras.punchcard.secrets_file import append_entry, generate_secret, make_entry

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--withholders", type=int, default=300)
    parser.add_argument("--model-mb", type=int, default=100)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="punchcard-pressure-")
    secrets_path, work = os.path.join(folder, "secrets.json"), os.path.join(folder, "work")
    secrets = {f"user{index}": generate_secret() for index in range(8)}
    for name, secret in secrets.items():
        append_entry(secrets_path, make_entry(name, secret))
    model_size = args.model_mb << 20
    downloaders = ["user4", "user5", "user6", "user7"]
    for index, name in enumerate(downloaders):
        _job_row(work, secrets[name], name, "finished", index, os.urandom(model_size))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "distkeras.cli", "punchcard", "--secrets", secrets_path,
         "--host", "127.0.0.1", "--port", str(port), "--work-dir", work, "--max-running",
         "0", "--connection-limit", "100", "--header-timeout", "10"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows, memory = [], []
    try:
        assert wait_for(lambda: reachable(url), timeout=120)
        rows.append(["`GET /api/state`, alone (20 requests)",
                     _summary(_latencies(url, secrets["user0"]))])
        requests = [_headers("/api/submit", secrets["user1"], 1 << 20),
                    _headers("/api/submit", "wrong", 1 << 20),
                    _headers("/api/submit", None, 256 << 20),
                    _headers("/api/state", secrets["user2"], 60_000, method="GET")]
        stop, opened = threading.Event(), []
        attack = threading.Thread(target=lambda: opened.append(_withhold(
            port, args.withholders, requests, stop)), daemon=True)
        attack.start()
        time.sleep(5)
        attacked = _latencies(url, secrets["user0"])
        stop.set()
        attack.join(timeout=60)
        rows.append([f"`GET /api/state` while {args.withholders} clients send whole headers "
                     "(Content-Length 1 MiB to 256 MiB; a valid secret, a wrong one, none) "
                     "and withhold the body (connection limit 100; 20 requests)",
                     f"{_summary(attacked)}; {opened[0]} withholding connections opened"])

        _reset_peak_rss(server.pid)
        before = _peak_rss(server.pid)
        answers = _concurrently(8, lambda index: _download(url, secrets[downloaders[index % 4]]))
        memory.append([f"8 concurrent downloads (4 secrets, 2 each) of a {args.model_mb} MB "
                       "model", f"{before >> 20} MiB -> {_peak_rss(server.pid) >> 20} MiB "
                       f"(answered {sorted(status for status, _ in answers)})"])
        def body(size):
            return json.dumps({"job_name": "big", "data_path": "hdfs:///x",
                               "num_executors": 1, "num_processes": 1,
                               "trainer": {"class_name": "ADAG", "config": {}},
                               "model": "A" * size}).encode()

        call_api(url, "/api/submit", secrets["user3"], data=body(4096))  # its imports
        large = body(args.model_mb << 20)
        _reset_peak_rss(server.pid)
        before = _peak_rss(server.pid)
        answers = _concurrently(6, lambda _: call_api(url, "/api/submit", secrets["user3"],
                                                      data=large, timeout=600))
        memory.append([f"6 concurrent {args.model_mb} MB submissions of one secret",
                       f"{before >> 20} MiB -> {_peak_rss(server.pid) >> 20} MiB "
                       f"(answered {sorted(status for status, _ in answers)})"])
    finally:
        server.terminate()
        server.wait(timeout=60)
    text = (report.table(["request", "latency"], rows) + "\n\n"
            + report.table(["pressure (issue #47)", "server's peak memory (VmHWM, reset "
                            "before each)"], memory))
    report.write_section("Punchcard under pressure: measured", text, doc=DOC)


if __name__ == "__main__":
    main()
