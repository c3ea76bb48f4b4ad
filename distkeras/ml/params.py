"""Spark ML Param helpers shared by the stages: constructors that only store their
arguments, ``set<Name>``/``get<Name>`` methods as Spark's own stages have, and the
TypeConverters that name what a value should have been."""

import math
import numbers

import numpy as np
from pyspark.ml.param import Param, Params

def set_given(instance, **values):
    """Sets the Params whose values are not None (constructors only store their arguments)."""
    given = {name: value for name, value in values.items() if value is not None}
    if given:
        instance._set(**given)


def setter(param_name):
    """A ``set<Name>`` method for the Param ``param_name``, as Spark's own stages have
    (``OneHotTransformer(10).setInputCol("digit")``); it returns the stage, for chaining."""
    def set_value(self, value):
        return self._set(**{param_name: value})

    set_value.__name__ = "set" + param_name[0].upper() + param_name[1:]
    set_value.__doc__ = f"Sets the value of :py:attr:`{param_name}`."
    return set_value


def getter(param_name):
    """A ``get<Name>`` method for the Param ``param_name``, as Spark's own stages have
    (``estimator.getNumEpoch()``): its value or default, or Spark's KeyError when neither."""
    def get_value(self):
        return self.getOrDefault(getattr(self, param_name))

    get_value.__name__ = "get" + param_name[0].upper() + param_name[1:]
    get_value.__doc__ = f"Gets the value of :py:attr:`{param_name}` or its default value."
    return get_value


def set_params(self, **values):
    """Sets the Params named (``setParams(inputCol="pixels", outputCol="features")``) and
    returns the stage, as the ``setParams`` of Spark's own stages does.

    Raises:
        ValueError: For a name that is no Param of the stage (a constructor's
            ``input_col``, say), listing those there are.
    """
    unknown = [name for name in values if not self.hasParam(name)]
    if unknown:
        raise ValueError(
            f"{type(self).__name__} has no Param {unknown[0]!r}; its Params are "
            f"{sorted(param.name for param in self.params)} (setParams takes the Params' "
            "names, as Spark's stages do: inputCol=..., not the constructor's input_col=...).")
    return self._set(**values)


def one_of(name, value, alias, alias_value):
    """The value given as ``name`` or as its other name ``alias`` (a ValueError for both)."""
    if value is not None and alias_value is not None:
        raise ValueError(f"`{name}` and `{alias}` are the same argument (dist-keras named "
                         f"it {alias}); give one. Received: {name}={value!r}, "
                         f"{alias}={alias_value!r}")
    return alias_value if value is None else value


def require(instance, param):
    """The value of a Param, or a ValueError saying that it must be set."""
    if not instance.isDefined(param):
        raise ValueError(
            f"{type(instance).__name__} needs `{param.name}`; it was not set "
            f"({param.doc})."
        )
    return instance.getOrDefault(param)


def to_number(value):
    """TypeConverter: a finite number, numpy's included (booleans are refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"Expected a number. Received: {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise TypeError(f"Expected a finite number. Received: {value!r}")
    return number


def to_int(value):
    """TypeConverter: a whole number, numpy's included (booleans are refused).

    Only a TypeError names the Param (Spark's ``_set`` adds its name to those alone), so
    infinities and NaN, which ``int()`` meets with an OverflowError or a ValueError, are
    refused before it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or \
            not math.isfinite(value) or float(value) != int(value):
        raise TypeError(f"Expected an integer. Received: {value!r}")
    return int(value)


def to_numbers(value):
    """TypeConverter: one number or a sequence of them (a list, tuple or numpy array) as a
    list of floats."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        return [to_number(value)]
    if isinstance(value, (list, tuple, np.ndarray)):
        return [to_number(item) for item in np.asarray(value, dtype=object).ravel()]
    raise TypeError(f"Expected a number or a list of numbers. Received: {value!r}")


def to_ints(value):
    """TypeConverter: a sequence of whole numbers (numpy's included) as a list of ints."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return [to_int(item) for item in value]
    raise TypeError(f"Expected a list of integers. Received: {value!r}")


def to_label(value):
    """TypeConverter: a string, an int or a float (what a label column may hold)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`label` must be a string or a number. Received: {value!r}")
    if isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"`label` must be a string or a number. Received: {value!r}")


OUTPUT_TYPES = ("array", "vector")


def to_output_type(value):
    """TypeConverter: ``"array"`` or ``"vector"`` (what a transformer's output holds)."""
    if value not in OUTPUT_TYPES:
        raise TypeError(f"`output_type` must be 'array' (array<float>, what the trainers read "
                        "directly) or 'vector' (Spark ML DenseVectors, as dist-keras wrote: "
                        f"`row[col].toArray()` works). Received: {value!r}")
    return value




class HasOutputType(Params):
    """The ``outputType`` Param: ``"array"`` (default) or ``"vector"``."""

    outputType = Param(Params._dummy(), "outputType", "'array' (array<float>) or 'vector' "
                       "(Spark ML DenseVector, as dist-keras wrote)",
                       typeConverter=to_output_type)

    def getOutputType(self):
        """Gets the value of :py:attr:`outputType` or its default value."""
        return self.getOrDefault(self.outputType)

    def setOutputType(self, value):
        """Sets the value of :py:attr:`outputType`."""
        return self._set(outputType=value)
