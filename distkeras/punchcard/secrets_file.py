"""Punchcard secrets: generation, the secrets file, and constant-time checks.

The secrets file is a JSON list. Each entry names an identity and holds either the secret
itself (``{"secret": ..., "identity": ...}``, the original format) or only its SHA-256
(``{"secret_sha256": ..., "identity": ...}``), so the server's disk need not hold secrets
in clear. One identity may own several secrets.
"""

import hashlib
import hmac
import json
import logging
import os
import secrets
import string
import tempfile

logger = logging.getLogger(__name__)

SECRET_LENGTH = 64
_ALPHABET = string.ascii_letters + string.digits


def generate_secret(length=SECRET_LENGTH):
    """A random secret of ``length`` letters and digits, from the OS's secure source."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(length))


def secret_hash(secret):
    """The hex SHA-256 of a secret (secrets are long and random, so no salt is needed)."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def make_entry(identity, secret, hashed=False):
    """A secrets-file entry for ``identity``, holding the secret or only its hash."""
    if hashed:
        return {"secret_sha256": secret_hash(secret), "identity": identity}
    return {"secret": secret, "identity": identity}


def load_secrets(path):
    """Reads a secrets file into a list of ``(sha256 hex, identity)``.

    Raises:
        ValueError: Naming the file and the entry, for anything malformed.
    """
    with open(path, encoding="utf-8") as handle:
        try:
            entries = json.load(handle)
        except ValueError as error:
            raise ValueError(f"Secrets file {path} is not valid JSON: {error}") from error
    if not isinstance(entries, list):
        raise ValueError(f"Secrets file {path} must hold a JSON list of entries.")
    known = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("identity"), str):
            raise ValueError(f"Secrets file {path}, entry {index}: needs an 'identity'.")
        if isinstance(entry.get("secret"), str):
            known.append((secret_hash(entry["secret"]), entry["identity"]))
        elif isinstance(entry.get("secret_sha256"), str):
            digest = entry["secret_sha256"].lower()
            # Checked here: a digest that is not 64 hex digits would fail every request.
            if len(digest) != 64 or not set(digest) <= set("0123456789abcdef"):
                raise ValueError(
                    f"Secrets file {path}, entry {index}: 'secret_sha256' must be 64 hex "
                    "digits (scripts/generate_secret.py --hashed writes one).")
            known.append((digest, entry["identity"]))
        else:
            raise ValueError(
                f"Secrets file {path}, entry {index}: needs 'secret' or 'secret_sha256'.")
    return known


def append_entry(path, entry):
    """Adds an entry to a secrets file (created if missing), rewriting it atomically.

    Raises:
        ValueError: If the file exists but is not a valid secrets file (it is left as is).
    """
    entries = []
    if os.path.exists(path):
        try:
            load_secrets(path)  # the same checks as the server's, before anything is written
        except ValueError as error:
            raise ValueError(f"{error} Nothing was added: fix the file, or give another "
                             "path to start a new one.") from error
        with open(path, encoding="utf-8") as handle:
            entries = json.load(handle)
    entries.append(entry)
    # mkstemp: an unpredictable name, created with O_EXCL and mode 0600, so a file or a
    # link planted beside the secrets file cannot receive them.
    descriptor, temporary = tempfile.mkstemp(
        dir=os.path.dirname(os.path.abspath(path)),
        prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with open(descriptor, "w", encoding="utf-8") as handle:
            json.dump(entries, handle, indent=2)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


class SecretChecker:
    """Checks offered secrets against the known hashes in constant time.

    Args:
        known: A list of ``(sha256 hex, identity)`` as from `load_secrets`.
    """

    def __init__(self, known):
        self.known = list(known)

    def identify(self, offered):
        """Returns ``(hash, identity)`` for a valid secret, else None.

        Every known entry is compared, with `hmac.compare_digest`, whatever matched.
        """
        if not isinstance(offered, str) or not offered:
            return None
        digest = secret_hash(offered).encode("ascii")
        found = None
        for known_hash, identity in self.known:
            if hmac.compare_digest(digest, known_hash.encode("ascii")) and found is None:
                found = (known_hash, identity)
        return found


def warn_if_readable_by_others(path):
    """Logs a warning when the secrets file may be read by other users of this machine
    (group or world permissions): they would hold every client's secret, or its hash."""
    try:
        mode = os.stat(path).st_mode & 0o777
    except OSError:
        return  # loading it says why
    if mode & 0o077:
        logger.warning("The secrets file %s may be read or changed by other users of this "
                       "machine (mode %o): chmod 600 it.", path, mode)


class SecretsFile:
    """The secrets of a file, read again when it changes: `SecretChecker.identify`'s.

    The file's modification time, size and inode are looked at, at most once a
    ``check_interval`` seconds, when a secret is checked; `reload` reads it at once (on
    SIGHUP). A file that fails to load keeps the previous secrets, and says why in the
    log: a revoked secret is refused from the next check after the file is saved.

    Args:
        path: The secrets file.
        check_interval: Seconds between two looks at the file.

    Raises:
        OSError, ValueError: If the file cannot be loaded at first.
    """

    def __init__(self, path, check_interval=1.0):
        import time

        self.path = path
        self.check_interval = check_interval
        warn_if_readable_by_others(path)
        self._clock = time.monotonic
        self._stamp = self._file_stamp()
        self._checker = SecretChecker(load_secrets(path))
        self._checked = self._clock()

    def _file_stamp(self):
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return (info.st_mtime_ns, info.st_size, info.st_ino)

    def reload(self):
        """Reads the file again; returns whether its secrets replaced the previous ones."""
        stamp = self._file_stamp()
        try:
            known = load_secrets(self.path)
        except (OSError, ValueError) as error:
            logger.error("Secrets file %s not reloaded, the previous secrets stay: %s",
                         self.path, error)
            self._stamp = stamp  # not again until it changes
            return False
        self._checker, self._stamp = SecretChecker(known), stamp
        logger.info("Secrets file %s reloaded: %d secrets", self.path, len(known))
        return True

    def identify(self, offered):
        """`SecretChecker.identify` with the file's current secrets."""
        now = self._clock()
        if now - self._checked >= self.check_interval:
            self._checked = now
            if self._file_stamp() != self._stamp:
                self.reload()
        return self._checker.identify(offered)
