"""Checks a client's Keras configuration as plain JSON, before Keras reads any of it.

Keras's ``safe_mode`` refuses a `Lambda` layer's lambda, but not a reference to one of
Keras's own exported functions (``{"class_name": "function", "module":
"keras.distribution", "config": "set_distribution"}``), which a layer then calls with
arguments of the client's choosing. So Punchcard walks the configuration first: class
and function names are single Python names (Keras looks ``module + "." + class_name`` up,
so ``"layers.Lambda"`` after ``"keras"`` reached any exported symbol), functions only from
an allow-list (activations, losses, metrics, `keras.ops` math, or functions registered on
the server), classes only from Keras's modelling modules, no `Lambda` or other
code-holding layer, no operation that calls a function, a functional graph's nodes called
on its tensors only, and metric state (AUC's ``num_thresholds``, MeanIoU's
``num_classes``) counted against a limit. Nothing here imports Keras: what Keras resolves
the names to is checked again where it lives (`keras_checks.resolution_checked`).
"""

import io
import json
import re
import sys
import zipfile

from distkeras.errors import DistkerasError

# What a config.json may inflate to, and how many JSON lists and objects a body or a
# config may hold: json.loads builds a Python object of ~100 bytes for each ({} or []).
MAX_CONFIG_BYTES = 16 << 20
MAX_JSON_CONTAINERS = 200_000
MAX_JSON_SEPARATORS = 2_000_000
# Metric state a config declares: AUC and its kin keep num_thresholds accumulators per
# label, MeanIoU and its kin a num_classes x num_classes matrix.
MAX_THRESHOLDS = 10_000
MAX_CLASSES = 4096
MAX_THRESHOLD_STATE = 1_000_000  # num_thresholds x num_labels

# Layers that hold or call code: refused whatever their arguments (names compared in
# lower case, as a registered name's tail too).
_CODE_LAYERS = frozenset({"lambda", "torchmodulewrapper", "tfsmlayer", "jaxlayer",
                          "flaxlayer", "__lambda__"})
# A class or function name, and a module's: Python names, dotted for a module.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}(\.[A-Za-z_][A-Za-z0-9_]{0,127}){0,15}")
# Values Keras rebuilds as data (a graph's tensors, arrays, slices), never as a class.
_DATA_OBJECTS = frozenset({"__keras_tensor__", "__tensor__", "__numpy__", "__bytes__",
                           "__ellipsis__", "__slice__"})
# TensorFlow type specs: rebuilt by a class the configuration names, outside Keras.
_REFUSED_SPECIAL = frozenset({"__typespec__"})
_KERAS_PACKAGES = frozenset({"keras", "keras_hub", "keras_cv", "keras_nlp", "tf_keras"})
# What Keras's configurations name with the module "keras" (keras.Sequential, ...).
_TOP_LEVEL_CLASSES = frozenset({"Sequential", "Model", "Functional", "DTypePolicy",
                                "FloatDTypePolicy", "QuantizedDTypePolicy",
                                "QuantizedFloat8DTypePolicy", "DTypePolicyMap"})
# keras.ops operations that call a function they are given (loops, branches, maps).
CALLING_OPS = frozenset({"Map", "Scan", "AssociativeScan", "Switch", "WhileLoop",
                          "ForiLoop", "Cond", "VectorizedMap", "CustomGradient", "Function"})
# Keras's modules whose classes a model's configuration may name (after "keras." and an
# optional "src."): layers, models and what they are made of.
_CLASS_MODULES = frozenset({"layers", "models", "optimizers", "losses", "metrics",
                            "initializers", "regularizers", "constraints", "activations",
                            "dtype_policies", "quantizers", "random"})
_NOT_MODELLING = frozenset({"get", "serialize", "deserialize"})
# Settings a lookup layer takes as values or as the path of a file to read (StringLookup,
# IntegerLookup, TextVectorization): a path would put a server's file in the model.
_FILE_SETTINGS = ("vocabulary", "idf_weights")
# keras.ops functions a configuration may name: element-wise and reduction math.
OPS_MATH = frozenset({
    "abs", "absolute", "add", "subtract", "multiply", "divide", "negative", "square",
    "sqrt", "exp", "expm1", "log", "log1p", "log2", "log10", "logsumexp", "maximum",
    "minimum", "mean", "sum", "max", "min", "prod", "clip", "sign", "round", "floor",
    "ceil", "tanh", "sinh", "cosh", "sin", "cos", "tan", "arctan", "sigmoid", "softmax",
    "log_softmax", "relu", "relu6", "elu", "selu", "gelu", "silu", "softplus", "softsign",
    "leaky_relu", "hard_sigmoid", "hard_silu", "erf", "power", "reciprocal", "matmul"})
_FUNCTION_MODULES = {"keras.activations": None, "keras.losses": None,
                     "keras.metrics": None, "builtins": None, "keras.ops": OPS_MATH}


class ConfigRefused(DistkerasError, ValueError):
    """A configuration this server does not build (its message says what and why)."""


def read_config(data, max_bytes=MAX_CONFIG_BYTES):
    """The parsed ``config.json`` of a `.keras` archive, its size checked before it is
    inflated.

    Args:
        data: The archive's bytes.
        max_bytes: The most bytes config.json may inflate to.

    Raises:
        ConfigRefused: Not a zip with a config.json, a config.json larger than
            ``max_bytes`` (by its zip header, and as read), or JSON too large to parse.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            info = archive.getinfo("config.json")
            if info.file_size > max_bytes:
                raise ConfigRefused(
                    f"its config.json unpacks to {info.file_size} bytes, more than this "
                    f"server reads ({max_bytes}).")
            with archive.open(info) as handle:
                text = handle.read(max_bytes + 1)
    except (KeyError, zipfile.BadZipFile, ValueError, OSError) as error:
        if isinstance(error, ConfigRefused):
            raise
        raise ConfigRefused(f"it has no readable config.json ({error}).") from error
    if len(text) > max_bytes:
        raise ConfigRefused(f"its config.json unpacks to more than {max_bytes} bytes, more "
                            "than this server reads.")
    return loads_bounded(text, "its config.json")


def loads_bounded(text, what="The request body"):
    """``json.loads(text)``, refused unparsed when it would build too many objects.

    Raises:
        ConfigRefused: More than `MAX_JSON_CONTAINERS` lists and objects, or
            `MAX_JSON_SEPARATORS` commas, or not JSON.
    """
    raw = text if isinstance(text, bytes) else text.encode("utf-8")
    containers = raw.count(b"{") + raw.count(b"[")
    if containers > MAX_JSON_CONTAINERS or raw.count(b",") > MAX_JSON_SEPARATORS:
        raise ConfigRefused(
            f"{what} holds more than {MAX_JSON_CONTAINERS} JSON lists and objects or "
            f"{MAX_JSON_SEPARATORS} items, more than this server parses.")
    try:
        return json.loads(raw)
    except RecursionError as error:
        raise ConfigRefused(f"{what} is JSON nested too deeply.") from error
    except ValueError as error:  # UnicodeDecodeError is one
        raise ConfigRefused(f"{what} is not valid JSON ({str(error)[:200]}).") from error


def scan(config, registered=None, where="the model", archive=False):
    """Refuses code references and oversized metric state in a Keras configuration.

    Args:
        config: Parsed JSON (a model's config.json, a trainer's loss or metrics).
        registered: Names of objects registered on this server (their packages are
            installed by its administrator, and may be named); None where they are not
            known (Keras not imported): references outside Keras's own modules pass, to
            be scanned again with the registry.
        where: What ``config`` is, for the message.
        archive: Whether ``config`` is a model archive's config.json: then every object
            names its module (Keras's older loader, taken without one, builds any
            name of ``keras.layers`` with the client's arguments), and the nodes of a
            functional graph are checked (`_check_node`).

    Raises:
        ConfigRefused: Naming the object and why it is refused.
    """
    pending = [config]
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            pending.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        _check_object(item, registered, where, archive)
        _check_state(item, where)
        if archive and isinstance(item.get("inbound_nodes"), list):
            for node in item["inbound_nodes"]:
                _check_node(node, item.get("name"), where)
        pending.extend(item.values())


def _check_object(item, registered, where, archive=False):
    class_name, module = item.get("class_name"), item.get("module")
    if class_name is None and module is None:
        return
    if not isinstance(class_name, str) or not _IDENTIFIER.fullmatch(class_name):
        # Keras looks a name up as module + "." + class_name: a dotted name reaches any
        # symbol Keras exports ("layers.Lambda", "config.set_epsilon").
        raise ConfigRefused(
            f"{where} names the class {_short(class_name)!r}: a class name is one Python "
            "name, without dots (the module goes in 'module').")
    if module is not None and (not isinstance(module, str) or not _MODULE.fullmatch(module)):
        raise ConfigRefused(f"{where} names the module {_short(module)!r}, which is no "
                            "Python module name.")
    registered_name = item.get("registered_name")
    for name in (class_name, registered_name):
        if isinstance(name, str) and name.rpartition(">")[2].lower() in _CODE_LAYERS:
            raise ConfigRefused(
                f"{where} holds a {_short(name)} layer, whose code this server never runs. "
                "Replace it with built-in layers, or with a custom layer registered "
                "(@keras.saving.register_keras_serializable()) in a package installed on "
                "the server.")
    if class_name in _DATA_OBJECTS:
        return
    if class_name in _REFUSED_SPECIAL:
        raise ConfigRefused(f"{where} holds a {class_name} object, which this server does "
                            "not build.")
    if class_name == "function":
        _check_function(item, module, registered, where)
        return
    if _registered(registered_name, registered):
        return
    if module is None:
        if archive and "config" in item:
            raise ConfigRefused(
                f"{where} names the class {_short(class_name)} without its module: save the "
                "model with Keras 3 (keras.saving.save_model), which writes it.")
        return
    package, _, rest = module.partition(".")
    if package.lower() in _KERAS_PACKAGES and package != "keras":
        raise ConfigRefused(f"{where} names the class {_short(module)}.{class_name}: this "
                            f"server does not build {package}'s objects.")
    if package != "keras":
        _check_outside_keras(module, class_name, registered, where)
        return
    section = rest[4:] if rest.startswith("src.") else rest
    if module == "keras":
        allowed = class_name in _TOP_LEVEL_CLASSES
    elif section.split(".")[0] == "ops":  # an operation's class, never its function
        allowed = class_name[0].isupper() and class_name not in CALLING_OPS
    else:
        allowed = section.split(".")[0] in _CLASS_MODULES
    if not allowed:
        raise ConfigRefused(
            f"{where} names the class {_short(module)}.{class_name}, which is not a layer, "
            "model, optimizer, loss, metric or their parts: this server does not build it.")


def _check_outside_keras(module, class_name, registered, where):
    """Refuses a class of a module outside Keras unless it is registered on the server: a
    Python standard module's always (no registered object lives there), any other once
    the registry is known (Keras would import the module to look the name up)."""
    package = module.partition(".")[0]
    if package in sys.stdlib_module_names or package.startswith("_") or registered is not None:
        raise ConfigRefused(
            f"{where} names the class {_short(class_name)!r}, which this server does not "
            f"know (module {_short(module)}: neither Keras's nor registered here). Register "
            "it (@keras.saving.register_keras_serializable()) in a package installed on "
            "the server, or use Keras's own classes.")


def _check_function(item, module, registered, where):
    name = item.get("config")
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise ConfigRefused(f"{where} names the function {_short(name)!r}: a function name "
                            "is one Python name, without dots (the module goes in 'module').")
    if _allowed_function(module, name) or (registered is None and not _is_keras(module)) \
            or _registered(name, registered):
        return
    raise ConfigRefused(
        f"{where} refers to the function {_short(module)}.{_short(name)}, which this "
        "server does not call: only activations, losses, metrics and keras.ops math, "
        "or functions registered in a package installed on the server.")


def _check_node(node, layer, where):
    """Refuses a functional graph's node whose arguments hold no tensor of the graph, or
    hold objects: Keras calls the node's layer or operation on its arguments while it
    loads the model, so a node of constants runs then (an endless ``while_loop``), and an
    object among them (a function, a layer) is something it calls."""
    if not isinstance(node, dict):
        return  # Keras 2's [[name, node, tensor, kwargs]]: graph tensors by name
    tensors, pending = 0, [node.get("args"), node.get("kwargs")]
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, dict):
            kind = item.get("class_name")
            if kind == "__keras_tensor__":
                tensors += 1
            elif kind is not None and kind not in _DATA_OBJECTS:
                raise ConfigRefused(
                    f"{where} calls {_short(layer)} on a {_short(kind)} object: a node's "
                    "arguments are tensors and values only.")
            else:
                pending.extend(item.values())
    if not tensors:
        raise ConfigRefused(
            f"{where} calls {_short(layer)} on constants only (no tensor of the model), "
            "which Keras would run while loading it: a model's nodes take its tensors.")


def _short(value, limit=80):
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _registered(name, registered):
    return registered is not None and isinstance(name, str) and name in registered


def _is_keras(module):
    return isinstance(module, str) and module.split(".")[0] in (
        "keras", "builtins", "keras_hub", "keras_cv", "keras_nlp")


def _allowed_function(module, name):
    if module not in _FUNCTION_MODULES or not isinstance(name, str):
        return False
    allowed = _FUNCTION_MODULES[module]
    if allowed is not None:
        return name in allowed
    return name.isidentifier() and not name.startswith("_") and name not in _NOT_MODELLING


def _check_state(item, where):
    """Refuses metric settings that would allocate more state than the limits."""
    for key, limit in (("num_thresholds", MAX_THRESHOLDS), ("num_classes", MAX_CLASSES),
                       ("num_labels", MAX_CLASSES)):
        value = item.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and \
                not value <= limit:  # NaN too
            raise ConfigRefused(
                f"{where} sets {key}={value!r}, more than this server allocates "
                f"(at most {limit}).")
    labels = item.get("num_labels")
    if isinstance(item.get("num_thresholds"), int) and isinstance(labels, int) and \
            item["num_thresholds"] * labels > MAX_THRESHOLD_STATE:
        raise ConfigRefused(
            f"{where} sets num_thresholds x num_labels = {item['num_thresholds'] * labels}, "
            f"more than this server allocates (at most {MAX_THRESHOLD_STATE}).")
    for key in _FILE_SETTINGS:
        if isinstance(item.get(key), str):
            raise ConfigRefused(
                f"{where} sets {key} to {_short(item[key])!r}, a file Keras would read on "
                "this server: give the values themselves (a list).")
    thresholds = item.get("thresholds")
    if isinstance(thresholds, list) and len(thresholds) > MAX_THRESHOLDS:
        raise ConfigRefused(f"{where} sets {len(thresholds)} thresholds, more than this "
                            f"server allocates (at most {MAX_THRESHOLDS}).")
