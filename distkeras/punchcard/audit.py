"""Punchcard's audit log: one JSON line per request that changed or was refused.

Each line: ``{"time": ISO 8601 UTC, "identity": who (or null for an unknown secret),
"action": "submit" | "cancel" | ..., "job": its id or null, "outcome": "accepted" |
"refused", "status": the HTTP status, "reason": the refusal's message or null}``. A text
field is cut at `MAX_FIELD_CHARS` characters (a request's path is the client's to choose),
and the file is rotated at ``max_bytes``: ``audit.jsonl.1`` is the newest old one.
"""

import datetime
import json
import logging
import os
import threading

logger = logging.getLogger(__name__)

MAX_FIELD_CHARS = 200


def _clipped(value):
    if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
        return value[:MAX_FIELD_CHARS] + f"... ({len(value)} characters)"
    return value


class AuditLog:
    """Appends audit records to a file (created 0600 if missing), rotated by size.

    Args:
        path: The file, or None to keep no audit log.
        max_bytes: The file is renamed ``path.1`` (the older ones shifted up) before a
            line would take it past this size.
        keep: Rotated files kept (``path.1`` to ``path.<keep>``); older ones are deleted.
    """

    def __init__(self, path, max_bytes=64 << 20, keep=4):
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self._lock = threading.Lock()
        self._failed = False

    def record(self, identity, action, outcome, status=None, job=None, reason=None):
        """Appends one record; a write that fails is logged once, never raised."""
        if self.path is None:
            return
        line = json.dumps({
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="milliseconds"),
            "identity": _clipped(identity), "action": _clipped(action), "job": _clipped(job),
            "outcome": outcome, "status": status, "reason": _clipped(reason)}) + "\n"
        try:
            with self._lock:
                self._rotate_before(len(line.encode("utf-8")))
                descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                with open(descriptor, "a", encoding="utf-8") as handle:
                    handle.write(line)
            self._failed = False
        except OSError as error:
            if not self._failed:
                logger.error("Cannot write the audit log %s: %s", self.path, error)
            self._failed = True

    def _rotate_before(self, size):
        """Rotates the file if ``size`` more bytes would take it past ``max_bytes``."""
        try:
            if os.path.getsize(self.path) + size <= self.max_bytes:
                return
        except FileNotFoundError:
            return
        for index in range(self.keep, 0, -1):
            older = f"{self.path}.{index}"
            if index == self.keep:
                if os.path.exists(older):
                    os.remove(older)
            elif os.path.exists(older):
                os.replace(older, f"{self.path}.{index + 1}")
        if self.keep:
            os.replace(self.path, f"{self.path}.1")
        else:
            os.remove(self.path)
