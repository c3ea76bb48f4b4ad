"""The options of ``Trainer.train()`` that travel as JSON (the CLI, Punchcard jobs).

``{"shuffle": true, "validation": 0.1, "sample_weight_col": "w", "class_weight": {"1": 5}}``:
``validation`` is a fraction of the rows to hold out or a Parquet path; JSON object keys
are strings, so ``class_weight``'s keys are class indices written as strings. Everything is
checked here, by type and range, before it reaches `train()`: nothing in it is executed.
"""

import math
import numbers
import re

KEYS = ("shuffle", "validation", "sample_weight_col", "class_weight")
# Matched with fullmatch: a pattern ending in `$` would accept a trailing newline.
_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,127}")


def normalize(options, check_path=None):
    """Checks JSON train options; returns them with defaults and typed values.

    Args:
        options: A dict with some of `KEYS`, or None.
        check_path: A function that checks a validation Parquet path (and raises
            ValueError), or None to accept any path.

    Returns:
        A dict with every key of `KEYS`: ``shuffle`` a bool, ``validation`` None, a float
        in (0, 1) or a path, ``sample_weight_col`` None or a column name, ``class_weight``
        None or a dict from int to float.

    Raises:
        ValueError: Naming the option and what it must be.
    """
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise ValueError(f"train options must be a JSON object with keys {', '.join(KEYS)}.")
    unknown = sorted(set(options) - set(KEYS))
    if unknown:
        raise ValueError(f"Unknown train options: {', '.join(map(str, unknown))}. "
                         f"Known: {', '.join(KEYS)}.")
    shuffle = options.get("shuffle", False)
    if not isinstance(shuffle, bool):
        raise ValueError(f"'shuffle' must be true or false. Received: {shuffle!r}")
    return {"shuffle": shuffle,
            "validation": _validation(options.get("validation"), check_path),
            "sample_weight_col": _column(options.get("sample_weight_col")),
            "class_weight": _class_weight(options.get("class_weight"))}


def _validation(value, check_path):
    if value is None:
        return None
    if isinstance(value, str):
        return check_path(value) if check_path is not None else value
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < 1:
        raise ValueError("'validation' must be a fraction between 0 and 1 of the rows to hold "
                         f"out, or a Parquet path. Received: {value!r}")
    return float(value)


def _column(value):
    if value is None:
        return None
    if not isinstance(value, str) or not _COLUMN.fullmatch(value):
        raise ValueError("'sample_weight_col' must be a column name (letters, digits, '_', "
                         f"'.'). Received: {value!r}")
    return value


def _class_weight(value):
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        raise ValueError("'class_weight' must be a non-empty object from class index to "
                         f"weight, for example {{\"0\": 1, \"1\": 5}}. Received: {value!r}")
    weights = {}
    for key, weight in value.items():
        text = str(key)
        if not (text.isascii() and text.isdigit()) or len(text) > 9:
            raise ValueError(f"'class_weight' keys must be class indices. Received: {key!r}")
        # JSON as Python reads it also holds NaN and Infinity: refused, as train() does.
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or \
                not math.isfinite(weight) or weight < 0:
            raise ValueError(f"'class_weight' of class {text} must be a number >= 0. "
                             f"Received: {weight!r}")
        weights[int(text)] = float(weight)
    return weights


def train_arguments(options, spark):
    """The keyword arguments of `Trainer.train` for normalized ``options``.

    A validation path is read as Parquet with ``spark``.
    """
    validation = options["validation"]
    if isinstance(validation, str):
        validation = spark.read.parquet(validation)
    return {"shuffle": options["shuffle"], "validation_data": validation,
            "sample_weight_col": options["sample_weight_col"],
            "class_weight": options["class_weight"]}
