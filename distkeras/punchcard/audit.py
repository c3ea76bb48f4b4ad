"""Punchcard's audit log: one JSON line per request that changed or was refused.

Each line: ``{"time": ISO 8601 UTC, "identity": who (or null for an unknown secret),
"action": "submit" | "cancel" | ..., "job": its id or null, "outcome": "accepted" |
"refused", "status": the HTTP status, "reason": the refusal's message or null}``.
"""

import datetime
import json
import logging
import os
import threading

logger = logging.getLogger(__name__)


class AuditLog:
    """Appends audit records to a file (created 0600 if missing).

    Args:
        path: The file, or None to keep no audit log.
    """

    def __init__(self, path):
        self.path = path
        self._lock = threading.Lock()
        self._failed = False

    def record(self, identity, action, outcome, status=None, job=None, reason=None):
        """Appends one record; a write that fails is logged once, never raised."""
        if self.path is None:
            return
        line = json.dumps({
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="milliseconds"),
            "identity": identity, "action": action, "job": job, "outcome": outcome,
            "status": status, "reason": reason}) + "\n"
        try:
            with self._lock:
                descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                with open(descriptor, "a", encoding="utf-8") as handle:
                    handle.write(line)
            self._failed = False
        except OSError as error:
            if not self._failed:
                logger.error("Cannot write the audit log %s: %s", self.path, error)
            self._failed = True
