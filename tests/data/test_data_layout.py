"""The data package's layout: `distkeras.datasets` is a thin and complete face, the other
data modules live only under `distkeras.data`, and no module of `distkeras.data` or
`distkeras.ml` takes another module's private names. No Spark started."""

import glob
import importlib
import importlib.util
import inspect
import os

import pytest
from layout_checks import private_names_taken_from_other_modules

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
# Public in distkeras.data.datasets for the CLI, not a name of the dist-keras module.
NOT_IN_THE_FACE = {"check_not_there"}


def _modules(package):
    return sorted(glob.glob(os.path.join(ROOT, "distkeras", package, "*.py")))


@pytest.mark.parametrize("path", _modules("data") + _modules("ml"),
                         ids=lambda path: os.path.relpath(path, ROOT))
def test_no_module_takes_another_modules_private_names(path):
    assert private_names_taken_from_other_modules(path) == []


def test_the_datasets_face_resolves_every_name_to_the_package_object():
    from distkeras import datasets as face
    from distkeras.data import datasets

    assert len(face.__all__) == len(set(face.__all__))
    for name in face.__all__:
        # The same object as the package's, not a copy or a wrapper.
        assert getattr(face, name) is getattr(datasets, name), name
    with pytest.raises(AttributeError, match="no_such_name"):
        face.no_such_name  # noqa: B018


def test_the_datasets_face_names_every_public_function_and_constant():
    from distkeras import datasets as face
    from distkeras.data import datasets

    public = {name for name, value in vars(datasets).items()
              if not name.startswith("_") and (
                  (inspect.isfunction(value) and value.__module__ == datasets.__name__)
                  or name.isupper())}
    assert "load_fashion_mnist" in public
    assert public - NOT_IN_THE_FACE == set(face.__all__)


@pytest.mark.parametrize("name", ["feed", "frame_layout", "tensors", "vectors",
                                  "sample_weights", "parquet_source"])
def test_internal_data_modules_live_only_in_the_package(name):
    assert importlib.util.find_spec(f"distkeras.data.{name}") is not None
    # No stale copy or face at the old path: these were never imported by users.
    assert importlib.util.find_spec(f"distkeras.{name}") is None

