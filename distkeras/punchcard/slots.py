"""Each secret's slots on the server: one submission at a time, from its request's
headers to its answer, and `MAX_DOWNLOADS` results sent at once."""

import threading

from distkeras.punchcard.submissions import SubmissionInProgress

# Results (/api/result) one secret may be sent at once.
MAX_DOWNLOADS = 2


class SecretSlots:
    """The submission and download slots of every secret, taken from a request's headers
    (the HTTP front's ``admit``) before its body is read.

    Args:
        store: The `store.JobStore` (a secret that has a job takes no submission slot).
    """

    def __init__(self, store):
        self._store = store
        self._lock = threading.Lock()
        self._validating = {}  # secret -> the claim of its submission being sent or checked
        self._downloads = {}  # secret -> its results being sent

    def claim_submission(self, secret_hash):
        """Takes the secret's one submission slot, from a request's headers to its answer
        (the HTTP front's ``admit``), before its body is read or parsed.

        Returns:
            A function that gives the slot back (call it once), or None when the secret
            already has a job.

        Raises:
            BadRequest: The submission is malformed.
            SubmissionInProgress: Another submission with this secret holds the slot.
            model_check.ChecksBusy: No model check can start now (HTTP 503).
        """
        # A submission's body is parsed (twice its size in memory) and its model built
        # (a request thread for minutes): a secret that has a job is refused before that,
        # and one secret's submissions are taken one at a time, so no client holds more
        # than one body's memory and one of the server's threads this way.
        if self._store.by_secret(secret_hash) is not None:
            return None
        token = object()  # this claim's, so that a late release frees no later claim
        with self._lock:
            if secret_hash in self._validating:
                raise SubmissionInProgress(
                    "Another submission with this secret is still being sent, or still being "
                    "checked: wait for its answer (a secret has one job at a time).")
            self._validating[secret_hash] = token
        return lambda: self.release_submission(secret_hash, token)

    def release_submission(self, secret_hash, token=None):
        """Gives back the secret's submission slot: the claim ``token`` (None: whichever
        holds it, the caller's own once its answer is ready, before it is sent)."""
        with self._lock:
            if token is None or self._validating.get(secret_hash) is token:
                self._validating.pop(secret_hash, None)

    def claim_download(self, secret_hash):
        """Takes one of the secret's `MAX_DOWNLOADS` download slots (/api/result);
        returns a function that gives it back (call it once), or None if all are taken."""
        with self._lock:
            if self._downloads.get(secret_hash, 0) >= MAX_DOWNLOADS:
                return None
            self._downloads[secret_hash] = self._downloads.get(secret_hash, 0) + 1

        def release():
            with self._lock:
                left = self._downloads.pop(secret_hash) - 1
                if left:
                    self._downloads[secret_hash] = left
        return release
