"""dist-keras's networking helpers under their dist-keras import path: `connect`,
`send_data` and `recv_data`, as a custom worker or server of seed 000's tutorial uses them.

A thin face: they live in `distkeras.transport.networking`, with the wire format, the
actions and the checks (import those from there).
"""

from distkeras.transport.networking import connect, recv_data, send_data

__all__ = ["connect", "recv_data", "send_data"]
