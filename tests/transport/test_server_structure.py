"""The parameter servers stay flat: parts held, not chains of classes or hand-offs.

Issue 46's limits, measured on the real classes and on a real commit over a socket on
127.0.0.1: a server is at most 4 distkeras classes deep, has at most 6 forwarding
properties (seed 000's names), no class of the transport is over 300 lines, and a commit
reaches `Algorithm.apply` in at most 3 calls from the connection's handler.
"""

import ast
import inspect
import pathlib

import numpy as np
import pytest

from distkeras import parameter_servers as face
from distkeras.algorithms import Algorithm
from distkeras.transport import epoch_servers, parameter_servers
from ps_support import Client, make_model

MAX_DEPTH = 4
# Seed 000's names (and the address every trainer reads): the only properties of a server.
SEED_PROPERTIES = {"center_variable", "mutex", "num_updates", "port", "token", "history"}
MAX_CALLS_TO_APPLY = 3
MAX_CLASS_LINES = 300
TRANSPORT = pathlib.Path(parameter_servers.__file__).parent


def server_classes():
    """Every server class of the modules and of the dist-keras face."""
    classes = {value for module in (parameter_servers, epoch_servers, face)
               for value in vars(module).values()
               if isinstance(value, type) and issubclass(value, parameter_servers.ParameterServer)}
    assert len(classes) >= 11  # both modules' servers, the private epoch server among them
    return sorted(classes, key=lambda cls: cls.__name__)


def distkeras_depth(cls):
    """The classes of ``cls.__mro__`` that distkeras defines."""
    return [base for base in cls.__mro__ if base.__module__.startswith("distkeras")]


def forwarding_properties(cls):
    """Data descriptors (properties and the like) that the distkeras classes of ``cls``
    define: each reads or writes an attribute of a part."""
    return {name for base in distkeras_depth(cls) for name, value in vars(base).items()
            if not name.startswith("__") and hasattr(type(value), "__set__")}


@pytest.mark.parametrize("cls", server_classes(), ids=lambda cls: cls.__name__)
def test_a_server_is_at_most_four_distkeras_classes_deep(cls):
    depth = distkeras_depth(cls)
    assert len(depth) <= MAX_DEPTH, [base.__qualname__ for base in depth]


@pytest.mark.parametrize("cls", server_classes(), ids=lambda cls: cls.__name__)
def test_a_server_forwards_only_seed_names(cls):
    properties = forwarding_properties(cls)
    assert properties <= SEED_PROPERTIES, sorted(properties - SEED_PROPERTIES)
    assert len(properties) <= 6


def test_the_measures_see_a_deeper_server_and_another_property():
    """The two measures above fail where a server grows again."""
    class Deeper(parameter_servers.DeltaParameterServer):
        __module__ = "distkeras.probe"  # as if distkeras defined it
        errors = property(lambda server: server.transport.errors)

    assert len(distkeras_depth(Deeper)) == MAX_DEPTH + 1
    assert forwarding_properties(Deeper) == SEED_PROPERTIES | {"errors"}


def test_no_proxy_factories_are_left():
    for name in ("part_attribute", "part_method"):
        assert not hasattr(parameter_servers, name) and not hasattr(face, name)


def test_no_class_of_the_transport_is_over_300_lines():
    long = []
    for path in sorted(TRANSPORT.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    long.append(f"{path.name}:{node.name} ({lines} lines)")
    assert long == []


class RecordingRule(Algorithm):
    """``C += update``, by its own `apply`; records the call stack of each apply."""

    stacks = []

    def commit(self, weights, pulled, context):
        return weights - pulled

    def apply(self, center, update, context):
        type(self).stacks.append([frame.function for frame in inspect.stack()])
        return center + update


def calls_from_handler(stack, handler="_dispatch"):
    """The calls from the connection's handler (``handler``) to ``apply``, and the
    functions between them, innermost first."""
    assert stack[0] == "apply", stack
    index = stack.index(handler)
    return index, stack[1:index]


def commit_once(server_cls, **kwargs):
    RecordingRule.stacks = []
    server = server_cls(make_model(), 0, algorithm=RecordingRule(), **kwargs)
    server.start()
    try:
        client = Client(server, 0)
        client.commit([np.ones((3, 2), np.float32), np.ones(2, np.float32)])
        reply = client.pull()
        client.quit()
    finally:
        server.stop()
    assert reply["num_updates"] == 1 and server.transport.errors == []
    (stack,) = RecordingRule.stacks
    return calls_from_handler(stack)


def test_a_commit_reaches_apply_in_three_calls_from_the_connection_handler():
    calls, between = commit_once(parameter_servers.AlgorithmServer)
    assert calls <= MAX_CALLS_TO_APPLY, between
    assert between == ["handle_commit", "commit_action"]


def test_the_call_count_sees_one_more_hand_off():
    """The measure fails where a hand-off is added between the handler and the rule."""
    class HandingOff(parameter_servers.AlgorithmServer):
        def handle_commit(self, conn, addr):
            self._hand_off(conn, addr)

        def _hand_off(self, conn, addr):
            super().handle_commit(conn, addr)

    calls, between = commit_once(HandingOff)
    assert calls == MAX_CALLS_TO_APPLY + 2  # HandingOff.handle_commit, _hand_off
    assert between == ["handle_commit", "_hand_off", "handle_commit", "commit_action"]
