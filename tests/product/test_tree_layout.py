"""The layout of `distkeras.transport`, `distkeras.keras_io` and `distkeras.tools`: each
old import path (`distkeras.networking`, `distkeras.parameter_servers`, `distkeras.utils`,
the server's parts, ...) is a thin and complete face of the package modules that hold its
names, and no module of the packages takes another module's private names. No Spark, no
server started."""

import glob
import importlib
import inspect
import os

import pytest
from layout_checks import private_names_taken_from_other_modules

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
PACKAGES = ("transport", "keras_io", "tools")
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
                        "distkeras.tools.history", "distkeras.tools.dataframes",
                        "distkeras.tools.legacy_utils"],
    "distkeras.experiments": ["distkeras.tools.experiments"],
    "distkeras.plotting": ["distkeras.tools.plotting"],
    "distkeras.schemes": ["distkeras.tools.schemes"],
    "distkeras.validation": ["distkeras.training.validation_data",
                             "distkeras.training.callbacks", "distkeras.training.validator"],
}
# Public in the package for its own modules, never names of the old module.
NOT_IN_THE_FACE = {"distkeras.utils": {"defer_tensorflow_import", "check_keras_archive",
                                       "BINARY_LOSSES"}}
# dist-keras's aliases, defined by the face itself.
FACE_ALIASES = {"distkeras.utils": {"serialize_keras_model": "serialize_model",
                                    "deserialize_keras_model": "deserialize_model"}}


def _modules(package):
    return sorted(glob.glob(os.path.join(ROOT, "distkeras", package, "*.py")))


def public_names(module):
    """The names a face must carry: the module's ``__all__``, else its own public
    classes and functions and its constants."""
    if hasattr(module, "__all__"):
        return set(module.__all__)
    return {name for name, value in vars(module).items() if not name.startswith("_") and (
        ((inspect.isfunction(value) or inspect.isclass(value))
         and value.__module__ == module.__name__) or name.isupper())}


def _package_modules():
    return [path for package in PACKAGES for path in _modules(package)]


@pytest.mark.parametrize("path", _package_modules(),
                         ids=lambda path: os.path.relpath(path, ROOT))
def test_no_module_takes_another_modules_private_names(path):
    assert private_names_taken_from_other_modules(path) == []


@pytest.mark.parametrize("path", _package_modules(),
                         ids=lambda path: os.path.relpath(path, ROOT))
def test_each_module_is_small(path):
    with open(path, encoding="utf-8") as handle:
        assert len(handle.readlines()) <= 600, f"{path} has grown past 600 lines: split it"


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
