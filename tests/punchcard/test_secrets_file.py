"""Secrets and tokens: compared in constant time everywhere, and the checker's answers.

`==` on a secret returns as soon as a character differs, so its time tells a client how
much of a guess was right; `hmac.compare_digest` takes the same time whatever matched. No
behavioural test can see the difference, so a static check reads every comparison in the
library.
"""

import ast
import pathlib
import re

import pytest

import distkeras
from distkeras.transport import networking
from distkeras.punchcard.secrets_file import SecretChecker, generate_secret, make_entry, secret_hash

PACKAGE = pathlib.Path(distkeras.__file__).parent
# Names of values that hold, or are derived from, a secret.
SENSITIVE = re.compile(r"secret|token|digest|password|passwd|signature|hmac|credential",
                       re.IGNORECASE)
# Calls whose result tells nothing of the value's characters.
HARMLESS_CALLS = {"len", "type", "isinstance", "bool", "id"}


def operand_names(node):
    """The names an operand of a comparison reads its value from: ``token``,
    ``self.token``, ``data["token"]``, ``offered.encode()``, ``str(token)``,
    ``secret_hash(offered)``; not what a harmless call (``len(token)``) reads."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr, *operand_names(node.value)]
    if isinstance(node, ast.Subscript):
        key = node.slice
        keys = [key.value] if isinstance(key, ast.Constant) and isinstance(key.value, str) \
            else []
        return keys + operand_names(node.value)
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute):  # a method of the value: .encode(), .lower()
            return operand_names(node.func.value)
        if isinstance(node.func, ast.Name) and node.func.id not in HARMLESS_CALLS:
            return [node.func.id, *(name for argument in node.args
                                    for name in operand_names(argument))]
    return []


def plain_comparisons_of_secrets(source):
    """``(line, code)`` of each ``==`` or ``!=`` in ``source`` with an operand named like
    a secret (`SENSITIVE`), other than one against None, a bool or a number."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare) or \
                not any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
            continue
        operands = [node.left, *node.comparators]
        if any(isinstance(operand, ast.Constant) and not isinstance(operand.value, (str, bytes))
               for operand in operands):
            continue
        if any(SENSITIVE.search(name) for operand in operands
               for name in operand_names(operand)):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_every_secret_and_token_is_compared_in_constant_time():
    plain = [f"{path.relative_to(PACKAGE.parent)}:{line}: {code}"
             for path in sorted(PACKAGE.rglob("*.py"))
             for line, code in plain_comparisons_of_secrets(path.read_text(encoding="utf-8"))]
    assert plain == [], "compare secrets with hmac.compare_digest:\n" + "\n".join(plain)


@pytest.mark.parametrize("code", [
    "offered == token",
    "token != offered",
    "self.token == message['token']",
    "message.get('token') == self.token",
    "offered.encode('utf-8') != token.encode('utf-8')",
    "digest == known",
    "secret_hash(offered) == known_hash",
    "str(secret) == other",
    "data['secret_sha256'] == value",
    "a == b == password",
    "token == ''",
])
def test_the_static_check_sees_a_plain_comparison(code):
    assert [line for line, _ in plain_comparisons_of_secrets(code)] == [1]


@pytest.mark.parametrize("code", [
    "hmac.compare_digest(offered, token)",
    "len(digest) != 64",
    "token is None",
    "token == None",
    "count == 3",
    "secret_hash in validating",
    "action == ACTION_PULL",
])
def test_the_static_check_leaves_comparisons_that_reveal_nothing(code):
    assert plain_comparisons_of_secrets(code) == []


def test_the_checker_identifies_clear_and_hashed_secrets_and_nothing_else():
    clear, hashed, other = generate_secret(), generate_secret(), generate_secret()
    entries = [make_entry("alice", clear), make_entry("bob", hashed, hashed=True)]
    known = [(secret_hash(entry["secret"]), entry["identity"]) if "secret" in entry
             else (entry["secret_sha256"], entry["identity"]) for entry in entries]
    checker = SecretChecker(known)
    assert checker.identify(clear) == (secret_hash(clear), "alice")
    assert checker.identify(hashed) == (secret_hash(hashed), "bob")
    for wrong in (other, clear[:-1], clear + "x", "", None, 42, secret_hash(clear)):
        assert checker.identify(wrong) is None


def test_a_wrong_or_missing_token_is_refused():
    token = generate_secret()
    assert networking.check_token({"token": token, "worker_id": 3}, token) == 3
    for message in ({"token": token[:-1] + "?"}, {"token": token + "x"}, {"token": None},
                    {}, {"token": token.encode()}, {"token": "\ud800"}):
        with pytest.raises(networking.ProtocolError, match="Wrong or missing token"):
            networking.check_token(message, token)
