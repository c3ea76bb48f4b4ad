"""Punchcard's commands: ``distkeras punchcard`` (the server) and ``distkeras secret``.

``scripts/punchcard.py`` and ``scripts/generate_secret.py`` run the same functions.
"""

import argparse
import functools
import json
import logging
import signal
import sys

from distkeras.punchcard.secrets_file import append_entry, generate_secret, make_entry
from distkeras.punchcard.data_roots import CLUSTER_SCHEMES
from distkeras.punchcard.processes import default_job_memory_bytes

logger = logging.getLogger(__name__)


def exposure_warnings(host, allowed_data_roots, allow_any_data_path=True):
    """What a server started with these settings exposes that its administrator may not
    mean to: said once, at start-up."""
    warnings = []
    if not allowed_data_roots and not allow_any_data_path:
        warnings.append(
            "No --allowed-data-root: jobs may read paths of the cluster's file systems "
            f"({', '.join(s + '://' for s in CLUSTER_SCHEMES)}; hdfs:/// of the default name "
            "node only) and local paths are refused, in any spelling (file:, FILE:, local:, "
            "jar:file:). Give the folders that hold training data.")
    elif not allowed_data_roots:
        warnings.append(
            "No --allowed-data-root: a job may train on any path this server's user can "
            "read (its model then carries what it learned from that data back to the "
            "client). Give the folders that hold training data.")
    if host not in ("127.0.0.1", "localhost", "::1"):
        warnings.append(
            f"Listening on {host} over plain HTTP: secrets, models and histories cross the "
            "network unencrypted. Serve it behind a TLS-terminating proxy, or listen on "
            "127.0.0.1.")
    return warnings


# The model check's and the HTTP front's limits: (flag, type, default, help).
_LIMIT_FLAGS = (
    ("--check-memory-mb", int, 4096,
     "address space of the child process that checks a submitted model (RLIMIT_AS)"),
    ("--check-seconds", int, 300,
     "CPU time (RLIMIT_CPU) and wall-clock time of a model's check"),
    ("--max-concurrent-checks", int, 2,
     "model checks running at once (each a child process; one per identity at a time)"),
    ("--job-memory-mb", int, None,
     "memory (RLIMIT_DATA) each process of a job may write: its driver, Spark's JVM and "
     "Python workers; a model whose activations for one batch exceed it is refused at "
     "its check (default: half of this machine's memory)"),
    ("--connection-limit", int, 1000,
     "connections held at once; past it, a waiting connection is closed for a new one: a "
     "refused or withheld body first, then the one nearest its deadline"),
    ("--header-timeout", float, 10.0,
     "seconds a request's headers may take to arrive (a trickling client is dropped after "
     "it)"),
    ("--min-upload-kbps", int, 64, "slowest accepted upload of a submission, in KiB/s"),
    ("--idle-timeout", int, 30, "seconds an idle kept-alive connection is held"),
)


def serve(argv=None, prog="punchcard"):
    """``punchcard``: runs the job server (waitress, a production WSGI server)."""
    # Here, not above: every `distkeras` command lists this one, and only this one
    # needs the server (waitress, the model checker).
    from distkeras.punchcard.app import make_server
    from distkeras.punchcard.model_check import ModelChecker
    from distkeras.punchcard.service import Punchcard

    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Punchcard: accept distkeras training jobs over HTTP.")
    parser.add_argument("--secrets", default="secrets.json", help="the secrets file")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--work-dir", default="punchcard-jobs",
                        help="folder for job files and the SQLite job table")
    parser.add_argument("--master", default="local[*]",
                        help="Spark master for jobs: local[*], yarn (client mode), "
                             "spark://..., k8s://...")
    parser.add_argument("--max-running", type=int, default=1, help="jobs running at once")
    parser.add_argument("--max-job-minutes", type=float, default=24 * 60,
                        help="a running job is stopped (failed) after this long; 0: never")
    parser.add_argument("--max-epochs", type=int, default=1000,
                        help="submissions of more epochs (num_epoch) are refused")
    parser.add_argument("--max-request-mb", type=int, default=256,
                        help="largest accepted submission")
    parser.add_argument("--allowed-data-root", action="append", default=[],
                        help="only accept data_path under this prefix (repeatable); "
                             "without one, local paths are refused")
    parser.add_argument("--allow-any-data-path", action="store_true",
                        help="without --allowed-data-root, accept local paths too: a job "
                             "then reads any file this server's user can read, and its "
                             "model carries what it learned back to the client")
    parser.add_argument("--threads", type=int, default=16, help="HTTP worker threads")
    parser.add_argument("--audit-log", default=None,
                        help="the audit log (JSON lines; default: audit.jsonl in the work "
                             "folder); 'none' for none")
    for flag, kind, default, text in _LIMIT_FLAGS:
        parser.add_argument(flag, type=kind, default=default, help=text)
    args = parser.parse_args(argv)
    job_memory = (args.job_memory_mb << 20) if args.job_memory_mb else \
        default_job_memory_bytes()
    # force: `distkeras punchcard` runs after the CLI configured WARNING, which dropped
    # this server's INFO lines (jobs queued, started, reloads).
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                        force=True)
    audit_log = {None: "default", "none": None}.get(args.audit_log, args.audit_log)
    try:
        punchcard = Punchcard(args.secrets, args.work_dir, args.master, args.max_running,
                              args.allowed_data_root,
                              allow_any_data_path=args.allow_any_data_path,
                              max_job_seconds=args.max_job_minutes * 60 or None,
                              max_epochs=args.max_epochs, audit_log=audit_log,
                              job_memory_bytes=job_memory,
                              model_checker=ModelChecker(
                                  args.check_memory_mb << 20, args.check_seconds,
                                  args.check_seconds, args.max_concurrent_checks,
                                  activation_bytes=job_memory))
    except (OSError, ValueError) as error:
        sys.stderr.write(f"punchcard: error: {error}\n")
        return 1
    for warning in exposure_warnings(args.host, args.allowed_data_root,
                                      args.allow_any_data_path):
        logger.warning(warning)
    try:
        server = make_server(punchcard, args.host, args.port, args.threads,
                             args.max_request_mb << 20, connection_limit=args.connection_limit,
                             header_timeout=args.header_timeout,
                             min_upload_rate=args.min_upload_kbps << 10,
                             channel_timeout=args.idle_timeout)
    except OSError as error:  # the port taken (another server running?) or not ours
        punchcard.close()
        sys.stderr.write(f"punchcard: error: cannot listen on {args.host}:{args.port}: "
                         f"{error}\n")
        return 1
    punchcard.model_checker.prestart()  # the first submission's check, warm
    # SIGHUP reads the secrets file again (as a change to it does, within a second).
    signal.signal(signal.SIGHUP, lambda _signum, _frame: punchcard.checker.reload())
    logger.info("Punchcard listening on %s:%s, jobs on %s", args.host, args.port, args.master)
    try:
        server.run()
    except KeyboardInterrupt:
        logger.info("Punchcard stopped")
    finally:
        punchcard.close()
    return 0


def secret_command(argv=None, prog="generate_secret"):
    """``generate_secret``: prints a new secret as JSON; can add it to a secrets file."""
    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Generate a Punchcard secret (64 characters from a secure source).")
    parser.add_argument("--identity", required=True, help="who the secret belongs to")
    parser.add_argument("--append", metavar="SECRETS_FILE", default=None,
                        help="also add the entry to this secrets file")
    parser.add_argument("--hashed", action="store_true",
                        help="store only the secret's SHA-256 in the secrets file")
    args = parser.parse_args(argv)
    secret = generate_secret()
    if args.append:
        try:
            append_entry(args.append, make_entry(args.identity, secret, hashed=args.hashed))
        except (OSError, ValueError) as error:
            sys.stderr.write(f"generate_secret: error: {error}\n")
            return 2
    sys.stdout.write(json.dumps({"secret": secret, "identity": args.identity}) + "\n")
    return 0


# Named in their usage lines as the `distkeras` command runs them.
CLI_COMMANDS = {"punchcard": functools.partial(serve, prog="distkeras punchcard"),
                "secret": functools.partial(secret_command, prog="distkeras secret")}
