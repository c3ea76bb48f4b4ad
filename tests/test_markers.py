"""The lists in conftest.py that mark tests `spark` or `slow` name tests that exist: a renamed
test would silently leave the fast subset, or start a JVM in it."""

import ast
import pathlib

import pytest

from conftest import SLOW, SPARK_WITHOUT_FIXTURE

TESTS = pathlib.Path(__file__).parent


def _test_names(file_name):
    tree = ast.parse((TESTS / file_name).read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("entry", sorted(SLOW | SPARK_WITHOUT_FIXTURE, key=str), ids=str)
def test_every_listed_test_exists(entry):
    file_name, test = (entry, None) if isinstance(entry, str) else entry
    assert (TESTS / file_name).is_file(), f"{file_name} is listed in conftest.py but missing"
    if test is not None:
        assert test in _test_names(file_name), f"{file_name} has no {test}"
