"""The ``distkeras`` command line: train, predict, and (with Punchcard) serve jobs.

Works as an installed command, as ``python -m distkeras.cli``, and under ``spark-submit``
(``spark-submit $(python -c 'import distkeras.cli as c; print(c.__file__)') train ...``).
Every failure ends with a one-line message on stderr and a non-zero exit status.

The commands live in `distkeras.cli.train_command` (with the ``train`` arguments in
`distkeras.cli.train_args`) and `distkeras.cli.predict_command`; what they share in
`distkeras.cli.common`. This module dispatches them and gives their public names.
"""

import logging
import sys

from distkeras.cli.common import CommandError, error_message, spark_errors
from distkeras.cli.predict_command import command_predict
from distkeras.cli.train_args import (COMMON_ARGUMENTS, build_trainer, check_arguments,
                                      trainer_options)
from distkeras.cli.train_command import command_train, write_status

__all__ = ["main", "COMMANDS", "CommandError", "COMMON_ARGUMENTS", "trainer_options",
           "check_arguments", "build_trainer", "write_status", "command_train",
           "command_predict"]

COMMANDS = {
    "train": command_train,
    "predict": command_predict,
}


def _extra_commands():
    commands = dict(COMMANDS)
    try:  # Punchcard's commands, where this install has Punchcard (an optional part)
        from distkeras.punchcard.commands import CLI_COMMANDS
    except ImportError:
        return commands
    commands.update(CLI_COMMANDS)
    return commands


def main(argv=None):
    """Entry point of the ``distkeras`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = _extra_commands()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        usage = ("usage: distkeras {" + ",".join(commands) + "} [options]\n"
                 "  `distkeras COMMAND --help` shows the command's options and defaults.\n")
        if argv and argv[0] not in ("-h", "--help"):
            sys.stderr.write(f"distkeras: error: unknown command {argv[0]!r}\n{usage}")
            return 2
        sys.stdout.write(usage)
        return 0 if argv else 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return commands[argv[0]](argv[1:])
    except CommandError as error:
        sys.stderr.write(f"distkeras {argv[0]}: error: {error}\n")
        return 1
    except (ValueError, TypeError, OSError, RuntimeError, *spark_errors()) as error:
        sys.stderr.write(f"distkeras {argv[0]}: error: {error_message(error)}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
