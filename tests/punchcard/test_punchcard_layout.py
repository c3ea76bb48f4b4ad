"""The Punchcard package's layout: the client ships no server, the dist-keras face
(`distkeras.job_deployment`) is thin and complete, and the modules keep to their own
names. No Spark, no server started."""

import glob
import json
import os
import subprocess
import sys

import pytest
from layout_checks import private_names_taken_from_other_modules

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
PACKAGE = os.path.join(ROOT, "distkeras", "punchcard")
# What a notebook that submits jobs may load of the package.
CLIENT_SIDE = {"distkeras.punchcard", "distkeras.punchcard.client",
               "distkeras.punchcard.protocol"}


def _modules_loaded_by(code):
    """The modules a fresh Python process has loaded after running ``code``."""
    script = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("code", [
    "import distkeras.punchcard.client",
    "from distkeras.punchcard.client import Job, JobError, ServerUnreachable, SECRET_HEADER",
    "from distkeras.job_deployment import Job",
])
def test_importing_the_client_loads_no_server(code):
    loaded = _modules_loaded_by(code)
    assert "distkeras.punchcard.client" in loaded
    for web in ("flask", "werkzeug", "waitress"):
        assert web not in loaded, f"{code!r} imported {web}"
    server = sorted(name for name in loaded
                    if name.startswith("distkeras.punchcard") and name not in CLIENT_SIDE)
    assert server == [], f"{code!r} imported the server's modules {server}"


def test_the_face_resolves_every_name_to_the_package_object():
    import importlib

    from distkeras import job_deployment

    modules = [importlib.import_module(f"distkeras.punchcard.{os.path.basename(path)[:-3]}")
               for path in _package_modules() if not path.endswith("__init__.py")]
    assert len(job_deployment.__all__) == len(set(job_deployment.__all__))
    for name in job_deployment.__all__:
        value = getattr(job_deployment, name)
        # The same object as the package's, not a copy or a wrapper.
        assert any(getattr(module, name, None) is value for module in modules), name
    assert set(dir(job_deployment)) >= set(job_deployment.__all__)
    with pytest.raises(AttributeError, match="no_such_name"):
        job_deployment.no_such_name  # noqa: B018


def _package_modules():
    return sorted(glob.glob(os.path.join(PACKAGE, "*.py")))


@pytest.mark.parametrize("path", _package_modules(), ids=os.path.basename)
def test_no_module_takes_another_modules_private_names(path):
    assert private_names_taken_from_other_modules(path) == []


def test_the_private_name_check_finds_one(tmp_path):
    """The check above can fail: a module that takes a private name is caught."""
    path = tmp_path / "module.py"
    path.write_text("from distkeras.punchcard.processes import _executor_arguments\n"
                    "from distkeras.punchcard import job_files\n"
                    "job_files._ERROR_LINE\n")
    assert [text for _, text in private_names_taken_from_other_modules(str(path))] == [
        "from distkeras.punchcard.processes import _executor_arguments",
        "job_files._ERROR_LINE"]


@pytest.mark.parametrize("path", _package_modules(), ids=os.path.basename)
def test_each_module_is_small(path):
    with open(path, encoding="utf-8") as handle:
        assert len(handle.readlines()) <= 600, f"{path} has grown past 600 lines: split it"
