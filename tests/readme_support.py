"""The README's code blocks, for tests that run them as printed (and fail when it rots)."""

import os

README = os.path.join(os.path.dirname(__file__), os.pardir, "README.md")


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


def readme_block(heading, language="python", index=0):
    """The code of the ``index``-th fenced ``language`` block in the README's section
    ``heading`` (its ``## heading`` line up to the next ``## `` line)."""
    with open(README, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    title = f"## {heading}"
    assert title in lines, f"README.md has no section {title!r}"
    blocks = section_blocks(lines, lines.index(title) + 1, language)
    assert len(blocks) > index, (f"README.md's section {title!r} has {len(blocks)} "
                                 f"```{language} blocks; expected more than {index}")
    return blocks[index]


def run_as_main(code, **names):
    """Runs ``code`` as a reader pasting it into a script or a notebook would: in a
    ``__main__`` namespace holding ``names``; returns the namespace."""
    namespace = {"__name__": "__main__", **names}
    exec(compile(code, README, "exec"), namespace)
    return namespace
