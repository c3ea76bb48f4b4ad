"""Punchcard under attack: what hostile clients cost a real server, and what others see.

Starts `distkeras punchcard` on 127.0.0.1 in its own process (--connection-limit 100), then
measures: a legitimate request's latency alone and while 10x the connection limit of
clients trickle their headers; the server process's peak memory (VmHWM) after each hostile
request of issue #32; whether, after 100 hostile submissions, legitimate submissions from
other secrets are all accepted; and a model check's latency (a child process, warm or
cold). Writes the section "Punchcard under attack" of docs/reliability.md.

    python benchmarks/punchcard_attacks.py [--tricklers 1000]
"""

import argparse
import base64
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "reliability.md")
SECRET_HEADER = "X-Punchcard-Secret"


def _request(url, path, secret, body=None, timeout=600):
    """(status, seconds) of one request; the refusal's message is logged."""
    data = None if body is None else (body if isinstance(body, bytes) else
                                      json.dumps(body).encode())
    request = urllib.request.Request(url + path, data=data, headers={
        SECRET_HEADER: secret, "Content-Type": "application/json"})
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        sys.stderr.write(f"{error.code}: {error.read()[:300]!r}\n")
        status = error.code
    except (urllib.error.URLError, OSError):
        status = None
    return status, time.perf_counter() - start


def _peak_mib(pid):
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def main():
    import report
    from distkeras.punchcard.secrets_file import append_entry, generate_secret, make_entry
    from test_punchcard_attacks import _hostile_submissions, _lambda_layer, _archive, \
        _activation, _payload, _trickle

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tricklers", type=int, default=1000)
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="punchcard-attacks-")
    secrets_path = os.path.join(folder, "secrets.json")
    secrets = [generate_secret() for _ in range(8)]
    for index, secret in enumerate(secrets):
        append_entry(secrets_path, make_entry(f"user{index}", secret))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "distkeras.cli", "punchcard", "--secrets", secrets_path,
         "--host", "127.0.0.1", "--port", str(port), "--work-dir", folder + "/work",
         "--max-running", "0", "--connection-limit", "100", "--header-timeout", "10",
         "--allowed-data-root", "/data"],  # the payloads' data path (never read)
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows, notes = [], []
    try:
        while _request(url, "/api/state", secrets[0], timeout=5)[0] is None:
            time.sleep(0.5)
        time.sleep(15)  # the warm checker's Keras import, out of the first check's time
        alone = [_request(url, "/api/state", secrets[0])[1] for _ in range(20)]
        stop = threading.Event()
        trickler = threading.Thread(target=_trickle, args=(port, args.tricklers, stop),
                                    daemon=True)
        trickler.start()
        time.sleep(5)
        attacked = []
        for _ in range(20):
            status, seconds = _request(url, "/api/state", secrets[0], timeout=60)
            attacked.append(seconds if status == 404 else float("inf"))
            time.sleep(0.5)
        stop.set()
        trickler.join(timeout=60)
        rows.append(["`GET /api/state`, alone (20 requests)",
                     f"median {statistics.median(alone) * 1000:.1f} ms, "
                     f"max {max(alone) * 1000:.1f} ms"])
        rows.append([f"`GET /api/state` while {args.tricklers} clients trickle headers "
                     "(connection limit 100, header timeout 10 s; 20 requests)",
                     f"median {statistics.median(attacked) * 1000:.1f} ms, "
                     f"max {max(attacked) * 1000:.1f} ms, "
                     f"{sum(s == float('inf') for s in attacked)} unanswered"])

        payload = _payload(secrets[1])
        start = time.perf_counter()
        status, check = _request(url, "/api/submit", secrets[1], payload)
        rows.append(["a legitimate submission (MLP 784-128-10, ADAG), its check in a warm "
                     "child", f"{check:.1f} s (answered {status})"])
        status, cold = _request(url, "/api/submit", secrets[2], _payload(secrets[2]))
        rows.append(["the next one, right after (its child still importing Keras)",
                     f"{cold:.1f} s (answered {status})"])
        baseline = _peak_mib(server.pid)
        memory = [["(server process after start and two checks)", f"{baseline:.0f} MiB"]]
        hostile = _hostile_submissions(_payload(secrets[3]))
        hostile.append(("30 MB body of `[{},{},...]`", b"[" + b"{}," * (10 << 20) + b"{}]",
                        ""))
        for what, body, _ in hostile:
            status, seconds = _request(url, "/api/submit", secrets[3], body)
            memory.append([what, f"{_peak_mib(server.pid):.0f} MiB (answered {status} in "
                                 f"{seconds * 1000:.0f} ms)"])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
            start = time.perf_counter()
            client.sendall(f"POST /api/submit HTTP/1.1\r\nHost: x\r\n{SECRET_HEADER}: wrong"
                           f"\r\nContent-Length: {256 << 20}\r\n\r\n".encode())
            answer = client.recv(100).split(b"\r\n")[0].decode()
        memory.append(["256 MB upload announced with an unknown secret",
                       f"{_peak_mib(server.pid):.0f} MiB ({answer} after "
                       f"{(time.perf_counter() - start) * 1000:.0f} ms, no byte of the body "
                       "read)"])

        threads_before = _threads(server.pid)
        lambda_archive = {**payload, "model": _archive(payload, _lambda_layer)}
        activation_archive = {**payload, "model": _archive(payload, _activation(
            "keras.distribution", "set_distribution"))}
        refused = sum(_request(url, "/api/submit", secrets[4],
                               (lambda_archive, activation_archive)[index % 2])[0] == 400
                      for index in range(100))
        accepted = [_request(url, "/api/submit", secret, _payload(secret))[0]
                    for secret in secrets[5:8]]
        notes.append(f"After 100 hostile submissions (Lambda calling `set_distribution`, "
                     f"an activation naming it; {refused} refused), legitimate submissions "
                     f"of 3 other secrets answered {accepted}; the server's threads "
                     f"{threads_before} before, {_threads(server.pid)} after; peak memory "
                     f"{_peak_mib(server.pid):.0f} MiB.")
    finally:
        server.terminate()
        server.wait(timeout=60)
    body = (report.table(["request", "latency"], rows) + "\n\n"
            + report.table(["hostile request (issue #32)", "server's peak memory after it"],
                           memory) + "\n\n" + " ".join(notes))
    report.write_section("Punchcard under attack: measured", body, doc=DOC)


if __name__ == "__main__":
    main()
