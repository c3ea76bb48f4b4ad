"""Punchcard's HTTP side: the Flask routes over a `service.Punchcard`, behind the front.

The routes: POST /api/submit, and GET /api/state, /api/result, /api/cancel, /api/destroy,
each of the job of the secret in the ``X-Punchcard-Secret`` header. Every request but a
successful look at a state is written to the audit log. Run in the server's process.
"""

import base64
import json

from distkeras.punchcard import slots
from distkeras.punchcard.config_scan import ConfigRefused, loads_bounded
from distkeras.punchcard.front import make_front
from distkeras.punchcard.model_check import ChecksBusy
from distkeras.punchcard.protocol import CANCEL, DESTROY, RESULT, SECRET_HEADER, STATE, SUBMIT
from distkeras.punchcard.refusals import BadRequest
from distkeras.punchcard.submissions import SubmissionInProgress

# The model file is read and base64-encoded this many bytes at a time (a multiple of 3:
# the pieces' encodings join into the whole's).
_MODEL_CHUNK_BYTES = 3 << 16


def busy_message(job):
    """The refusal of a submission with a secret that already has ``job`` (its row)."""
    known = f" ({job['name']!r}, {job['state']})" if job is not None else ""
    return (f"This secret already has a job{known}: wait for it with job.wait_completion(), "
            "or clear it with job.destroy() (after job.cancel() if it still runs), before "
            "submitting another.")


class _StreamedResults:
    """A job's results as the JSON object ``{"model": base64, "history", ...}``, the model
    read and encoded a chunk at a time from its open file (never whole in memory)."""

    def __init__(self, results, **extra):
        self.model = results["model"]
        rest = json.dumps({"history": results["history"],
                           "validation_history": results["validation_history"], **extra})
        self.head, self.tail = b'{"model": "', ('", ' + rest[1:]).encode("utf-8")
        size = self.model.seek(0, 2)
        self.model.seek(0)
        self.length = len(self.head) + 4 * ((size + 2) // 3) + len(self.tail)

    def __iter__(self):
        yield self.head
        while chunk := self.model.read(_MODEL_CHUNK_BYTES):
            yield base64.b64encode(chunk)
        yield self.tail

    def close(self):
        self.model.close()


def create_app(punchcard, max_request_bytes=256 << 20):
    """The Flask application serving ``punchcard`` (a `service.Punchcard`)."""
    from flask import Flask, Response, g, jsonify, request

    app = Flask("punchcard")
    app.config["MAX_CONTENT_LENGTH"] = max_request_bytes

    def error(status, message):
        response = jsonify({"error": message})
        response.status_code = status
        return response

    def caller():
        return punchcard.checker.identify(request.headers.get(SECRET_HEADER, ""))

    @app.after_request
    def audit(response):
        # Every request but a successful look at a job's state (clients poll it).
        if request.path == STATE and response.status_code < 400:
            return response
        who = caller()
        answer = response.get_json(silent=True) if response.status_code >= 400 else None
        punchcard.audit.record(
            who[1] if who else None, request.path.rsplit("/", 1)[-1] or request.path,
            "refused" if response.status_code >= 400 else "accepted",
            response.status_code, g.get("job_id"),
            answer.get("error") if isinstance(answer, dict) else None)
        return response

    @app.errorhandler(413)
    def too_large(_error):
        return error(413, f"The request is larger than {max_request_bytes} bytes.")

    @app.errorhandler(404)
    def not_found(_error):
        return error(404, f"No such endpoint: {request.path}. The endpoints are POST "
                          "/api/submit and GET /api/state, /api/result, /api/cancel, /api/destroy.")

    @app.errorhandler(500)
    def internal_error(_error):
        return error(500, "The server failed on this request; its log says why.")

    @app.errorhandler(405)
    def wrong_method(_error):
        return error(405, f"{request.method} is not allowed on {request.path}: submit with "
                          "POST, everything else with GET.")

    def streamed(results, **extra):
        answer = _StreamedResults(results, **extra)
        return Response(answer, mimetype="application/json",
                        headers={"Content-Length": str(answer.length)})

    @app.post(SUBMIT)
    def submit():
        # A busy secret's submission was refused from its headers (`make_server`'s admit),
        # before its body was read: one that comes here holds the secret's slot, given
        # back as its answer is ready (its client may submit again as soon as it reads it).
        who = caller()
        if who is None:
            return error(403, "Unknown secret.")
        try:
            return submit_as(who)
        finally:
            punchcard.slots.release_submission(who[0])

    def submit_as(who):
        if not request.is_json:
            # Flask reads no body of another type: it may be JSON, sent as a form.
            return error(400, "The request body must be JSON, sent with the header "
                              "Content-Type: application/json.")
        try:
            body = loads_bounded(request.get_data(cache=False))
        except ConfigRefused as refused:
            return error(400, str(refused))
        try:
            state = punchcard.submit(who[0], who[1], body)
        except BadRequest as bad:
            return error(400, str(bad))
        except SubmissionInProgress as in_progress:
            return error(403, str(in_progress))
        except ChecksBusy as busy_checks:
            response = error(503, str(busy_checks))
            response.headers["Retry-After"] = str(busy_checks.retry_after)
            return response
        if state is None:
            return error(403, busy_message(punchcard.job_of(who[0])))
        job = punchcard.job_of(who[0])
        g.job_id = job["id"] if job is not None else None
        return jsonify(state)

    def own_job():
        who = caller()
        if who is None:
            return None, error(403, "Unknown secret.")
        job = punchcard.job_of(who[0])
        if job is None:
            return None, error(404, "This secret has no job.")
        g.job_id = job["id"]
        return job, None

    @app.get(STATE)
    def state():
        job, failure = own_job()
        return failure or jsonify(punchcard.public_state(job))

    @app.get(CANCEL)
    def cancel():
        job, failure = own_job()
        if failure:
            return failure
        cancelled = punchcard.cancel(job)
        # Read again: another request may have cancelled, finished or destroyed the job
        # since ``job`` was read (its state there is the one cancel() found changed).
        current = punchcard.job_of(job["secret_hash"])
        if current is None:
            return error(404, "This secret has no job: another request destroyed it.")
        if not cancelled:
            return error(409, f"The job is {current['state']}; only a queued or running "
                              "job can be cancelled.")
        return jsonify(punchcard.public_state(current))

    @app.get(RESULT)
    def result():
        job, failure = own_job()
        if failure:
            return failure
        if job["state"] != "finished":
            return error(409, f"The job is {job['state']}: only a finished job has a "
                              "trained model.")
        results = punchcard.results(job)
        if results is None:
            return error(404, "This secret has no job: another request destroyed it.")
        return streamed(results, state="finished")

    @app.get(DESTROY)
    def destroy():
        # A finished job's model and histories come with the answer, unless the client
        # says it has them (``?results=no``): distkeras's client fetches them from
        # /api/result first, as they are deleted here before this answer is sent, and a
        # cut connection would lose them.
        job, failure = own_job()
        if failure:
            return failure
        if job["state"] in ("queued", "running"):
            return error(409, "The job is still running: wait for it or cancel it first.")
        results = {"model": None, "history": None, "validation_history": None}
        if job["state"] == "finished" and request.args.get("results") != "no":
            results = punchcard.results(job)  # its model file read after it is deleted
        client_error = punchcard.client_error(job)
        if results is None or not punchcard.destroy(job):
            if results is not None and results["model"] is not None:
                results["model"].close()
            return error(404, "This secret has no job: another request destroyed it.")
        if results["model"] is None:
            return jsonify({**results, "state": job["state"], "error": client_error})
        return streamed(results, state=job["state"], error=client_error)

    return app


def make_server(punchcard, host, port, threads=16, max_request_bytes=256 << 20,
                **limits):
    """The HTTP server of `create_app(punchcard)` (call its ``run()``).

    Args:
        punchcard: The `Punchcard`.
        host: Where to listen.
        port: The port to listen on.
        threads: Worker threads serving requests.
        max_request_bytes: The largest submission.
        **limits: `front.make_front`'s ``connection_limit``, ``header_timeout``,
            ``min_upload_rate``, ``channel_timeout``.
    """
    # The secret and the body's size are checked from the headers, before the body is
    # read: Flask's own limit only applies once the whole body has been buffered.
    def audit(who, path, status, message):
        punchcard.audit.record(who[1] if who else None, path.rsplit("/", 1)[-1] or path,
                               "refused", status, None, message)

    def admit(path, who):
        # A submission takes the secret's one slot before its body is read; a result is
        # sent to a secret `slots.MAX_DOWNLOADS` at a time (a destroy sends it once:
        # the job is gone after).
        if path == SUBMIT:
            try:
                release = punchcard.slots.claim_submission(who[0])
            except SubmissionInProgress as in_progress:
                return (403, str(in_progress)), None
            if release is None:
                return (403, busy_message(punchcard.store.by_secret(who[0]))), None
            return None, release
        if path == RESULT:
            release = punchcard.slots.claim_download(who[0])
            if release is None:
                return (429, f"This secret is already sent {slots.MAX_DOWNLOADS} results "
                             "at once: wait for them, then ask again."), None
            return None, release
        return None, None

    return make_front(create_app(punchcard, max_request_bytes), punchcard.checker.identify,
                      host, port, threads=threads, max_request_bytes=max_request_bytes,
                      secret_header=SECRET_HEADER, audit=audit, admit=admit, **limits)
