"""Every repository path (``distkeras/...py``, ``benchmarks/...``, ``tests/...``, ...) and
every dotted Python name (``distkeras.xxx.yyy``) that README.md or a page under docs/
cites exists, so that a move or a deletion cannot leave a dead reference in the docs."""

import glob
import importlib
import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))

# A path starts at one of the repository's top folders, not inside a URL or another path.
PATH = re.compile(r"(?<![\w./~-])(?:distkeras|benchmarks|scripts|examples|tests|docs)/"
                  r"[\w./-]*\w")
NAME = re.compile(r"(?<![\w./-])distkeras(?:\.[A-Za-z_]\w*)+")


def _spark_settings():
    """Dotted names that are Spark settings the package reads, not Python names."""
    from distkeras.data import parquet_source

    return {parquet_source.SETTING}


def documentation_pages(root=ROOT):
    """README.md and every Markdown page under docs/."""
    pages = glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True)
    return sorted(pages) + [os.path.join(root, "README.md")]


def resolves(name):
    """Whether ``name`` is a module, or an attribute (of an attribute...) of one, importing
    only what it names."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            found = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            # Only "this module does not exist" means: try a shorter prefix. A module that
            # exists but fails to import is a failure of its own, raised.
            if error.name and (module_name == error.name
                               or module_name.startswith(error.name + ".")):
                continue
            raise
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def dead_references(text, root=ROOT, settings=()):
    """The repository paths that do not exist and the dotted names that do not resolve
    in ``text``, each once, in order of first mention."""
    dead = []
    for match in PATH.finditer(text):
        path = match.group(0)
        if not os.path.exists(os.path.join(root, path)) and path not in dead:
            dead.append(path)
    for match in NAME.finditer(text):
        name = match.group(0)
        if name not in settings and name not in dead and not resolves(name):
            dead.append(name)
    return dead


def dead_references_of(pages, root=ROOT):
    """``"page: reference"`` for every dead reference of ``pages``."""
    settings = _spark_settings()
    found = []
    for page in pages:
        with open(page, encoding="utf-8") as handle:
            text = handle.read()
        found += [f"{os.path.relpath(page, root)}: {reference}"
                  for reference in dead_references(text, root, settings)]
    return found


def test_every_path_and_name_the_docs_cite_exists():
    pages = documentation_pages()
    assert len(pages) > 30 and any(page.endswith("benchmarks.md") for page in pages)
    dead = dead_references_of(pages)
    assert not dead, "dead references in the docs (page: path or name):\n" + "\n".join(dead)


def test_a_page_citing_a_dead_path_or_name_fails(tmp_path):
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    (tmp_path / "README.md").write_text("Nothing cited.\n", encoding="utf-8")
    (tmp_path / "distkeras").mkdir()
    (tmp_path / "distkeras" / "trainers.py").write_text("", encoding="utf-8")
    page.write_text(
        "Live: `distkeras/trainers.py`, `distkeras.trainers.ADAG`, `distkeras.algorithms`,\n"
        "a link https://example.org/docs/gone.md and the setting `distkeras.parquetDirect`.\n"
        "Dead: `distkeras/cli.py`, docs/gone.md, `distkeras.tensors`,\n"
        "`distkeras.trainers.NoSuchTrainer`, distkeras.no_such.module. Again: docs/gone.md.\n",
        encoding="utf-8")

    dead = dead_references_of(documentation_pages(str(tmp_path)), root=str(tmp_path))

    assert dead == ["docs/page.md: distkeras/cli.py", "docs/page.md: docs/gone.md",
                    "docs/page.md: distkeras.tensors",
                    "docs/page.md: distkeras.trainers.NoSuchTrainer",
                    "docs/page.md: distkeras.no_such.module"]
