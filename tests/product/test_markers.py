"""The lists in conftest.py that mark tests `spark` or `slow` name tests that exist: a renamed
test would silently leave the fast subset, or start a JVM in it. They name files by their
base name, which pytest's default import mode also needs unique across the test folders."""

import ast
import pathlib

import pytest

from conftest import LONGEST_FILES_FIRST, SLOW, SPARK_WITHOUT_FIXTURE

TESTS = pathlib.Path(__file__).parents[1]


def _test_files():
    """Every test file under tests/, by base name."""
    return {path.name: path for path in TESTS.rglob("test_*.py")}


def _test_names(path):
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_test_file_names_are_unique_across_folders():
    names = [path.name for path in TESTS.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted(name for name in names if names.count(name) > 1)


@pytest.mark.parametrize("entry", sorted(SLOW | SPARK_WITHOUT_FIXTURE, key=str), ids=str)
def test_every_listed_test_exists(entry):
    file_name, test = (entry, None) if isinstance(entry, str) else entry
    path = _test_files().get(file_name)
    assert path is not None, f"{file_name} is listed in conftest.py but missing"
    if test is not None:
        assert test in _test_names(path), f"{file_name} has no {test}"


def test_every_file_run_first_exists():
    missing = sorted(set(LONGEST_FILES_FIRST) - set(_test_files()))
    assert not missing, f"LONGEST_FILES_FIRST in conftest.py names missing files: {missing}"
