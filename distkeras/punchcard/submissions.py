"""The checks a Punchcard submission passes before it is queued: the security boundary.

Run in the server's request thread. Nothing a client sends is executed: the fields are
checked as data (names, counts, paths under the allowed data roots), the model archive's
size and configuration as JSON (`refusals`, `config_scan`); what Keras builds of it is
checked by `keras_checks.check_keras_parts`, in a `model_check` child process.
"""

import re

from distkeras.errors import DistkerasError
from distkeras.punchcard import data_roots
from distkeras.punchcard.keras_checks import check_keras_parts
from distkeras.punchcard.refusals import (BadRequest, decode_model, registered_trainer_class,
                                          scan_configs)
from distkeras.training import options as train_options

# Matched with fullmatch: a pattern ending in `$` would accept a trailing newline.
JOB_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_WORKERS = 1024
MAX_PARALLELISM_FACTOR = 64
# Lists and objects in a submission: a trainer's settings nest a few levels (a loss per
# output, a learning-rate schedule in an optimizer's config). Deeper, the checks that
# recurse into them (copies, Keras's getters) would run out of stack.
MAX_JSON_DEPTH = 100
# Hadoop glob syntax ({a,b}, [ab], *, ?, and \ escapes) and Spark's comma-separated path
# lists: Spark expands them when it reads, so a path made of them could name files outside
# the allowed roots whatever its literal prefix is.
_GLOB_CHARACTERS = set("{}[]*?\\,")


class SubmissionInProgress(DistkerasError, RuntimeError):
    """Another submission with the same secret is still being checked (HTTP 403)."""


def check_data_path(path, allowed_roots, name="data_path", any_local_path=True):
    """``path`` if a job may read it, else BadRequest.

    Args:
        path: The path the client gave.
        allowed_roots: The allowed data roots (empty: a path of a cluster file system,
            `data_roots.check_cluster_path`).
        name: The field, for the message.
        any_local_path: Whether, without roots, any path is accepted (local ones too:
            the server would read any file its user can).
    """
    if not isinstance(path, str) or not path or len(path) > 4096:
        raise BadRequest(f"'{name}' must be a non-empty string.")
    if any(ord(char) < 32 for char in path):
        raise BadRequest(f"'{name}' must not contain control characters.")
    if path.startswith("-"):
        raise BadRequest(f"'{name}' must not start with '-'. Received: {path!r}")
    if ".." in re.split(r"[/\\]", path):
        raise BadRequest(f"'{name}' must not contain '..' segments.")
    if not allowed_roots and not any_local_path:
        try:
            data_roots.check_cluster_path(path)
        except data_roots.OutsideRoots as error:
            raise BadRequest(f"'{name}': {error}") from error
    if (allowed_roots or not any_local_path) and _GLOB_CHARACTERS & set(path):
        raise BadRequest(
            f"'{name}' must not contain any of {' '.join(sorted(_GLOB_CHARACTERS))}: this "
            "server checks the path it is given, and Spark would expand glob patterns and "
            "comma-separated lists into other paths. Give the path of one Parquet file or "
            f"folder. Received: {path!r}")
    if allowed_roots and not any(path == root or path.startswith(root.rstrip("/") + "/")
                                 for root in allowed_roots):
        raise BadRequest(f"'{name}' must be under one of: {', '.join(allowed_roots)}.")
    if allowed_roots:
        try:
            data_roots.check_resolves_under(path, allowed_roots)
        except data_roots.OutsideRoots as error:
            raise BadRequest(f"'{name}': {error}") from error
    return path


def _nesting_depth(value):
    """How deep lists and objects nest in ``value`` (a loop: recursing is what fails)."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            pending.extend((child, depth + 1)
                           for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _check_count(body, name):
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
        raise BadRequest(f"'{name}' must be an integer in 1..{MAX_WORKERS}. "
                         f"Received: {value!r}")
    return value


def validate_submission(body, allowed_roots=(), check=None, any_local_path=True):
    """Checks a submission; returns ``(fields, trainer class name, config, model bytes)``.

    The fields are checked here; the model and the trainer by ``check``
    (`keras_checks.check_keras_parts`: the model is loaded with ``safe_mode=True`` and
    the trainer built from its config), so a bad archive or configuration is refused now
    rather than failing later in the job.

    Args:
        body: The parsed JSON submission.
        allowed_roots: The allowed data roots (empty: any path).
        check: A function of ``(model base64, trainer class name, config, workers)``
            returning the config to run, or raising BadRequest: a `model_check.ModelChecker`
            's in a server (a child process), `keras_checks.check_keras_parts` (in this
            process) if None.
        any_local_path: Without roots, whether local paths are accepted.

    Raises:
        BadRequest: Saying what was wrong.
    """
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    if _nesting_depth(body) > MAX_JSON_DEPTH:
        raise BadRequest("The request body is JSON nested too deeply.")
    name = body.get("job_name")
    if not isinstance(name, str) or not JOB_NAME_PATTERN.fullmatch(name):
        raise BadRequest("'job_name' must be 1-64 letters, digits, '_', '.' or '-', "
                         "starting with a letter or digit.")
    fields = {"name": name, "data_path": check_data_path(body.get("data_path"), allowed_roots,
                                                         any_local_path=any_local_path),
              "num_executors": _check_count(body, "num_executors"),
              "num_processes": _check_count(body, "num_processes")}
    trainer = body.get("trainer")
    if not isinstance(trainer, dict) or not isinstance(trainer.get("class_name"), str) or \
            not isinstance(trainer.get("config"), dict):
        raise BadRequest("'trainer' must be {\"class_name\": ..., \"config\": {...}}.")
    registered_trainer_class(trainer["class_name"])
    model_bytes = decode_model(body.get("model"))
    scan_configs(model_bytes, trainer["config"])
    try:
        fields["train_options"] = train_options.normalize(
            body.get("train_options"),
            lambda path: check_data_path(path, allowed_roots, "train_options.validation",
                                         any_local_path))
    except ValueError as error:
        raise BadRequest(str(error)) from error
    config = dict(trainer["config"])
    if "master_port" in config:
        config["master_port"] = 0  # the server's OS picks the port, never the client
    workers = fields["num_executors"] * fields["num_processes"]
    if workers > MAX_WORKERS:
        raise BadRequest(f"'num_executors' x 'num_processes' is the number of workers, at "
                         f"most {MAX_WORKERS}. Received: {fields['num_executors']} x "
                         f"{fields['num_processes']} = {workers}")
    check_settings(config)
    if check is None:
        check = check_keras_parts
    config = check(body["model"], trainer["class_name"], config, workers)
    return fields, trainer["class_name"], config, model_bytes


# The trainer's numeric settings this server runs: (lowest, highest). The trainers check
# the lowest (and types) themselves; a value past the highest would hold the server's
# memory or a job slot for good (batch_size=10**30, worker_timeout=1e300).
SETTING_RANGES = {"batch_size": (1, 1_000_000), "num_epoch": (1, 1_000_000),
                  "communication_window": (1, 1_000_000),
                  "parallelism_factor": (1, MAX_PARALLELISM_FACTOR),
                  "num_workers": (1, MAX_WORKERS), "num_ensembles": (1, MAX_WORKERS),
                  "seed": (0, 2**32 - 1), "master_port": (0, 65535),
                  "worker_timeout": (0, 7 * 24 * 3600)}
# Any other number among the settings (rates, momenta, loss weights), by magnitude.
MAX_OTHER_SETTING = 1e6
# Columns a setting may name (one per model input or output).
MAX_COLUMNS = 256
MAX_COLUMN_NAME = 128


def check_settings(config):
    """Refuses a trainer setting out of this server's range, naming it and the range.

    Args:
        config: The trainer's JSON config.

    Raises:
        BadRequest: A number past its `SETTING_RANGES` bound, past `MAX_OTHER_SETTING`
            in magnitude or not finite; or a column setting of more than `MAX_COLUMNS`
            names, or a name longer than `MAX_COLUMN_NAME`.
    """
    for name, value in config.items():
        if name in ("features_col", "label_col"):
            _check_columns(name, value)
            continue
        low, high = SETTING_RANGES.get(name, (-MAX_OTHER_SETTING, MAX_OTHER_SETTING))
        values = value if name == "loss_weights" and isinstance(value, list) else \
            list(value.values()) if name == "loss_weights" and isinstance(value, dict) \
            else [value]
        for number in values:
            if not isinstance(number, (int, float)) or isinstance(number, bool) or \
                    number <= high and (name in SETTING_RANGES or number >= low):
                continue
            bound = f"at least {_figure(low)}" if number < low else \
                f"at most {_figure(high)}" if number > high else "a finite number"
            raise BadRequest(f"'{name}' must be {bound} on this server (its range is "
                             f"{_figure(low)}..{_figure(high)}). Received: {number!r}")


def _figure(number):
    return f"{int(number):,}" if float(number).is_integer() else f"{number:g}"


def _check_columns(name, value):
    names = list(value.values()) if isinstance(value, dict) else \
        value if isinstance(value, list) else [value]
    if len(names) > MAX_COLUMNS:
        raise BadRequest(f"'{name}' names {len(names)} columns, more than this server "
                         f"takes (at most {MAX_COLUMNS}, one per model input or output).")
    for column in names:
        if isinstance(column, str) and len(column) > MAX_COLUMN_NAME:
            raise BadRequest(f"'{name}' names a column of {len(column)} characters, more "
                             f"than this server takes (at most {MAX_COLUMN_NAME}).")


def check_epochs(body, max_epochs):
    """Refuses more epochs than the operator allows (``max_epochs``; None: any), before
    the model is checked."""
    trainer = body.get("trainer") if isinstance(body, dict) else None
    config = trainer.get("config") if isinstance(trainer, dict) else None
    epochs = config.get("num_epoch", 1) if isinstance(config, dict) else 1
    if max_epochs is not None and isinstance(epochs, (int, float)) and \
            not epochs <= max_epochs:  # NaN too
        raise BadRequest(f"'num_epoch' must be at most {max_epochs} on this server "
                         f"(punchcard --max-epochs). Received: {epochs!r}")
