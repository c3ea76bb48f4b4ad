"""The docs site builds with ``mkdocs build --strict`` (broken links, anchors or
docstrings fail it), and its API reference lists the public API, each module once, and
nothing else: the top-level modules users import, the `distkeras.algorithms` package (for
writing an algorithm), and the few modules of the subpackages users import by name."""

import glob
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
# Modules of the subpackages that users import by name: the Spark ML estimator (the
# transformers, predictor and evaluators have top-level faces), Punchcard's client, and
# the sweep and plotting tools the guide runs.
PUBLIC_IN_SUBPACKAGES = ("ml/estimators", "punchcard/client", "tools/experiments",
                         "tools/plotting")
# Top-level modules that are no API of their own: dist-keras's trainer accessors, which
# users reach as the trainers' methods.
NOT_REFERENCED = ("compat",)


def _modules(folder):
    """The modules of ``distkeras/<folder>`` by path under ``distkeras/`` without
    ``.py`` (``trainers``, ``algorithms/adag``); a package's ``__init__`` as the package
    (``algorithms``)."""
    package = os.path.join(ROOT, "distkeras")
    names = []
    for path in glob.glob(os.path.join(package, folder, "*.py")):
        name = os.path.splitext(os.path.relpath(path, package))[0].replace(os.sep, "/")
        if os.path.basename(name) == "__init__":
            name = os.path.dirname(name)
        if name:
            names.append(name)
    return sorted(names)


def public_modules():
    """The modules the reference documents."""
    top = [name for name in _modules("") if name not in NOT_REFERENCED]
    return sorted(top + _modules("algorithms") + list(PUBLIC_IN_SUBPACKAGES))


def _page(name):
    """The reference page of module ``name`` (a package's is its ``index.md``)."""
    package = os.path.join(ROOT, "distkeras", *name.split("/"))
    return f"{name}/index.md" if os.path.isdir(package) else f"{name}.md"


def reference_problems(public, pages, nav):
    """What makes the reference other than one page per public module and nothing else.

    Args:
        public: The public modules (``trainers``, ``algorithms/adag``).
        pages: ``{page path under docs/reference/: its text}``.
        nav: The reference pages mkdocs.yml's navigation names.
    """
    problems = []
    expected = {_page(name): name for name in public}
    for page, name in sorted(expected.items()):
        if page not in pages:
            problems.append(f"docs/reference/{page} is missing")
        elif f"::: distkeras.{name.replace('/', '.')}" not in pages[page]:
            problems.append(f"docs/reference/{page} does not render distkeras.{name}")
        if page not in nav:
            problems.append(f"mkdocs.yml's nav lacks reference/{page}")
    problems += [f"docs/reference/{page} documents no public module: delete it"
                 for page in sorted(set(pages) - set(expected))]
    problems += [f"mkdocs.yml's nav names reference/{page}, no public module's page"
                 for page in sorted(set(nav) - set(expected))]
    return problems


def test_the_reference_documents_the_public_api_and_nothing_else():
    reference = os.path.join(ROOT, "docs", "reference")
    pages = {}
    for path in glob.glob(os.path.join(reference, "**", "*.md"), recursive=True):
        with open(path, encoding="utf-8") as handle:
            pages[os.path.relpath(path, reference).replace(os.sep, "/")] = handle.read()
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as handle:
        nav = re.findall(r"reference/(\S+\.md)", handle.read())
    public = public_modules()
    assert {"trainers", "datasets", "algorithms", "algorithms/base",
            "punchcard/client"} <= set(public)
    assert reference_problems(public, pages, nav) == []


def test_the_reference_check_finds_a_missing_an_internal_and_an_unlisted_page():
    """The check above can fail: a public module without its page, a page of an internal
    module, and a page missing from the navigation are each found."""
    pages = {"trainers.md": "::: distkeras.trainers", "algorithms/index.md": "# x",
             "training/driver.md": "::: distkeras.training.driver"}
    nav = ["trainers.md", "training/driver.md"]
    assert reference_problems(["trainers", "algorithms", "errors"], pages, nav) == [
        "docs/reference/algorithms/index.md does not render distkeras.algorithms",
        "mkdocs.yml's nav lacks reference/algorithms/index.md",
        "docs/reference/errors.md is missing",
        "mkdocs.yml's nav lacks reference/errors.md",
        "docs/reference/training/driver.md documents no public module: delete it",
        "mkdocs.yml's nav names reference/training/driver.md, no public module's page"]


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
