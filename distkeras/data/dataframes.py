"""Checks a training DataFrame against the model and lays it out for the workers."""

import contextlib
import logging

import numpy as np
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import SparseVector, VectorUDT
from pyspark import StorageLevel
from pyspark.sql import functions as F
from pyspark.sql import types as T

from distkeras.data import parquet_source
from distkeras.data.feed import arrow_name, integer_dtype, padding_hint
from distkeras.data.tensors import packed_size

# Its name from before distkeras.data: logging set-ups (and the tests) select it.
logger = logging.getLogger("distkeras.dataframes")


def column(name):
    """The top-level column called ``name``, whatever it holds: ``F.col("a.b")`` would
    read the field ``b`` of a struct ``a``, so the name is quoted."""
    return F.col("`" + name.replace("`", "``") + "`")


def vector_values(name, dtype="float32"):
    """The Spark ML vectors of column ``name`` as arrays of ``dtype``, a null row staying
    null (Spark's ``vector_to_array`` fails the whole job on one, with a JVM error that
    names neither the column nor the null)."""
    return F.when(column(name).isNotNull(), vector_to_array(column(name), dtype))


def as_column_list(value):
    """A column name or a list of names, as a list; none for None (``label_col=None``:
    no targets, as ``fit(x)``)."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _flat_size(shape):
    return int(np.prod(shape)) if shape else 1


def _is_numeric(data_type):
    return isinstance(data_type, T.NumericType) or isinstance(data_type, T.BooleanType)


def _array_depth_numeric(data_type):
    depth = 0
    while isinstance(data_type, T.ArrayType):
        data_type = data_type.elementType
        depth += 1
    return depth > 0 and _is_numeric(data_type)


def same_column(dataframe, a, b):
    """Whether Spark resolves the names ``a`` and ``b`` to one column of ``dataframe``:
    case-insensitively, unless ``spark.sql.caseSensitive`` is set."""
    if dataframe.sparkSession.conf.get("spark.sql.caseSensitive", "false").lower() == "true":
        return a == b
    return a.lower() == b.lower()


def check_output_column_free(dataframe, name, who="Column"):
    """Refuses a new column ``name`` that would replace one of ``dataframe``'s without a
    word (``withColumn``); Spark matches the names case-insensitively by default, so
    ``"Label"`` replaces ``label``.

    Raises:
        ValueError: Naming the column (``who`` begins the message).
    """
    existing = next((existing for existing in dataframe.columns
                     if same_column(dataframe, existing, name)), None)
    if existing is None:
        return
    as_named = "" if existing == name else (
        f" (as {existing!r}: Spark matches column names regardless of case)")
    raise ValueError(f"{who} {name!r} is already in the DataFrame{as_named}; pick another "
                     "output_col or drop that column first.")


def _to_training_column(dataframe, name, feature=False):
    """A column expression that yields numbers or arrays of numbers, or a clear error
    (for strings, one that says what to do with them as features or as labels)."""
    if name not in dataframe.columns:
        raise ValueError(
            f"Column {name!r} is not in the DataFrame. Available columns: "
            f"{dataframe.columns}. Pass the right name as features_col / label_col."
        )
    if dataframe.columns.count(name) > 1:
        raise ValueError(
            f"The DataFrame has {dataframe.columns.count(name)} columns named {name!r} (a "
            "join of two frames that both have it?): Spark cannot tell which to read. "
            "Rename or drop the others first, for example with withColumnRenamed before "
            "the join.")
    data_type = dataframe.schema[name].dataType
    if isinstance(data_type, VectorUDT):
        return vector_values(name).alias(name)
    if (_is_numeric(data_type) or _array_depth_numeric(data_type)
            or isinstance(data_type, T.BinaryType)):
        return column(name)
    hint = features_type_hint(name, data_type)
    if hint and not feature and not isinstance(data_type, T.StructType):
        hint = (
            " For labels such as class names, index them first: "
            "pyspark.ml.feature.StringIndexer gives class indices 0, 1, ... (with "
            "sparse_categorical_crossentropy), then distkeras.transformers.OneHotTransformer "
            "one-hot vectors.")
    raise TypeError(
        f"Column {name!r} has type {data_type.simpleString()}; expected a number, an array "
        "of numbers, a Spark ML vector or packed float32 tensors (binary, see "
        f"`distkeras.transformers.PackedTensorTransformer`).{hint}"
    )


# Strings cannot reach a model on the JAX backend (Keras's own fit refuses a string
# input there), so a StringLookup or TextVectorization layer must give way to ids made in
# Spark.
_STRING_FEATURES_HINT = (
    " distkeras feeds a model numbers only, not strings for a StringLookup or "
    "TextVectorization inside it (Keras's JAX backend, the default, refuses string "
    "inputs in its own fit too). Turn them into integer ids in Spark first: "
    "pyspark.ml.feature.StringIndexer for categories, or Tokenizer and CountVectorizer "
    "(or a StringLookup's own vocabulary, `lookup.get_vocabulary()`, joined as a table) "
    "for tokens; then feed the ids to an integer input (keras.Input((n,), dtype='int32')) "
    "and an Embedding, the lookup left out of the model.")


def _struct_hint(name, data_type):
    """For a struct column (fields a model input would take as one row of values), how
    to make them one array column; else ``""``."""
    if not isinstance(data_type, T.StructType):
        return ""
    fields = ", ".join(repr(f"{name}.{field}") for field in data_type.fieldNames()[:3])
    more = ", ..." if len(data_type.fieldNames()) > 3 else ""
    return (f" To feed a struct's fields as one row of values, put them in one array "
            f"column first: F.array({fields}{more}).alias({name!r}) (numeric fields), or "
            f"select them as columns (df.select('{name}.*')) and use "
            "pyspark.ml.feature.VectorAssembler.")


def _holds_strings(data_type):
    """Whether a Spark type is a string or an array (of arrays...) of strings."""
    while isinstance(data_type, T.ArrayType):
        data_type = data_type.elementType
    return isinstance(data_type, T.StringType)


def string_features_hint(data_type):
    """For a features column of strings (Spark type ``data_type``), what to do instead, to
    end an error message; else ``""``."""
    return _STRING_FEATURES_HINT if _holds_strings(data_type) else ""


def features_type_hint(name, data_type):
    """For a features column ``name`` of a type no model input takes (strings, a struct),
    what to do instead, to end an error message; else ``""``."""
    return string_features_hint(data_type) or _struct_hint(name, data_type)


def _sample_size(value):
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        return packed_size(value)
    if hasattr(value, "toArray"):
        return value.toArray().size
    return np.asarray(value, dtype=np.float64).size if isinstance(value, (list, tuple)) else 0


def _packed_hint(value, shape):
    """For a binary row of the wrong size, how distkeras reads it: raw image bytes (one
    byte per value) look like a quarter of the values."""
    if not isinstance(value, (bytes, bytearray)):
        return ""
    raw = (" They hold one byte per value: raw pixels (uint8) or an encoded image? Decode "
           "them into an array of numbers first.") if len(value) == _flat_size(shape) else ""
    return (f" A binary column is read as packed float32 values, 4 bytes each (as "
            f"PackedTensorTransformer writes them): its rows have {len(value)} bytes, the "
            f"model needs {4 * _flat_size(shape)}.{raw}")


def _model_shapes(tensors):
    return [tuple(int(dim) for dim in tensor.shape[1:]) for tensor in tensors]


def check_known_inputs(model):
    """Raises a clear error for a model whose inputs and outputs Keras does not know.

    A subclassed `keras.Model` has no ``inputs`` until it is wrapped in a functional model,
    and distkeras reads the shapes of its rows from them.
    """
    if getattr(model, "inputs", None) and getattr(model, "outputs", None):
        _check_fixed_shapes(model)
        return
    steps = _own_training_logic(model)
    if steps:
        # Wrapped, the outer functional model would train with Keras's own step.
        raise ValueError(
            f"distkeras needs a model with known inputs and outputs (a Sequential or "
            f"functional model); {type(model).__name__} has none, as a subclassed "
            f"keras.Model does not. Wrapping it in keras.Model(inputs, your_model(inputs)) "
            f"would train without its own {' and '.join(steps)}: build it from functional "
            f"layers instead, `outputs = keras.layers.Dense(...)(inputs); model = "
            f"{type(model).__name__}(inputs, outputs)` (the class keeps its "
            f"{' and '.join(steps)}), registered with "
            "@keras.saving.register_keras_serializable() so that the executors rebuild it.")
    raise ValueError(
        f"distkeras needs a model with known inputs and outputs (a Sequential or functional "
        f"model); {type(model).__name__} has none, as a subclassed keras.Model does not. Wrap "
        "it: `inputs = keras.Input(shape=(...)); model = keras.Model(inputs, "
        "your_model(inputs))`, and give your class a `get_config()` for its constructor "
        "arguments so that the executors can rebuild it.")


def _own_training_logic(model):
    """The methods of Keras's training loop that ``model``'s class defines itself
    (``train_step``, ``compute_loss``, ...), which a model wrapping it would not run."""
    import keras

    return [name for name in ("train_step", "compute_loss", "test_step")
            if getattr(type(model), name, None) is not getattr(keras.Model, name, None)]


def _check_fixed_shapes(model):
    """Raises a clear error for an input or output with a dimension Keras leaves open
    (``keras.Input((None,))``): distkeras reads the shape of each row from the model."""
    for kind, tensors in (("input", model.inputs), ("output", model.outputs)):
        for tensor in tensors:
            shape = tuple(tensor.shape[1:])
            if any(dim is None for dim in shape):
                raise ValueError(
                    f"The model's {kind} {getattr(tensor, 'name', '')!r} has shape {shape}, "
                    "with a dimension of unknown size (None); distkeras reads the shape of "
                    "each row from the model, so every dimension but the batch must be "
                    "fixed. Give keras.Input the length of your (padded) rows, for example "
                    "keras.Input((10,), dtype='int32') for sequences padded to 10 tokens.")


def check_input_count(model, features_cols):
    """Raises a clear error when ``features_cols`` does not name one column per model input.

    Tabular data often has its features in several numeric columns: a list of them is read
    as one column per input, so a one-input model is told how to put them in one column.
    """
    if len(features_cols) == len(model.inputs):
        return
    hint = ""
    if len(model.inputs) == 1:
        hint = (" To feed several numeric columns to one input, put them in one column "
                "first: pyspark.ml.feature.VectorAssembler(inputCols=[...], "
                "outputCol=\"features\") or F.array(*columns).alias(\"features\").")
    raise ValueError(
        f"The model has {len(model.inputs)} inputs but features_col names "
        f"{len(features_cols)} columns: {features_cols}; a list of columns feeds one "
        f"input each.{hint}")


def _conversion_hint(value, module):
    """How to turn what a user gave instead of a DataFrame into one, to end an error."""
    if module.startswith(("pandas", "numpy", "pyarrow")):
        return " Convert it with spark.createDataFrame(...)."
    if module.startswith("pyspark") and type(value).__name__ == "RDD":
        return (" Convert it with rdd.toDF([...column names]) or "
                "spark.createDataFrame(rdd, schema).")
    if isinstance(value, (tuple, list)):
        # fit's (x, y): the arrays have to become columns first.
        return (" train() takes one DataFrame with a features and a label column, not "
                "fit's (x, y): write the arrays with distkeras.datasets.save_numpy_parquet("
                "spark, x, y, path) and read them back with spark.read.parquet(path).")
    return ""


def check_spark_dataframe(dataframe, role="training data"):
    """Raises a clear error for anything but a classic (not Spark Connect) DataFrame.

    The trainers run their workers through the SparkContext (`mapInArrow` tasks that
    reach the driver's parameter server), which a Spark Connect client does not have.
    """
    from pyspark.sql import DataFrame

    module = type(dataframe).__module__ or ""
    if module.startswith("pyspark.sql.connect"):
        raise TypeError(
            f"The {role} is a Spark Connect DataFrame; distkeras needs a classic "
            "SparkSession (SparkSession.builder.master(...).getOrCreate(), or "
            "distkeras.session.local_spark_session()), whose executors can reach the "
            "driver's parameter server.")
    if not isinstance(dataframe, DataFrame):
        hint = _conversion_hint(dataframe, module)
        raise TypeError(f"The {role} must be a Spark DataFrame. Received: "
                        f"{type(dataframe).__module__}.{type(dataframe).__name__}.{hint}")
    _check_session_running(dataframe, role)


def _check_session_running(dataframe, role):
    """Raises a clear error for a DataFrame whose SparkSession was stopped.

    Such a DataFrame still answers ``columns`` and ``schema`` (cached on the Python side),
    but the first column expression built for it failed with a bare ``AssertionError``
    from pyspark (no active SparkContext), and nothing said which session was gone.
    """
    context = dataframe.sparkSession.sparkContext
    if getattr(context, "_jsc", None) is None:
        raise ValueError(
            f"The {role} belongs to a SparkSession that was stopped (spark.stop()); a "
            "DataFrame cannot be read once its session is gone. Create the session again "
            "(SparkSession.builder...getOrCreate(), or "
            "distkeras.session.local_spark_session()) and read or build the DataFrame in "
            "it, then call this again.")


def columns_by_name(value, model, what, parameter):
    """``value`` as given, or, for a dict of columns keyed by the model's input (output)
    names, as Keras's ``fit`` takes ``x`` (``y``), the list of its columns in the order of
    the model's inputs (outputs).

    Args:
        value: A column name, a list of names, or a dict ``{input or output name: column}``.
        model: The `keras.Model`.
        what: ``"inputs"`` or ``"outputs"``.
        parameter: The parameter that named the columns.

    Raises:
        ValueError: When the dict's keys are not exactly the model's names.
    """
    if not isinstance(value, dict):
        return value
    names = model_names(model, what)
    if sorted(map(str, value)) != sorted(names):
        missing = [name for name in names if name not in value]
        unknown = [key for key in value if key not in names]
        raise ValueError(
            f"{parameter} is a dict, so its keys must be the model's {what}' names, "
            f"{names}. Missing: {missing}; not the model's: {unknown}.")
    return [value[name] for name in names]


def model_names(model, what):
    """The names of a model's inputs or outputs (``what``), in the order of its tensors."""
    from distkeras.data.feed import input_names, output_names

    if what == "inputs":
        return input_names(model) or [tensor.name for tensor in model.inputs]
    return output_names(model)


def check_column_order(columns, names, what, parameter):
    """Refuses columns named exactly as the model's inputs (outputs) but listed in another
    order: they pair with ``model.inputs`` (``model.outputs``) by position, so each would
    silently feed another input (train another output) of the same shape.

    Args:
        columns: The columns given, in order.
        names: The model's input (output) names, in the order of its tensors.
        what: ``"inputs"`` or ``"outputs"``.
        parameter: The parameter that named the columns.

    Raises:
        ValueError: Naming the order to pass.
    """
    if len(columns) > 1 and sorted(columns) == sorted(names) and list(columns) != list(names):
        raise ValueError(
            f"{parameter}={list(columns)} names the model's {what} in another order than "
            f"the model's, {list(names)}: columns pair with the {what} by position (for a "
            f"model built on a dict, Keras orders them by name). Pass {parameter}="
            f"{list(names)}, or a dict keyed by the {what}' names.")


def validate(dataframe, model, features_col, label_col):
    """Checks columns, types and sizes against the model before any training starts.

    Args:
        dataframe: The training DataFrame.
        model: The `keras.Model` to train.
        features_col: Input column(s).
        label_col: Target column(s), or None for none (`fit(x)`).

    Returns:
        The label shapes the data carries (none without ``label_col``): the model's, or
        its shape without the last axis for class indices (``()`` for scalar labels or
        arrays of one; ``(steps,)`` for one class index per step of an output of shape
        ``(steps, classes)``, as Keras's sparse losses read them).

    Raises:
        ValueError: Naming the column and what the model expects.
        TypeError: For a column of a type that cannot be trained on.
    """
    check_spark_dataframe(dataframe)
    check_known_inputs(model)
    features_cols = as_column_list(features_col)
    label_cols = as_column_list(label_col)
    check_input_count(model, features_cols)
    if label_col is not None and len(label_cols) != len(model.outputs):
        raise ValueError(
            f"The model has {len(model.outputs)} outputs but label_col names "
            f"{len(label_cols)} columns: {label_cols}."
        )
    check_column_order(features_cols, [tensor.name for tensor in model.inputs], "inputs",
                       "features_col")
    check_column_order(label_cols, model_names(model, "outputs"), "outputs", "label_col")
    for name in features_cols:
        _to_training_column(dataframe, name, feature=True)
    for name in label_cols:
        _to_training_column(dataframe, name)
    rows = dataframe.select(*map(column, features_cols + label_cols)).limit(1).collect()
    if not rows:
        raise ValueError("The DataFrame is empty: there is nothing to train on.")
    row = rows[0]
    check_first_row(row, model, features_cols, label_cols)
    label_shapes = []
    for name, shape in zip(label_cols, _model_shapes(model.outputs)):
        size = _sample_size(row[name])
        if size == 0 and not isinstance(row[name], (list, tuple)):
            label_shapes.append(())  # scalar labels, e.g. for a sparse categorical loss
            continue
        # A class index per step, for a sparse loss; for an output of one axis, a class
        # index held in an array of one (labels shaped (rows, 1), which `fit` takes too).
        if shape and shape[-1] > 1 and size == _flat_size(shape[:-1]):
            label_shapes.append(shape[:-1])
            continue
        if size != _flat_size(shape):
            indices = f" ({_flat_size(shape[:-1])} class indices per row)" \
                if len(shape) > 1 else ""
            # pyspark.ml.feature.OneHotEncoder drops the last class unless told not to.
            dropped = (" pyspark.ml.feature.OneHotEncoder leaves out the last class unless "
                       "given dropLast=False.") \
                if hasattr(row[name], "toArray") and size == _flat_size(shape) - 1 else ""
            raise ValueError(
                f"Label column {name!r} holds {size} values per row but the model's output "
                f"has shape {shape} ({_flat_size(shape)} values). One-hot encode the labels "
                f"to the output size, or use class indices{indices} with a sparse loss."
                f"{dropped}"
            )
        label_shapes.append(shape)
    return label_shapes


def check_first_row(row, model, features_cols, label_cols=()):
    """Refuses, on the driver, a first row that every task would fail on: a null in one of
    the columns, or features whose number of values does not fit the model's input.

    Args:
        row: The DataFrame's first row (a `pyspark.sql.Row` holding the columns).
        model: The `keras.Model`.
        features_cols: Its input columns, in the model's order.
        label_cols: Its target columns (only checked for nulls here).

    Raises:
        ValueError: Naming the column and what the model expects.
    """
    for name in list(features_cols) + list(label_cols):
        if row[name] is None:
            raise ValueError(
                f"Column {name!r} holds null values (its first row is null); drop or fill "
                f"them first, for example `df.dropna(subset=[{name!r}])`.")
    for name, shape, tensor in zip(features_cols, _model_shapes(model.inputs), model.inputs):
        size = _sample_size(row[name])
        if size == 0 and not isinstance(row[name], (list, tuple)):
            size = 1  # a number per row: an input of one value (as ModelPredictor reads it)
        if size != _flat_size(shape):
            tokens = isinstance(row[name], (list, tuple)) and len(shape) == 1 \
                and integer_dtype(tensor) is not None
            raise ValueError(
                f"Column {name!r} holds {size} values per row but the model's input expects "
                f"shape {shape} ({_flat_size(shape)} values). "
                + (padding_hint(name, shape[0]) if tokens
                   else "Reshape the data or the model." + _packed_hint(row[name], shape)))


def sparse_vector_columns(dataframe, names, first_row=None):
    """The Spark ML vector columns among ``names`` whose first row is a sparse vector
    (``HashingTF``, ``CountVectorizer``, ``IDF``, ``OneHotEncoder``); reads that row only
    where there are vector columns.

    Such a column is sent to Python as its struct and densified there a minibatch at a
    time (`feed.column_rows`): ``vector_to_array`` would write every zero into Arrow on
    the JVM (1 MiB per row for ``HashingTF``'s default 2**18 features). A column of dense
    vectors keeps ``vector_to_array``. A column that mixes both is read right either way.
    """
    vectors = [name for name in names
               if isinstance(dataframe.schema[name].dataType, VectorUDT)]
    if not vectors or dataframe.isStreaming:  # a stream's rows cannot be read before it runs
        return set()
    # ``first_row``: that row, already read by the caller (holding ``names``).
    row = first_row if first_row is not None else \
        dataframe.select(*map(column, vectors)).first()
    if row is None:
        return set()
    return {name for name in vectors if isinstance(row[name], SparseVector)}


def training_frame(dataframe, features_col, label_col, sample_weight_col=None,
                   sparse=True):
    """Selects the training columns, each named as the workers read it
    (`feed.arrow_name`): Spark ML vectors as arrays, or with ``sparse`` and sparse
    vectors (`sparse_vector_columns`), as their struct."""
    # Each once: a column may feed two outputs, or be both input and target (an
    # autoencoder); the workers read columns by name.
    columns = list(dict.fromkeys(as_column_list(features_col) + as_column_list(label_col)))
    as_sent = sparse_vector_columns(dataframe, columns) if sparse else set()
    selected = [(column(name) if name in as_sent else _to_training_column(dataframe, name))
                .alias(arrow_name(name)) for name in columns]
    if sample_weight_col is not None and sample_weight_col not in columns:
        selected.append(column(sample_weight_col).cast("float").alias(
            arrow_name(sample_weight_col)))
    return dataframe.select(*selected)


def lay_out(dataframe, num_partitions, shuffle=False, seed=None):
    """Splits the data into ``num_partitions`` partitions, one per worker task.

    A DataFrame that already has ``num_partitions`` partitions is used as it is (so balance
    your partitions, or pass ``shuffle=True``); otherwise rows are spread round-robin.
    Later epochs are the workers' own (`epochs.Replay`), so this lays out one pass.

    Without ``shuffle``, a plain Parquet scan is laid out as a
    `parquet_source.ParquetSource`, whose workers read the files themselves: Spark's own
    partitions where it has ``num_partitions``, else consecutive runs of equal rows.

    Args:
        dataframe: The training columns.
        num_partitions: Number of worker tasks.
        shuffle: Whether to randomize the order of rows (and which worker gets which).
        seed: Seed for the shuffle. None: drawn from numpy's global generator, so
            ``keras.utils.set_random_seed(n)`` before training gives the same order at
            every run, as it does for ``fit(shuffle=True)``.

    Returns:
        A DataFrame with ``num_partitions`` partitions.
    """
    if not shuffle:
        source = parquet_source.direct_source(dataframe, num_partitions, _feed_batch_rows(
            dataframe.sparkSession))
        if source is not None:
            logger.info("Reading %d partitions of Parquet files in the workers (pyarrow); "
                        "%s=false turns this off.", source.num_partitions(),
                        parquet_source.SETTING)
            return source
        # Keep the DataFrame's own partitioning when it already fits: a shuffle of the
        # whole data set costs seconds before the first step.
        if dataframe.rdd.getNumPartitions() == num_partitions:
            return dataframe
        if num_partitions == 1:
            return dataframe.coalesce(1)
        return dataframe.repartition(num_partitions)
    if seed is None:
        seed = int(np.random.randint(0, 2 ** 31 - 1))
    return (dataframe.withColumn("__distkeras_order", F.rand(seed))
            .repartition(num_partitions)
            .sortWithinPartitions("__distkeras_order")
            .drop("__distkeras_order"))


def _feed_batch_rows(spark):
    """Rows per record batch the workers get: the session's Arrow setting, else the
    trainers' (`training_jobs.FEED_RECORDS_PER_BATCH`)."""
    from distkeras.training_jobs import ARROW_BATCH_KEY, FEED_RECORDS_PER_BATCH

    return int(spark.conf.get(ARROW_BATCH_KEY, None) or FEED_RECORDS_PER_BATCH)


def barrier_compatible(dataframe, num_partitions):
    """Whether Spark can run ``dataframe``'s partitions as a barrier stage of
    ``num_partitions`` tasks: every RDD the stage computes (back to its shuffles) must have
    that many partitions, which a ``coalesce()`` or a ``union()`` breaks (Spark's check,
    SPARK-24820, done here on the driver: Spark 4 stops the SparkContext when it fails).
    False where the RDD chain cannot be read."""
    try:
        stack, seen = [dataframe.rdd._jrdd.rdd()], set()
        while stack:
            rdd = stack.pop()
            if rdd.id() in seen:
                continue
            seen.add(rdd.id())
            if rdd.getNumPartitions() != num_partitions:
                return False
            dependencies = rdd.dependencies()
            for index in range(dependencies.size()):
                dependency = dependencies.apply(index)
                if dependency.getClass().getName() != "org.apache.spark.ShuffleDependency":
                    stack.append(dependency.rdd())
        return True
    except Exception:  # py4j internals another Spark may lack: not a barrier stage then
        return False


@contextlib.contextmanager
def kept_for_epochs(frame, num_epoch):
    """Keeps ``frame`` on the executors' disks (``DISK_ONLY``) while a training reads it
    once per epoch in a Spark job per epoch, and unpersists it after.

    The one-job paths read each partition once and replay it from local disk
    (`distkeras.epochs`); a job per epoch computes the frame again, and a nondeterministic
    upstream (a shuffle's row order, ``rand()``, a UDF) would give each epoch other rows,
    depending only on how many task slots the cluster has. A frame the user cached is
    read as it is, and so is one whose rows all come from a cache through steps that give
    the same rows each time (the training columns selected from the user's cached frame):
    a copy on disk would add nothing. So is a plain Parquet scan (`parquet_source`), whose
    files give the same rows each time.

    Yields:
        ``frame``.
    """
    if num_epoch < 2 or frame.is_cached or _read_from_cache(frame) or \
            parquet_source.plain_scan(frame):
        yield frame
        return
    logger.info(
        "Persisting the training rows (DISK_ONLY) so that each epoch's job reads the same.")
    frame.persist(StorageLevel.DISK_ONLY)
    try:
        yield frame
    finally:
        frame.unpersist()


def _read_from_cache(frame):
    """Whether every row of ``frame`` comes from a cache (``df.cache()``, ``persist()``,
    ``spark.catalog.cacheTable``) through deterministic steps without Python UDFs.

    ``frame.is_cached`` says only whether that Python object was cached: the training
    frame is a new ``select`` of the user's DataFrame, so it never was.
    """
    try:
        return _cached_leaves_only(frame._jdf.queryExecution().withCachedData())
    except Exception:  # py4j internals another Spark may lack: keep the frame on disk then
        return False


def _cached_leaves_only(plan):
    """Whether a logical plan reads only cached relations, deterministically."""
    if plan.getClass().getSimpleName() == "InMemoryRelation":
        return True
    children = plan.children()
    if children.size() == 0 or not plan.deterministic():
        return False
    expressions = plan.expressions()
    # A Python UDF counts as nondeterministic: few users mark one that draws random
    # numbers or reads the clock with asNondeterministic().
    if any(_holds_python_udf(expressions.apply(i)) for i in range(expressions.size())):
        return False
    return all(_cached_leaves_only(children.apply(i)) for i in range(children.size()))


def _holds_python_udf(expression):
    if expression.getClass().getSimpleName() == "PythonUDF":
        return True
    children = expression.children()
    return any(_holds_python_udf(children.apply(i)) for i in range(children.size()))
