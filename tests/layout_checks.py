"""What the layout tests check of a module's source (no import of the module)."""

import ast
import os


def module_name(path):
    """The dotted name of the distkeras module at ``path`` (``distkeras.training.run``), or
    None for a file outside a ``distkeras`` folder."""
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    if "distkeras" not in parts:
        return None
    start = len(parts) - 1 - parts[::-1].index("distkeras")
    name = ".".join(parts[start:])[:-len(".py")]
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


def private_names_taken_from_other_modules(path):
    """``(line, text)`` of each private name this module imports from, or reads off,
    another distkeras module (its own, imported by name inside a function so that Spark's
    pickled closures find it, is not another's)."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    own = module_name(path)
    found, module_names = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("distkeras"):
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append((node.lineno, f"from {node.module} import {alias.name}"))
                elif f"{node.module}.{alias.name}" != own:
                    module_names.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            module_names.update(alias.asname or alias.name.split(".")[0]
                                for alias in node.names if alias.name.startswith("distkeras"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                node.value.id in module_names and node.attr.startswith("_") and \
                not node.attr.startswith("__"):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return found
