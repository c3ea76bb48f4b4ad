"""A Punchcard job's process: limits its memory, checks its model and trainer again, trains.

``python -m distkeras.cli.punchcard_job <limits JSON> train ...``: the server starts
each job so (`processes.job_command`). Before Keras or Spark is imported it sets its
memory limit (RLIMIT_DATA, which Spark's JVM and Python workers it starts inherit); it
then scans the model archive and trainer configuration the server wrote, as the server's
check did (`config_scan`), and runs ``distkeras train`` with every class and function
Keras resolves checked where it lives (`keras_checks.resolution_checked`).
"""

import json
import resource
import sys


def limit_memory(memory_bytes):
    """Limits this process's (and its children's) data segment to ``memory_bytes``.

    Notes:
        RLIMIT_DATA counts the memory a process writes (heap, anonymous mappings), not the
        address space it reserves: RLIMIT_AS would break JAX's and the JVM's large
        reservations of memory they never touch.
    """
    if memory_bytes:
        hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
        if hard != resource.RLIM_INFINITY:
            memory_bytes = min(memory_bytes, hard)  # a lower limit of the server's stays
        resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _option(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


def check_job_files(argv):
    """Scans the model archive and the trainer configuration named in ``argv`` (the
    ``train`` command's arguments) as the server's check did.

    Raises:
        submissions.BadRequest: Saying what was refused.
    """
    # Late: the memory limit is set before Keras (and what imports it) loads.
    import keras
    from distkeras.punchcard.submissions import scan_configs

    with open(_option(argv, "--model"), "rb") as handle:
        model_bytes = handle.read()
    config_path = _option(argv, "--trainer-config")
    config = {}
    if config_path is not None:
        with open(config_path, encoding="utf-8") as handle:
            config = json.load(handle)
    scan_configs(model_bytes, config, frozenset(keras.saving.get_custom_objects()))


def main(argv=None):
    """The job: limits, checks, then ``distkeras train`` under the resolution check."""
    argv = sys.argv[1:] if argv is None else argv
    limits, command = json.loads(argv[0]), argv[1:]
    limit_memory(limits.get("memory_bytes"))
    # Only now: the limit holds for all that these load (Keras, Spark's JVM and workers).
    from distkeras.cli import main as cli_main
    from distkeras.cli import write_status
    from distkeras.punchcard.keras_checks import resolution_checked
    from distkeras.punchcard.submissions import BadRequest

    try:
        check_job_files(command[1:])
    except BadRequest as error:
        write_status(_option(command, "--status"), "failed", error=str(error))
        sys.stderr.write(f"distkeras train: error: {error}\n")
        return 2
    with resolution_checked():
        return cli_main(command)


if __name__ == "__main__":
    sys.exit(main())
