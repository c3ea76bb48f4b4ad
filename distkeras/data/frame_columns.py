"""A DataFrame's columns as the trainers and stages read them: quoted column
expressions, Spark ML vectors as arrays, the output columns a stage may add, and the
errors (with what to do instead) for columns of a type no model input takes."""

from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import functions as F
from pyspark.sql import types as T


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


def training_column(dataframe, name, feature=False):
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
