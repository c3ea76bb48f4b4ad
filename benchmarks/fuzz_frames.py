"""A longer fuzzing run of the frame decoder than the test suite's hypothesis tests.

Mutates valid frames (bit flips, truncations, insertions, lying lengths, random headers) and
feeds them to `decode_message`, with and without a weight spec. Every input must be decoded
or refused with `ProtocolError`; anything else is a bug. Records how many inputs it tried.

    python benchmarks/fuzz_frames.py [--seconds 60] [--seed 0]
"""

import argparse
import json
import os
import random
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402

from distkeras.transport import networking  # noqa: E402
from distkeras.transport.networking import ProtocolError, weights_array  # noqa: E402

SPEC = [((4, 3), np.float32), ((3,), np.float32)]


def seeds():
    delta = weights_array([np.ones((4, 3), np.float32), np.zeros(3, np.float32)])
    return [networking.encode_message(message) for message in (
        {"delta": delta, "worker_id": 1, "last_update": 5},
        {"center": delta, "num_updates": 2},
        {"history": {"loss": [0.5, 0.25], "iteration": [1, 2]}},
        {"token": "x" * 64, "worker_id": 0},
        {"array": np.arange(6, dtype=np.int64).reshape(2, 3), "text": "hé"},
    )]


def mutate(data, rng):
    data = bytearray(data)
    choice = rng.randrange(7)
    if choice == 0 and data:  # flip bits
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif choice == 1:  # truncate
        del data[rng.randrange(len(data) + 1):]
    elif choice == 2:  # insert junk
        position = rng.randrange(len(data) + 1)
        data[position:position] = os.urandom(rng.randint(1, 64))
    elif choice == 3 and len(data) >= 16:  # lying lengths, up to 2**63
        header_len = rng.choice([0, 1, rng.randrange(1 << 32)])
        body_len = rng.choice([0, rng.randrange(1 << 20), (1 << 63) - 1, rng.randrange(1 << 64)])
        data[4:16] = struct.pack("<IQ", header_len, body_len)
    elif choice == 4 and len(data) >= 16:  # a random JSON header of the right length
        header = json.dumps(rng.choice([
            {"f": {"a": {"t": "arrays", "i": [0, 0]}}, "a": [["<f4", [1]]]},
            {"f": {"a": {"t": "array", "i": 5}}, "a": []},
            {"f": [], "a": {}}, {"f": {"a": {"t": "json"}}, "a": [["|O", [1]]]},
            {"f": {"a": {"t": "array", "i": 0}}, "a": [["<f8", [2**40, 2**40]]]},
        ])).encode()
        data = bytearray(data[:4]) + struct.pack("<IQ", len(header), 0) + header
    elif choice == 5:
        data = bytearray(os.urandom(rng.randint(0, 256)))
    else:  # splice two frames
        data += data[: rng.randrange(len(data) + 1)]
    return bytes(data)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import report

    rng = random.Random(args.seed)
    corpus = seeds()
    tried = decoded = refused = 0
    failures = []
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        data = mutate(rng.choice(corpus), rng)
        for spec in (None, SPEC):
            tried += 1
            try:
                networking.decode_message(data, weight_spec=spec)
                decoded += 1
            except ProtocolError:
                refused += 1
            except Exception as error:  # the bug this run looks for
                failures.append(f"{type(error).__name__}: {error} for {data[:64]!r}")
    rows = [["inputs tried", tried], ["decoded", decoded], ["refused (ProtocolError)", refused],
            ["other exceptions (bugs)", len(failures)]]
    body = (f"{args.seconds:.0f} s, seed {args.seed}.\n\n" + report.table(["", "count"], rows)
            + ("\n\nFirst failures:\n\n" + "\n".join(f"- `{f}`" for f in failures[:5])
               if failures else ""))
    report.write_section("Fuzzing the frame decoder", body)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
