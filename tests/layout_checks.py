"""What the layout tests check of a module's source (no import of the module)."""

import ast


def private_names_taken_from_other_modules(path):
    """``(line, text)`` of each private name this module imports from, or reads off,
    another distkeras module."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    found, module_names = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("distkeras"):
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append((node.lineno, f"from {node.module} import {alias.name}"))
                else:
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
