"""The code blocks of README.md and the docs pages, for tests that run them as printed
(and fail when a page rots)."""

import glob
import os

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)
README = os.path.join(ROOT, "README.md")


def documentation_pages():
    """README.md, then every Markdown page under docs/, in a fixed order."""
    pages = sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    return [README] + pages


def section_blocks(lines, start, language="python"):
    """The code of the fenced ``language`` blocks from line ``start`` of a Markdown page's
    ``lines`` up to its next ``## `` title line."""
    end = next((number for number in range(start, len(lines))
                if lines[number].startswith("## ")), len(lines))
    blocks, block = [], None
    for line in lines[start:end]:
        if block is None and line.strip() == f"```{language}":
            block = []
        elif block is not None and line.strip() == "```":
            blocks.append("\n".join(block) + "\n")
            block = None
        elif block is not None:
            block.append(line)
    return blocks


def find_section(heading):
    """The page holding the section ``## heading`` and that page's lines.

    Looks in README.md, then in the pages under docs/. A heading must be on one page
    only, so that a block is never read from the wrong one.
    """
    title = f"## {heading}"
    found = []
    for page in documentation_pages():
        with open(page, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
        if title in lines:
            found.append((page, lines))
    names = [os.path.relpath(page, ROOT) for page, _ in found]
    assert found, f"neither README.md nor a page under docs/ has a section {title!r}"
    assert len(found) == 1, f"the section {title!r} is on several pages: {names}"
    return found[0]


def readme_block(heading, language="python", index=0):
    """The code of the ``index``-th fenced ``language`` block in the section ``heading``
    (its ``## heading`` line up to the next ``## `` line) of README.md or a docs page."""
    page, lines = find_section(heading)
    title = f"## {heading}"
    name = os.path.relpath(page, ROOT)
    blocks = section_blocks(lines, lines.index(title) + 1, language)
    assert len(blocks) > index, (f"{name}'s section {title!r} has {len(blocks)} "
                                 f"```{language} blocks; expected more than {index}")
    return blocks[index]


def run_as_main(code, **names):
    """Runs ``code`` as a reader pasting it into a script or a notebook would: in a
    ``__main__`` namespace holding ``names``; returns the namespace."""
    namespace = {"__name__": "__main__", **names}
    exec(compile(code, README, "exec"), namespace)
    return namespace
