"""The layout of the package (issue #34): the tree answers where a module runs and what
it may touch. Each old import path (`distkeras.networking`, `distkeras.utils`,
`distkeras.monitor`, `distkeras.predictors`, the split modules of `distkeras.ml` and
`distkeras.data`, ...) is a thin and complete face of the package modules that hold its
names; the top level holds nothing but faces and a short list of modules of its own; no
module anywhere under ``distkeras/`` takes another module's private names, and none is over
600 lines. No Spark, no server started."""

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
PACKAGES = ("transport", "keras_io", "tools", "cli")
# Old import path: the package modules it is a face of.
FACES = {
    "distkeras.networking": ["distkeras.transport.networking"],
    "distkeras.server_transport": ["distkeras.transport.socket_transport"],
    "distkeras.center": ["distkeras.transport.center"],
    "distkeras.history_sink": ["distkeras.transport.history_sink"],
    "distkeras.epoch_barrier": ["distkeras.transport.epoch_barrier"],
    "distkeras.exchange_checks": ["distkeras.transport.exchange_checks"],
    "distkeras.parameter_servers": ["distkeras.transport.parameter_servers"],
    "distkeras.custom_objects": ["distkeras.keras_io.custom_objects"],
    "distkeras.model_state": ["distkeras.keras_io.model_state"],
    "distkeras.utils": ["distkeras.keras_io.archives", "distkeras.keras_io.compile_config",
                        "distkeras.training.history", "distkeras.tools.dataframes",
                        "distkeras.tools.legacy_utils"],
    "distkeras.experiments": ["distkeras.tools.experiments"],
    "distkeras.plotting": ["distkeras.tools.plotting"],
    "distkeras.schemes": ["distkeras.tools.schemes"],
    "distkeras.validation": ["distkeras.training.validation_data",
                             "distkeras.training.callbacks", "distkeras.training.validator"],
    "distkeras.monitor": ["distkeras.training.monitor"],
    "distkeras.training_checks": ["distkeras.training.checks", "distkeras.algorithms.arguments"],
    "distkeras.training_jobs": ["distkeras.training.spark_jobs"],
    "distkeras.train_options": ["distkeras.training.options"],
    "distkeras.checkpoints": ["distkeras.training.checkpoints"],
    "distkeras.batch_statistics": ["distkeras.training.batch_statistics"],
    "distkeras.epoch_metrics": ["distkeras.executor.metric_sums",
                                "distkeras.training.epoch_metrics",
                                "distkeras.transport.history_messages"],
    "distkeras.registry": ["distkeras.training.registry"],
    "distkeras.epochs": ["distkeras.executor.epochs"],
    "distkeras.step_history": ["distkeras.executor.step_history",
                               "distkeras.transport.history_messages"],
    "distkeras.update_rules": ["distkeras.algorithms.update_rules"],
    "distkeras.storage": ["distkeras.data.storage"],
    "distkeras.executor_backend": ["distkeras.executor.backend"],
    "distkeras.predictors": ["distkeras.ml.predictors", "distkeras.ml.prediction_udf"],
    # Faces inside their packages, of the modules they were split into (issue #34).
    "distkeras.ml.evaluators": ["distkeras.ml.accuracy_evaluator",
                                "distkeras.ml.loss_evaluator", "distkeras.ml.loss_specs"],
    "distkeras.ml.transformers": ["distkeras.ml.label_encoders", "distkeras.ml.scalers",
                                  "distkeras.ml.reshapers"],
    "distkeras.data.dataframes": ["distkeras.data.frame_columns",
                                  "distkeras.data.frame_checks", "distkeras.data.frame_layout"],
}
# Top-level modules that are not faces, each for a reason: the package itself, the
# exception hierarchy and the Spark session every script starts with (imported by the
# package, below every subpackage), dist-keras's own classes kept under their own names
# (`compat`), and the
# trainers: dist-keras's trainer classes by their dist-keras names (declarations of the
# built-in algorithms' trainers over `distkeras.training`), the module users import.
NOT_FACES = {"__init__", "errors", "session", "compat", "trainers"}
# Public in the package for its own modules, never names of the old module.
NOT_IN_THE_FACE = {"distkeras.utils": {"defer_tensorflow_import", "check_keras_archive",
                                       "BINARY_LOSSES", "with_learning_rate"},
                   "distkeras.predictors": {"prediction_udf", "avoid_columnar_udf_input"},
                   "distkeras.ml.evaluators": {"LossSpec", "loss_text", "resolve_loss"},
                   "distkeras.step_history": {"INTEGRAL_FIELDS", "INDEX_FIELD", "VALUES_FIELD",
                                              "unpack_metric_states"},
                   "distkeras.epoch_metrics": {"INTEGRAL_FIELDS", "pack_history",
                                               "unpack_history", "history_records",
                                               "unpack_metric_states"}}
# Names the face keeps for scripts and plug-ins written against it, outside its __all__.
FACE_EXTRAS = {"distkeras.training_checks": {"_check_int": "check_int",
                                             "_check_number": "check_number",
                                             "_check_fraction": "check_fraction"},
               "distkeras.executor_backend": {
                   "_ensure_backend": "ensure_backend",
                   "_enable_compilation_cache": "enable_compilation_cache"}}
# dist-keras's aliases, defined by the face itself.
FACE_ALIASES = {"distkeras.utils": {"serialize_keras_model": "serialize_model",
                                    "deserialize_keras_model": "deserialize_model"},
                "distkeras.epoch_metrics": {"unpack": "unpack_metric_states"}}


def _modules(package):
    return sorted(glob.glob(os.path.join(ROOT, "distkeras", package, "*.py")))


def public_names(module):
    """The names a face must carry: the module's ``__all__``, else its own public
    classes and functions and its constants (not the modules it imports as ``F`` or
    ``T``)."""
    if hasattr(module, "__all__"):
        return set(module.__all__)
    return {name for name, value in vars(module).items() if not name.startswith("_") and (
        ((inspect.isfunction(value) or inspect.isclass(value))
         and value.__module__ == module.__name__)
        or (name.isupper() and not inspect.ismodule(value)))}


def _package_modules():
    return [path for package in PACKAGES for path in _modules(package)]


def _all_modules():
    return sorted(glob.glob(os.path.join(ROOT, "distkeras", "**", "*.py"), recursive=True))


def _top_level_modules():
    return sorted(glob.glob(os.path.join(ROOT, "distkeras", "*.py")))


@pytest.mark.parametrize("path", _all_modules(), ids=lambda path: os.path.relpath(path, ROOT))
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


# Modules that still import a top-level face, being split by another change of issue #34
# (their imports move with them).
IMPORTS_FACES_FOR_NOW = set()


def _faces():
    return {os.path.splitext(os.path.basename(path))[0]
            for path in _top_level_modules()} - NOT_FACES


def faces_imported(path, faces):
    """``(line, name)`` of each top-level face (of ``faces``) the module at ``path``
    imports: the library imports the modules that hold the names, faces are for users."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
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
    """Every module but the faces and those of IMPORTS_FACES_FOR_NOW."""
    faces = _faces()
    return [path for path in _all_modules()
            if os.path.relpath(path, os.path.join(ROOT, "distkeras")) not in IMPORTS_FACES_FOR_NOW
            and not (os.path.dirname(path) == os.path.join(ROOT, "distkeras")
                     and os.path.splitext(os.path.basename(path))[0] in faces)]


@pytest.mark.parametrize("path", _library_modules(),
                         ids=lambda path: os.path.relpath(path, ROOT))
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
                      "    from distkeras.monitor import TrainingMonitor\n")
    assert faces_imported(str(module), {"utils", "networking", "workers", "monitor"}) == [
        (1, "distkeras.utils"), (2, "distkeras.networking"), (3, "distkeras.workers"),
        (6, "distkeras.monitor")]


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
    containers of them (``__all__``, aliases, ``sys.modules[__name__] = module``); besides
    those only PEP 562's ``__getattr__`` and ``__dir__`` when short (a lazy face) and an
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


@pytest.mark.parametrize("path", _top_level_modules(),
                         ids=lambda path: os.path.relpath(path, ROOT))
def test_the_top_level_holds_faces_and_a_short_list_of_its_own(path):
    name = os.path.splitext(os.path.basename(path))[0]
    with open(path, encoding="utf-8") as handle:
        statements = not_face_statements(handle.read())
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


@pytest.mark.parametrize("path", _package_modules(),
                         ids=lambda path: os.path.relpath(path, ROOT))
def test_each_module_is_small(path):
    with open(path, encoding="utf-8") as handle:
        assert len(handle.readlines()) <= 600, f"{path} has grown past 600 lines: split it"


def _all_modules():
    return sorted(glob.glob(os.path.join(ROOT, "distkeras", "**", "*.py"), recursive=True))


@pytest.mark.parametrize("path", _all_modules(), ids=lambda path: os.path.relpath(path, ROOT))
def test_no_module_of_the_package_is_over_600_lines(path):
    """Every module, top level and subpackages alike (issue #34): one job each."""
    with open(path, encoding="utf-8") as handle:
        assert len(handle.readlines()) <= 600, f"{path} has grown past 600 lines: split it"


def test_the_size_check_sees_every_package():
    names = {os.path.relpath(path, ROOT) for path in _all_modules()}
    for name in ("distkeras/trainers.py", "distkeras/ml/evaluators.py",
                 "distkeras/cli/__init__.py", "distkeras/punchcard/service.py"):
        assert name in names


def face_problems(face, modules, not_in_the_face=(), aliases=None):
    """What makes ``face`` other than a thin and complete face of ``modules``."""
    aliases = aliases or {}
    problems = []
    names = list(getattr(face, "__all__", []))
    if len(names) != len(set(names)):
        problems.append("__all__ repeats a name")
    # Complete: every public name of the package modules, and nothing else.
    expected = set().union(*(public_names(module) for module in modules))
    expected = expected - set(not_in_the_face) | set(aliases)
    problems += [f"lacks {name}" for name in sorted(expected - set(names))]
    problems += [f"has {name} of its own" for name in sorted(set(names) - expected)]
    for name in set(names) & expected:
        # The same object as the package's, not a copy or a wrapper.
        value = getattr(face, name, None)
        if not any(getattr(module, aliases.get(name, name), None) is value
                   for module in modules):
            problems.append(f"{name} is not the package's object")
    # Thin: the face defines nothing of its own.
    problems += [f"defines {name}" for name, value in vars(face).items()
                 if (inspect.isfunction(value) or inspect.isclass(value))
                 and value.__module__ == face.__name__]
    return problems


@pytest.mark.parametrize("face_name", sorted(FACES))
def test_each_face_resolves_every_name_to_the_package_object(face_name):
    face = importlib.import_module(face_name)
    modules = [importlib.import_module(name) for name in FACES[face_name]]
    assert face_problems(face, modules, NOT_IN_THE_FACE.get(face_name, ()),
                         FACE_ALIASES.get(face_name)) == []
    for old, new in FACE_EXTRAS.get(face_name, {}).items():
        assert any(getattr(face, old) is getattr(module, new, None) for module in modules)


def test_old_plug_ins_imports_of_the_training_checks_still_run():
    """docs/writing-an-algorithm.md once printed the underscored checks."""
    from distkeras.training import checks
    from distkeras.training_checks import _check_fraction, _check_int, _check_number

    assert (_check_int, _check_number, _check_fraction) == (
        checks.check_int, checks.check_number, checks.check_fraction)


def test_seed_000s_imports_still_run():
    """The tutorial's imports, as printed (the escape hatch of docs/writing-an-algorithm.md)."""
    from distkeras.networking import connect, recv_data, send_data
    from distkeras.parameter_servers import SocketParameterServer
    from distkeras.transport import networking, parameter_servers

    assert SocketParameterServer is parameter_servers.SocketParameterServer
    assert (connect, recv_data, send_data) == (networking.connect, networking.recv_data,
                                               networking.send_data)
    assert SocketParameterServer.__module__ == "distkeras.transport.parameter_servers"


def test_the_face_check_finds_a_missing_a_copied_and_an_own_name():
    """The check above can fail: a face that lacks a name, holds a copy of another and
    defines a function of its own is caught."""
    import types

    from distkeras.transport import networking

    face = types.ModuleType("fake_face")
    face.__all__ = sorted(public_names(networking) - {"send_data"})
    for name in face.__all__:
        setattr(face, name, getattr(networking, name))
    face.recv_data = lambda conn: None  # a wrapper, not the package's function
    exec("def helper():\n    pass", vars(face))  # noqa: S102
    assert face_problems(face, [networking]) == [
        "lacks send_data", "recv_data is not the package's object", "defines helper"]


def test_the_dist_keras_star_import_of_utils_gives_its_helpers():
    namespace = {}
    exec("from distkeras.utils import *", namespace)  # noqa: S102 (dist-keras's examples)
    for name in ("serialize_keras_model", "shuffle", "precache", "uniform_weights",
                 "average_history", "load_model"):
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
