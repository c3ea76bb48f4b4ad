"""Every docstring under distkeras/ keeps its ``Notes:`` section to the why (issue #52): at
most 5 non-empty lines, no measured figure (points, %, seconds, samples/s, x-fold, MB...),
and every docs/ page it names exists. The measurements live on the algorithm's or the
topic's page under docs/ ("How the defaults were chosen", "Measured"); docs/style.md
says so. Parsed with `ast`: no Keras, no Spark."""

import ast
import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAX_NOTES_LINES = 5

SECTION = re.compile(r"^(\s*)Notes?:\s*$")
# A number (signed, with thousands commas or a decimal part) not inside a word or a name.
_NUMBER = r"(?<![\w.`/])[+-]?\d[\d,]*(?:\.\d+)?"
# What makes a number a measurement: its unit (space optional only where unambiguous).
_UNIT = (r"(?:\s?(?:%|percent\b|×|-fold\b)"
         r"|x\b"  # 1.99x (not "3 x 3")
         r"|\s?(?:[KMGT]i?B|[KMG]bit/s)\b"
         r"|\s?(?:ns|us|µs|ms|s|secs?|seconds?|minutes?)\b(?!/)"
         r"|\s(?:points?|pts|seeds?)\b"
         r"|\s(?:samples|rows|steps|commits|pairs|pulls|images)(?:/s|\sper\s(?:second|s)\b)"
         r"|\s?samples?/s\b)")
FIGURE = re.compile(
    _NUMBER + _UNIT
    # A point difference or an accuracy set against another: "+0.3", "0.706 against 0.829".
    + r"|(?<![\w.`=])[+-]\d+\.\d+\b"
    + r"|(?<![\w.`=])\d+\.\d+\s+against\b")
# Literals (``communication_window=12``) are settings, not measurements.
LITERAL = re.compile(r"``.*?``", re.S)
DOCS_PATH = re.compile(r"(?<![\w./~-])docs/[\w./-]*\w")


def notes_sections(docstring):
    """The body of each ``Notes:`` section of a (cleaned) docstring, as lists of lines:
    the lines indented under the header, to the next line at or left of it."""
    lines = docstring.splitlines()
    sections = []
    for index, line in enumerate(lines):
        header = SECTION.match(line)
        if not header:
            continue
        indent = len(header.group(1))
        body = []
        for following in lines[index + 1:]:
            if following.strip() and len(following) - len(following.lstrip()) <= indent:
                break
            body.append(following)
        sections.append(body)
    return sections


def notes_problems(docstring, root=ROOT):
    """What is wrong with a docstring's Notes sections, one message each (empty: none)."""
    problems = []
    for body in notes_sections(docstring):
        text = "\n".join(body)
        lines = [line for line in body if line.strip()]
        if len(lines) > MAX_NOTES_LINES:
            problems.append(f"Notes of {len(lines)} lines (at most {MAX_NOTES_LINES}; the "
                            f"evidence goes on its docs/ page)")
        figures = [match.group(0).strip() for match in FIGURE.finditer(LITERAL.sub("", text))]
        if figures:
            problems.append(f"measured figures in Notes: {figures} (move them to its docs/ "
                            f"page and cite the page)")
        dead = [path for path in DOCS_PATH.findall(text)
                if not (pathlib.Path(root) / path.rstrip(".")).exists()]
        if dead:
            problems.append(f"Notes cite docs paths that do not exist: {dead}")
    return problems


def docstrings(path):
    """``(name, line, docstring)`` of every module, class and function docstring of a
    Python file."""
    tree = ast.parse(pathlib.Path(path).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=True)
            if docstring:
                yield getattr(node, "name", "<module>"), getattr(node, "lineno", 1), docstring


def package_problems(root=ROOT):
    """``"path:line name: problem"`` for every docstring under ``root/distkeras``."""
    found = []
    for path in sorted((pathlib.Path(root) / "distkeras").rglob("*.py")):
        for name, line, docstring in docstrings(path):
            found += [f"{os.path.relpath(path, root)}:{line} {name}: {problem}"
                      for problem in notes_problems(docstring, root)]
    return found


def test_every_docstring_notes_section_is_short_and_free_of_measurements():
    sections = sum(len(notes_sections(docstring))
                   for path in (ROOT / "distkeras").rglob("*.py")
                   for _, _, docstring in docstrings(path))
    assert sections >= 15  # the scan sees the package's Notes sections
    problems = package_problems()
    assert not problems, "docstring Notes to shorten:\n" + "\n".join(problems)


def _docstring(notes):
    return "Does one thing.\n\nArgs:\n    x: A thing.\n\nNotes:\n" + "".join(
        f"    {line}\n" for line in notes)


def test_a_long_notes_section_fails():
    problems = notes_problems(_docstring(["Why, at length."] * 6))
    assert len(problems) == 1 and "6 lines" in problems[0]
    assert notes_problems(_docstring(["Why, at length."] * 5 + [""] * 3)) == []


@pytest.mark.parametrize("figure", [
    "2 workers left the zoo's models 4-27 points below `fit`.",
    "The ViT and Embedding model stayed 2.8 and 1.8 points below `fit` (3 seeds).",
    "Twice the rate left them +0.3 and -0.8.",
    "A momentum of 0.9 scored 0.706 against 0.829.",
    "For a 40 MB commit that is more CPU than the copy itself.",
    "It ran at 1.99x the samples per second of one worker.",
    "Epochs take 14.76 s, against 21.21 s.",
    "The server answered 95% of pulls at once.",
    "One worker trains 5,400 samples/s.",
    "Validating costs 120 ms per epoch.",
    "A 1 Gbit/s link stops first.",
])
def test_a_measured_figure_in_notes_fails(figure):
    problems = notes_problems(_docstring([figure]))
    assert len(problems) == 1 and "measured figures" in problems[0], problems


def test_notes_of_reasons_settings_and_names_pass(tmp_path):
    (tmp_path / "docs" / "algorithms").mkdir(parents=True)
    (tmp_path / "docs" / "algorithms" / "adag.md").write_text("# ADAG\n")
    notes = ["The original's window of 12 suits 12 or more workers (Hermans 2017 ran 20",
             "to 40); with k workers a commit is overtaken by k - 1 others, 1/k each.",
             "Python 3.10's counts differ; ``window=12`` and ``0.5`` are settings; the",
             "momentum, 0.9, overshoots; the window is at most 5. Under 5 works best.",
             "See docs/algorithms/adag.md."]
    assert notes_problems(_docstring(notes), tmp_path) == []


def test_notes_citing_a_missing_docs_page_fail(tmp_path):
    problems = notes_problems(_docstring(["See docs/algorithms/gone.md."]), tmp_path)
    assert problems == ["Notes cite docs paths that do not exist: ['docs/algorithms/gone.md']"]


def test_the_package_check_reports_a_bad_module(tmp_path):
    package = tmp_path / "distkeras"
    package.mkdir()
    (package / "bad.py").write_text(
        'def f():\n    """Does it.\n\n    Notes:\n        Faster by 12% here.\n    """\n')
    assert package_problems(tmp_path) == [
        "distkeras/bad.py:1 f: measured figures in Notes: ['12%'] (move them to its docs/ "
        "page and cite the page)"]
