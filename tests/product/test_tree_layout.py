"""The layout of the package (issues #34 and #46): one home per name. A module lives in
the subpackage of the place it runs; the top level holds only the modules users import
(the package, `errors`, `session`, `datasets`, `cli` and dist-keras's ten), each but
`trainers` a thin face of dist-keras's names (and the few our docs tell users to import
from it); no module under a subpackage only re-exports another's names; every logger is
named by its module; the library imports no face; no module anywhere under
``distkeras/`` takes another module's private names, and none is over 600 lines. No
Spark, no server started."""

import ast
import glob
import importlib
import inspect
import os
import subprocess
import sys

import pytest
from layout_checks import private_names_taken_from_other_modules

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
# dist-keras's ten modules, by the names its scripts import.
DIST_KERAS_MODULES = {"trainers", "workers", "parameter_servers", "networking", "utils",
                      "transformers", "predictors", "evaluators", "job_deployment", "schemes"}
# The top level: the modules users import, and nothing else (`cli` is a package).
TOP_LEVEL = DIST_KERAS_MODULES | {"__init__", "errors", "session", "datasets"}
# A top-level module that may stay besides: dist-keras's trainer getters and setters,
# mixins of the trainers (the trainers' change of issue #46 decides its fate).
TOP_LEVEL_OPTIONAL = {"compat"}
MAX_TOP_LEVEL = 16
# Each face: the names it carries, exactly (dist-keras's, and what the docs tell users to
# import from it), and the package modules that hold them.
FACES = {
    "distkeras.networking": ({"connect", "recv_data", "send_data"},
                             ["distkeras.transport.networking"]),
    "distkeras.parameter_servers": (
        {"ParameterServer", "SocketParameterServer", "DeltaParameterServer",
         "ADAGParameterServer", "DynSGDParameterServer", "ExperimentalParameterServer"},
        ["distkeras.transport.parameter_servers"]),
    "distkeras.workers": (
        {"Worker", "SequentialWorker", "NetworkWorker", "ADAGWorker", "DOWNPOURWorker",
         "AEASGDWorker", "EAMSGDWorker", "DynSGDWorker", "ExperimentalWorker"},
        ["distkeras.executor.worker", "distkeras.executor.sequential",
         "distkeras.executor.network", "distkeras.executor.windowed"]),
    "distkeras.utils": (
        {"get_os_username", "set_keras_base_directory", "to_one_hot_encoded_dense",
         "new_dataframe_row", "json_to_dataframe_row", "pickle_object", "unpickle_object",
         "serialize_keras_model", "deserialize_keras_model", "history_executors_average",
         "history_executor", "uniform_weights", "shuffle", "precache",
         # docs/guide/clusters-backends-checkpoints.md: models and histories on any path.
         "serialize_model", "deserialize_model", "save_model", "load_model", "save_history",
         "load_history"},
        ["distkeras.keras_io.archives", "distkeras.training.history",
         "distkeras.tools.dataframes", "distkeras.tools.legacy_utils"]),
    "distkeras.transformers": (
        {"MinMaxTransformer", "BinaryLabelTransformer", "StandardTransformer",
         "DenseTransformer", "ReshapeTransformer", "OneHotTransformer", "LabelIndexTransformer",
         # docs/guide/prediction-pipelines-evaluators.md
         "StandardEstimator", "PackedTensorTransformer"},
        ["distkeras.ml.label_encoders", "distkeras.ml.scalers", "distkeras.ml.reshapers"]),
    "distkeras.predictors": ({"ModelPredictor"}, ["distkeras.ml.predictors"]),
    "distkeras.evaluators": ({"AccuracyEvaluator", "LossEvaluator"},
                             ["distkeras.ml.accuracy_evaluator", "distkeras.ml.loss_evaluator"]),
    "distkeras.job_deployment": ({"Job", "Punchcard"},
                                 ["distkeras.punchcard.client", "distkeras.punchcard.service"]),
    "distkeras.schemes": ({"Scheme", "Emperor"}, ["distkeras.tools.schemes"]),
}
# Top-level modules that are not faces, each for a reason: the package itself, the
# exception hierarchy and the Spark session every script starts with (imported by the
# package, below every subpackage), and the
# trainers: dist-keras's trainer classes by their dist-keras names (declarations of the
# built-in algorithms' trainers over `distkeras.training`), the module users import.
NOT_FACES = {"__init__", "errors", "session", "trainers"}
# A face checked elsewhere: tests/data/test_data_layout.py (complete, as documented).
OTHER_FACES = {"distkeras.datasets"}
# dist-keras's aliases, defined by the face itself.
FACE_ALIASES = {"distkeras.utils": {"serialize_keras_model": "serialize_model",
                                    "deserialize_keras_model": "deserialize_model"}}
# The one logger a module may name by a literal: the package's, which a tool configures
# as a user does (``logging.getLogger("distkeras")`` sees every module's records).
PACKAGE_LOGGER = "distkeras"


def _all_modules():
    return sorted(glob.glob(os.path.join(ROOT, "distkeras", "**", "*.py"), recursive=True))


def _top_level_modules():
    return sorted(glob.glob(os.path.join(ROOT, "distkeras", "*.py")))


def _subpackage_modules():
    """Every module of a subpackage but its ``__init__`` (a package exports its names)."""
    return sorted(path for path in glob.glob(os.path.join(ROOT, "distkeras", "*", "*.py"))
                  if os.path.basename(path) not in ("__init__.py", "__main__.py"))


def _relative(path):
    return os.path.relpath(path, ROOT)


def _source(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


# --- The top level: the modules users import, and nothing else. ---

def top_level_problems(names):
    """What makes the top-level module ``names`` other than the modules users import."""
    names = set(names)
    problems = [f"distkeras/{name}.py: no module users import; import its names from "
                "where they live, and delete it" for name in
                sorted(names - TOP_LEVEL - TOP_LEVEL_OPTIONAL)]
    problems += [f"distkeras/{name}.py is missing" for name in sorted(TOP_LEVEL - names)]
    if len(names) > MAX_TOP_LEVEL:
        problems.append(f"{len(names)} top-level modules, over {MAX_TOP_LEVEL}")
    return problems


def test_the_top_level_holds_exactly_the_modules_users_import():
    names = [os.path.splitext(os.path.basename(path))[0] for path in _top_level_modules()]
    assert top_level_problems(names) == []


def test_the_top_level_check_finds_an_extra_and_a_missing_module():
    """The check above can fail: a module besides the allowed set, a missing one, and too
    many are each found."""
    extra = sorted(TOP_LEVEL - {"schemes"}) + ["monitor"]
    assert top_level_problems(extra) == [
        "distkeras/monitor.py: no module users import; import its names from where they "
        "live, and delete it", "distkeras/schemes.py is missing"]
    many = sorted(TOP_LEVEL | TOP_LEVEL_OPTIONAL) + ["a", "b"]
    assert top_level_problems(many)[-1] == f"{len(many)} top-level modules, over 16"


# --- Faces: thin, exactly their names, the package's objects. ---

def _faces():
    return {os.path.splitext(os.path.basename(path))[0]
            for path in _top_level_modules()} - NOT_FACES


def _is_alias(node):
    """Whether ``node`` is a name, an attribute of one, a constant, or a literal
    container of those: what a face may assign (``__all__``, an old name for a new one)."""
    if isinstance(node, (ast.Name, ast.Attribute, ast.Constant)):
        return True
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_is_alias(element) for element in node.elts)
    if isinstance(node, ast.Dict):
        return all(key is not None and _is_alias(key) for key in node.keys) and \
            all(_is_alias(value) for value in node.values)
    return False


def not_face_statements(source):
    """``(line, kind)`` of each top-level statement that makes ``source`` more than a face.

    A face holds its docstring, imports, and assignments of names, attributes or literal
    containers of them (``__all__``, aliases); besides those only PEP 562's
    ``__getattr__`` and ``__dir__`` when short (a lazy face) and an
    ``if __name__ == "__main__":`` of one statement (a face runnable with ``-m``).
    """
    found = []
    for index, node in enumerate(ast.parse(source).body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Assign) and _is_alias(node.value) and all(
                isinstance(target, (ast.Name, ast.Tuple))
                or ast.unparse(target) == "sys.modules[__name__]"
                for target in node.targets):
            continue
        if isinstance(node, ast.FunctionDef) and node.name in ("__getattr__", "__dir__") \
                and node.end_lineno - node.lineno < 10:
            continue
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'" \
                and len(node.body) == 1 and not node.orelse:
            continue
        found.append((node.lineno, type(node).__name__))
    return found


@pytest.mark.parametrize("path", _top_level_modules(), ids=_relative)
def test_the_top_level_holds_faces_and_a_short_list_of_its_own(path):
    name = os.path.splitext(os.path.basename(path))[0]
    statements = not_face_statements(_source(path))
    if name in NOT_FACES:
        assert statements, f"distkeras/{name}.py is a face now: take it off NOT_FACES"
    else:
        assert statements == [], (
            f"distkeras/{name}.py holds code of its own: move it into the subpackage where "
            "it runs and leave a face (or, for a reason, add it to NOT_FACES)")


def test_the_face_definition_tells_a_face_from_code():
    """The check above can fail: a function, a class or a computed value is code."""
    face = ('"""A face."""\nimport sys\nfrom distkeras.x import a, b\nold = a\n'
            '__all__ = ["a", "b"]\n_NAMES = {"c": "x"}\n'
            'def __getattr__(name):\n    return name\n'
            'if __name__ == "__main__":\n    sys.exit(a())\n')
    assert not_face_statements(face) == []
    assert not_face_statements(face + "def helper():\n    pass\n") == [(11, "FunctionDef")]
    assert not_face_statements(face + "class Thing:\n    pass\n") == [(11, "ClassDef")]
    assert not_face_statements(face + "LIMIT = a(3)\n") == [(11, "Assign")]
    assert not_face_statements(face + "a()\n") == [(11, "Expr")]


def face_problems(face, names, modules, aliases=None):
    """What makes ``face`` other than a thin face carrying exactly ``names``, each the
    object of one of ``modules``."""
    aliases = aliases or {}
    problems = []
    carried = list(getattr(face, "__all__", []))
    if len(carried) != len(set(carried)):
        problems.append("__all__ repeats a name")
    problems += [f"lacks {name}" for name in sorted(set(names) - set(carried))]
    problems += [f"has {name}: import it from where it lives"
                 for name in sorted(set(carried) - set(names))]
    for name in sorted(set(carried) & set(names)):
        # The same object as the package's, not a copy or a wrapper.
        value = getattr(face, name, None)
        if not any(getattr(module, aliases.get(name, name), None) is value
                   for module in modules):
            problems.append(f"{name} is not the package's object")
    # Thin: the face defines nothing of its own, and exports nothing outside __all__.
    problems += [f"defines {name}" for name, value in vars(face).items()
                 if (inspect.isfunction(value) or inspect.isclass(value))
                 and value.__module__ == face.__name__ and not name.startswith("__")]
    return problems


@pytest.mark.parametrize("face_name", sorted(FACES))
def test_each_face_carries_exactly_its_names_as_the_package_objects(face_name):
    face = importlib.import_module(face_name)
    names, homes = FACES[face_name]
    modules = [importlib.import_module(name) for name in homes]
    assert face_problems(face, names, modules, FACE_ALIASES.get(face_name)) == []


def test_the_faces_table_names_every_face():
    assert {f"distkeras.{name}" for name in _faces()} == set(FACES) | OTHER_FACES


def test_the_face_check_finds_a_missing_an_extra_a_copied_and_an_own_name():
    """The check above can fail: a face that lacks a name, carries one it should not,
    holds a copy of another and defines a function of its own is caught."""
    import types

    from distkeras.transport import networking

    face = types.ModuleType("fake_face")
    face.__all__ = ["connect", "recv_data", "weights_array"]
    for name in face.__all__:
        setattr(face, name, getattr(networking, name))
    face.recv_data = lambda conn: None  # a wrapper, not the package's function
    exec("def helper():\n    pass", vars(face))  # noqa: S102
    assert face_problems(face, {"connect", "recv_data", "send_data"}, [networking]) == [
        "lacks send_data", "has weights_array: import it from where it lives",
        "recv_data is not the package's object", "defines helper"]


# --- No faces inside the subpackages. ---

def _is_logger(node):
    return isinstance(node, ast.Call) and ast.unparse(node.func).endswith("getLogger")


def own_statements(source):
    """``(line, kind)`` of each top-level statement of ``source`` that is more than a
    re-export: its docstring, imports, ``__all__``, aliases of imported names and its
    logger are not."""
    found = []
    for index, node in enumerate(ast.parse(source).body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Assign) and (
                all(isinstance(target, ast.Name) and target.id == "__all__"
                    for target in node.targets)
                or isinstance(node.value, (ast.Name, ast.Attribute)) or _is_logger(node.value)):
            continue
        found.append((node.lineno, type(node).__name__))
    return found


@pytest.mark.parametrize("path", _subpackage_modules(), ids=_relative)
def test_no_module_of_a_subpackage_only_re_exports(path):
    assert own_statements(_source(path)), (
        f"{_relative(path)} only re-exports names: import them from where they live, and "
        "delete it")


def test_the_re_export_check_tells_a_face_from_a_module():
    """The check above can fail: imports, ``__all__``, aliases and a logger make a face; a
    constant, a function or a class of its own make a module."""
    face = ('"""A face."""\nimport logging\nfrom distkeras.x import a, b\nold = a\n'
            'logger = logging.getLogger(__name__)\n__all__ = ["a", "b"]\n')
    assert own_statements(face) == []
    assert own_statements(face + "LIMIT = 3\n") == [(7, "Assign")]
    assert own_statements(face + "def helper():\n    pass\n") == [(7, "FunctionDef")]


# --- Loggers: each named by its module. ---

def loggers_named_by_a_literal(source):
    """``(line, text)`` of each ``getLogger`` call that names its logger other than by
    ``__name__`` (a string or an f-string), but the package's own logger."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not _is_logger(node):
            continue
        arguments = list(node.args) + [keyword.value for keyword in node.keywords]
        for argument in arguments:
            if isinstance(argument, ast.JoinedStr) or (
                    isinstance(argument, ast.Constant) and argument.value != PACKAGE_LOGGER):
                found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


@pytest.mark.parametrize("path", _all_modules(), ids=_relative)
def test_every_logger_is_named_by_its_module(path):
    assert loggers_named_by_a_literal(_source(path)) == [], (
        "name the logger logging.getLogger(__name__): logging.getLogger('distkeras') "
        "configures every module's")


def test_the_logger_check_finds_a_literal_and_an_f_string():
    """The check above can fail: a literal, an f-string and a keyword literal are found;
    ``__name__`` and the package's logger are not."""
    source = ('import logging\nlogger = logging.getLogger(__name__)\n'
              'package = logging.getLogger("distkeras")\n'
              'old = logging.getLogger("distkeras.trainers")\n'
              'def f(name):\n    return logging.getLogger(f"distkeras.{name}")\n'
              'named = logging.getLogger(name="distkeras.workers")\n')
    assert loggers_named_by_a_literal(source) == [
        (4, "logging.getLogger('distkeras.trainers')"),
        (6, "logging.getLogger(f'distkeras.{name}')"),
        (7, "logging.getLogger(name='distkeras.workers')")]


# --- The library imports no face; no module takes another's private names. ---

def faces_imported(path, faces):
    """``(line, name)`` of each top-level face (of ``faces``) the module at ``path``
    imports: the library imports the modules that hold the names, faces are for users."""
    tree = ast.parse(_source(path), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "distkeras":
            names = [f"distkeras.{alias.name}" for alias in node.names if alias.name in faces]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("distkeras."):
            names = [node.module] if node.module.split(".")[1] in faces else []
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names
                     if alias.name.startswith("distkeras.") and alias.name.split(".")[1] in faces]
        else:
            continue
        found += [(node.lineno, name) for name in names]
    return found


def _library_modules():
    """Every module but the faces."""
    faces = _faces()
    return [path for path in _all_modules()
            if not (os.path.dirname(path) == os.path.join(ROOT, "distkeras")
                    and os.path.splitext(os.path.basename(path))[0] in faces)]


@pytest.mark.parametrize("path", _library_modules(), ids=_relative)
def test_the_library_imports_no_face(path):
    assert faces_imported(path, _faces()) == []


def test_the_face_import_check_finds_each_form(tmp_path):
    """The check above can fail: each form of import of a face is found."""
    module = tmp_path / "module.py"
    module.write_text("from distkeras import errors, utils\n"
                      "from distkeras.networking import connect\n"
                      "import distkeras.workers\n"
                      "from distkeras.transport import networking\n"
                      "def f():\n"
                      "    from distkeras.predictors import ModelPredictor\n")
    assert faces_imported(str(module), {"utils", "networking", "workers", "predictors"}) == [
        (1, "distkeras.utils"), (2, "distkeras.networking"), (3, "distkeras.workers"),
        (6, "distkeras.predictors")]


@pytest.mark.parametrize("path", _all_modules(), ids=_relative)
def test_no_module_takes_another_modules_private_names(path):
    assert private_names_taken_from_other_modules(path) == []


def test_the_private_name_check_tells_another_modules_from_its_own(tmp_path):
    """The check above can fail: a private name imported from, or read off, another
    module is found; a module that imports itself by name (for Spark's closures) is not."""
    package = tmp_path / "distkeras"
    package.mkdir()
    (package / "own.py").write_text(
        "from distkeras.other import _hidden\n"
        "from distkeras import other, own\n"
        "def f():\n"
        "    return other._state, own._mine, other.__name__\n")
    assert private_names_taken_from_other_modules(str(package / "own.py")) == [
        (1, "from distkeras.other import _hidden"), (4, "other._state")]


# --- Size. ---

@pytest.mark.parametrize("path", _all_modules(), ids=_relative)
def test_no_module_of_the_package_is_over_600_lines(path):
    """Every module, top level and subpackages alike (issue #34): one job each."""
    with open(path, encoding="utf-8") as handle:
        assert len(handle.readlines()) <= 600, f"{path} has grown past 600 lines: split it"


MAX_CLASS_LINES = 300


def classes_over(source, limit=MAX_CLASS_LINES):
    """``(name, lines)`` of each class in ``source`` longer than ``limit`` lines."""
    sizes = [(node.name, node.end_lineno - node.lineno + 1)
             for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)]
    return [(name, lines) for name, lines in sizes if lines > limit]


@pytest.mark.parametrize("path", _all_modules(), ids=_relative)
def test_no_class_of_the_package_is_over_300_lines(path):
    """A class that grows past this holds more than one part: pass the others in."""
    with open(path, encoding="utf-8") as handle:
        assert classes_over(handle.read()) == []


def test_the_class_size_check_can_fail():
    source = "class Big:\n" + "    x = 1\n" * MAX_CLASS_LINES + "\n\nclass Small:\n    pass\n"
    assert classes_over(source) == [("Big", MAX_CLASS_LINES + 1)]


def test_the_size_check_sees_every_package():
    names = {_relative(path) for path in _all_modules()}
    for name in ("distkeras/trainers.py", "distkeras/ml/accuracy_evaluator.py",
                 "distkeras/cli/__init__.py", "distkeras/punchcard/service.py"):
        assert name in names


# --- What users import still runs. ---

def test_seed_000s_imports_still_run():
    """The tutorial's imports, as printed (the escape hatch of docs/writing-an-algorithm.md)."""
    from distkeras.networking import connect, recv_data, send_data
    from distkeras.parameter_servers import SocketParameterServer
    from distkeras.transport import networking, parameter_servers
    from distkeras.workers import NetworkWorker

    assert SocketParameterServer is parameter_servers.SocketParameterServer
    assert (connect, recv_data, send_data) == (networking.connect, networking.recv_data,
                                               networking.send_data)
    assert SocketParameterServer.__module__ == "distkeras.transport.parameter_servers"
    assert NetworkWorker.__module__ == "distkeras.executor.network"


def test_the_dist_keras_star_import_of_utils_gives_its_helpers():
    namespace = {}
    exec("from distkeras.utils import *", namespace)  # noqa: S102 (dist-keras's examples)
    for name in ("serialize_keras_model", "shuffle", "precache", "uniform_weights",
                 "load_model"):
        assert name in namespace, name


def test_the_cli_package_keeps_its_names_and_runs_as_a_module():
    """`distkeras.cli` became a package: its old names are the submodules' objects, the
    console script's entry point resolves, and ``python -m distkeras.cli`` (Punchcard's
    jobs) still runs it."""
    import distkeras.cli as cli
    from distkeras.cli import common, predict_command, train_args, train_command

    assert (cli.CommandError, cli.build_trainer, cli.trainer_options) == (
        common.CommandError, train_args.build_trainer, train_args.trainer_options)
    assert cli.command_train is train_command.command_train
    assert cli.command_predict is predict_command.command_predict
    assert cli.COMMANDS == {"train": cli.command_train, "predict": cli.command_predict}
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as handle:
        assert 'distkeras = "distkeras.cli:main"' in handle.read()
    assert callable(cli.main)
    environment = dict(os.environ, PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-m", "distkeras.cli", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, env=environment)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage: distkeras {train,predict")
