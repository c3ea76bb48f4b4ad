"""The one owner of a server's lifecycle during a run: start, monitor, goodbyes, stop.

Every server a run starts on the driver (a parameter server, the epoch barrier of one
Spark job, the progress server of sequential workers) goes through `serving`: it binds
where the executors reach it, expects the run's tasks, cancels the Spark job when a worker
reports a failure no retry gets past, starts a monitor if the run has one, and at the end
waits for the workers' last records, stops both and collects what the workers reported.
"""

import contextlib

from distkeras.errors import TrainingError
from distkeras.training.spark_jobs import (bind_address, cancel_jobs, driver_address,
                                           raise_reported_failure)
from distkeras.transport.socket_transport import SocketTransport


class Served:
    """What `serving` yields: the running server, its address and, at the end, the
    records the workers reported.

    Attributes:
        server: The server.
        address: ``(host, port)`` where the executors reach it.
        monitor: The `TrainingMonitor` drawing the run, or None.
        history: The step records the workers reported (filled when the server stops).
    """

    def __init__(self, server, address, monitor):
        self.server = server
        self.address = address
        self.monitor = monitor
        self.history = []


@contextlib.contextmanager
def serving(server, run, spark, job_tag, num_tasks, make_monitor=None,
            cancel_on_error=False, collect_into_run=True):
    """Runs ``server`` for the Spark job ``job_tag`` of ``run``.

    Args:
        server: A server not yet started (any, for the escape hatch's own; the socket
            servers are bound, told the number of tasks and waited on for goodbyes).
        run: The `run.Run`.
        spark: The SparkSession.
        job_tag: The Spark job tag of the workers (cancelled on a reported failure).
        num_tasks: The tasks that will connect.
        make_monitor: ``make_monitor(server)`` -> a `TrainingMonitor` (not started), or
            None to run without one.
        cancel_on_error: Also cancel the job when a handler of the server raised (a
            parameter server's: it would raise again for every retry).
        collect_into_run: At the end, the server's history and metric states become the
            run's (a server that saw every step); otherwise they are added to
            ``Served.history`` and the run's metric states.

    Yields:
        A `Served`.

    Raises:
        TrainingError: Naming the partition whose worker reported its failure, when the
            job failed after one did.
    """
    # The built-in servers hold a `SocketTransport` (``server.transport``) and a
    # `HistorySink` (``server.sink``).
    sockets = isinstance(getattr(server, "transport", None), SocketTransport)
    if sockets:
        server.transport.host = bind_address(spark)
        server.transport.expect_workers(num_tasks)

        def cancel(*_):
            cancel_jobs(spark, job_tag)

        server.sink.on_worker_failure = cancel
        if cancel_on_error:
            server.transport.on_error = cancel
    server.start()
    monitor = make_monitor(server) if sockets and make_monitor is not None else None
    served = Served(server, (driver_address(spark), getattr(server, "port", None)), monitor)
    if monitor is not None:
        monitor.start()
    try:
        yield served
        if sockets:
            # Every task has ended; let the server read what the workers sent last (their
            # final history and goodbye) before it closes the connections.
            server.transport.wait_for_goodbyes(timeout=10.0)
    except TrainingError as error:
        raise_reported_failure(server, error)
        raise
    finally:
        if monitor is not None:
            monitor.stop()
        server.stop()
        # What was trained, even when it failed or was interrupted.
        served.history.extend(getattr(server, "history", []))
        states = list(server.sink.metric_states) if sockets else []
        if collect_into_run:
            run.history, run.metric_states = list(served.history), states
        else:
            run.metric_states.extend(states)
