"""One exception hierarchy: every error distkeras defines derives from `DistkerasError`, and
keeps its built-in kind; the package's own names import from ``distkeras`` lazily."""

import importlib
import inspect
import os
import pkgutil
import subprocess
import sys

import pytest

import distkeras
from distkeras.errors import DistkerasError

# Errors that belong to another library's protocol (an HTTP server's own error type).
NOT_OURS = {("distkeras.punchcard.front", "Refused")}


def _our_modules():
    for info in pkgutil.walk_packages(distkeras.__path__, "distkeras."):
        if info.name.endswith("__main__"):
            continue
        yield info.name


def _exceptions_defined_in(name):
    module = importlib.import_module(name)
    for attribute, value in vars(module).items():
        if inspect.isclass(value) and issubclass(value, BaseException) \
                and value.__module__ == name:
            yield attribute, value


def test_every_error_distkeras_defines_derives_from_one_base():
    found, outside = [], []
    for name in _our_modules():
        for attribute, error in _exceptions_defined_in(name):
            found.append(error)
            if not issubclass(error, DistkerasError) and (name, attribute) not in NOT_OURS:
                outside.append(f"{name}.{attribute}")
    assert outside == []
    assert len(found) >= 15  # the walk did find them (errors, transport, punchcard, ...)


@pytest.mark.parametrize("path, kind", [
    ("distkeras.errors.InvalidDataError", ValueError),
    ("distkeras.errors.TrainingError", RuntimeError),
    ("distkeras.errors.ExecutorEnvironmentError", ImportError),
    ("distkeras.errors.DataSourceError", OSError),
    ("distkeras.transport.networking.PeerClosedError", ConnectionError),
    ("distkeras.punchcard.refusals.BadRequest", ValueError),
    ("distkeras.punchcard.client.JobError", RuntimeError),
])
def test_each_error_keeps_its_builtin_kind(path, kind):
    module, name = path.rsplit(".", 1)
    error = getattr(importlib.import_module(module), name)
    assert issubclass(error, DistkerasError) and issubclass(error, kind)
    with pytest.raises(kind):
        raise error("message")


def test_the_package_names_import_from_distkeras_without_importing_keras_first():
    """``import distkeras`` imports neither Keras nor JAX (Spark starts first); the names
    come on first use and are the very objects of their modules."""
    code = ("import sys, distkeras; assert 'keras' not in sys.modules, 'keras imported'; "
            "assert 'jax' not in sys.modules, 'jax imported'; "
            "from distkeras import ADAG, local_spark_session, DistkerasError, Algorithm; "
            "from distkeras.trainers import ADAG as A; from distkeras.session import "
            "local_spark_session as L; assert ADAG is A and local_spark_session is L; "
            "print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=dict(os.environ), timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"


def test_an_unknown_name_is_an_attribute_error_and_submodules_still_import():
    with pytest.raises(AttributeError, match="no attribute 'NoSuchTrainer'"):
        distkeras.NoSuchTrainer
    from distkeras import errors, trainers  # submodules, not exports
    from distkeras.training import registry
    assert errors.DistkerasError is DistkerasError and trainers.ADAG is distkeras.ADAG
    assert registry.BUILTIN_TRAINERS
    assert set(registry.BUILTIN_TRAINERS) <= set(distkeras.__all__)
