"""The docs site builds with ``mkdocs build --strict`` (broken links, anchors or
docstrings fail it), and every module of the package has an API reference page in its
navigation."""

import glob
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))


def _modules():
    """The package's modules, subpackages' included, by path under ``distkeras/``
    without ``.py`` (``trainers``, ``punchcard/client``), without ``__init__``."""
    package = os.path.join(ROOT, "distkeras")
    names = (os.path.splitext(os.path.relpath(path, package))[0].replace(os.sep, "/")
             for path in glob.glob(os.path.join(package, "**", "*.py"), recursive=True))
    return sorted(name for name in names if os.path.basename(name) != "__init__")


def test_every_module_has_a_reference_page_in_the_navigation():
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as handle:
        config = handle.read()
    modules = _modules()
    assert "trainers" in modules and "punchcard/client" in modules  # subpackages too
    for name in modules:
        page = os.path.join(ROOT, "docs", "reference", f"{name}.md")
        assert os.path.exists(page), f"docs/reference/{name}.md is missing"
        with open(page, encoding="utf-8") as handle:
            assert f"::: distkeras.{name.replace('/', '.')}" in handle.read(), page
        assert f"reference/{name}.md" in config, f"mkdocs.yml's nav lacks {name}"


def test_site_builds_strictly(tmp_path):
    # NO_MKDOCS_2_WARNING: Material's banner about its successor, printed on every build.
    environment = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=environment)
    assert result.returncode == 0, result.stdout + result.stderr

    # The reference is generated from the docstrings, not just named.
    with open(tmp_path / "reference" / "trainers" / "index.html", encoding="utf-8") as handle:
        trainers = handle.read()
    assert "AsynchronousDistributedTrainer" in trainers
    assert "communication_window" in trainers
    # A page that README.md links to, and the tutorial the tests run.
    assert (tmp_path / "guide" / "fit-vs-train" / "index.html").exists()
    assert (tmp_path / "writing-an-algorithm" / "index.html").exists()
