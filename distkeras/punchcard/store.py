"""Punchcard's job table in SQLite: one row per job, so a restart loses nothing."""

import sqlite3
import threading
import time

STATES = ("queued", "running", "finished", "failed", "cancelled")
ACTIVE_STATES = ("queued", "running")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    secret_hash TEXT NOT NULL,
    identity TEXT NOT NULL,
    name TEXT NOT NULL,
    data_path TEXT NOT NULL,
    num_executors INTEGER NOT NULL,
    num_processes INTEGER NOT NULL,
    trainer_class TEXT NOT NULL,
    job_dir TEXT NOT NULL,
    state TEXT NOT NULL,
    error TEXT,
    pid INTEGER,
    created REAL NOT NULL,
    started REAL,
    finished REAL
);
CREATE INDEX IF NOT EXISTS jobs_by_secret ON jobs (secret_hash);
"""


class JobStore:
    """Thread-safe access to the jobs table.

    Args:
        path: The SQLite file.
    """

    def __init__(self, path):
        self.path = path
        self._lock = threading.Lock()
        self._connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._connection.row_factory = sqlite3.Row
        with self._lock:
            self._connection.execute("PRAGMA journal_mode=WAL")
            self._connection.executescript(_SCHEMA)

    def close(self):
        with self._lock:
            self._connection.close()

    def _query(self, sql, parameters=()):
        with self._lock:
            return [dict(row) for row in self._connection.execute(sql, parameters)]

    def insert_if_free(self, job):
        """Inserts ``job`` unless its secret already has one; returns whether it did."""
        columns = ", ".join(job)
        marks = ", ".join("?" for _ in job)
        with self._lock:
            self._connection.execute("BEGIN IMMEDIATE")
            try:
                busy = self._connection.execute(
                    "SELECT 1 FROM jobs WHERE secret_hash = ?", (job["secret_hash"],)).fetchone()
                if busy is None:
                    self._connection.execute(
                        f"INSERT INTO jobs ({columns}) VALUES ({marks})", tuple(job.values()))
                self._connection.execute("COMMIT")
            except sqlite3.Error:
                self._connection.execute("ROLLBACK")
                raise
        return busy is None

    def by_secret(self, secret_hash):
        rows = self._query("SELECT * FROM jobs WHERE secret_hash = ?", (secret_hash,))
        return rows[0] if rows else None

    def by_state(self, *states):
        marks = ", ".join("?" for _ in states)
        return self._query(
            f"SELECT * FROM jobs WHERE state IN ({marks}) ORDER BY created", states)

    def update(self, job_id, only_if_state=None, **fields):
        """Updates a job's fields; with ``only_if_state``, only while it is in that state.

        Returns:
            Whether a row changed.
        """
        assignments = ", ".join(f"{name} = ?" for name in fields)
        sql = f"UPDATE jobs SET {assignments} WHERE id = ?"
        parameters = [*fields.values(), job_id]
        if only_if_state is not None:
            states = (only_if_state,) if isinstance(only_if_state, str) else only_if_state
            sql += f" AND state IN ({', '.join('?' for _ in states)})"
            parameters += list(states)
        with self._lock:
            return self._connection.execute(sql, parameters).rowcount > 0

    def finish(self, job_id, state, error=None, only_if_state=ACTIVE_STATES):
        return self.update(job_id, only_if_state=only_if_state, state=state, error=error,
                           finished=time.time())

    def delete(self, job_id):
        with self._lock:
            self._connection.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
