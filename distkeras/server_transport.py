"""The socket transport of the parameter servers, under its old import path.

A thin face: the names live in `distkeras.transport.socket_transport` (see there).
"""

from distkeras.transport.socket_transport import Listener, SocketTransport

__all__ = ["Listener", "SocketTransport"]
