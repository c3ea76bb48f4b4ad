"""The wire format and the connections between workers and the parameter server, under
their dist-keras import path.

A thin face: the names live in `distkeras.transport.networking` (see there).
"""

from distkeras.transport.networking import (MAGIC, VERSION, MAX_HEADER_BYTES,
                                            DEFAULT_MAX_FRAME_BYTES,
                                            HANDSHAKE_MAX_FRAME_BYTES, ACTION_PULL,
                                            ACTION_COMMIT, ACTION_HISTORY, ACTION_QUIT,
                                            ACTION_PULL_UNLESS_OWN, ACTION_FAILURE,
                                            ACTION_COMPILING, ProtocolError, PeerClosedError,
                                            weights_array, Connection, shutdown_socket,
                                            close_socket, encode_frame, send_data,
                                            recv_exact, decode_frame, recv_data,
                                            encode_message, decode_message, send_action,
                                            recv_action, authenticate, task_attempt_id,
                                            hello_attempt, check_token, connect)

__all__ = ["MAGIC", "VERSION", "MAX_HEADER_BYTES", "DEFAULT_MAX_FRAME_BYTES",
           "HANDSHAKE_MAX_FRAME_BYTES", "ACTION_PULL", "ACTION_COMMIT", "ACTION_HISTORY",
           "ACTION_QUIT", "ACTION_PULL_UNLESS_OWN", "ACTION_FAILURE", "ACTION_COMPILING",
           "ProtocolError", "PeerClosedError", "weights_array", "Connection",
           "shutdown_socket", "close_socket", "encode_frame", "send_data", "recv_exact",
           "decode_frame", "recv_data", "encode_message", "decode_message", "send_action",
           "recv_action", "authenticate", "task_attempt_id", "hello_attempt", "check_token",
           "connect"]
