"""The trainers are built from parts, not chains (issue #46): every public trainer is at
most 4 distkeras classes deep, no ``__init__`` is built at run time, the plans never call
back into the trainer, and a built-in algorithm is registered once, in its own file."""

import ast
import glob
import inspect
import os

import pytest
from conftest import build_mlp

from distkeras import algorithms, trainers
from distkeras.algorithms import Algorithm, Hyperparameter
from distkeras.training import registry
from distkeras.algorithms.arguments import check_number

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
MAX_DEPTH = 4


def distkeras_depth(cls):
    """The classes in ``cls.__mro__`` whose module is distkeras's."""
    return [k.__name__ for k in cls.__mro__ if k.__module__.startswith("distkeras")]


def runtime_built_init(cls):
    """Why ``cls.__init__`` looks built at run time (a closure, an exec'd function, a
    signature set by hand), or None: it must be a method written in a class's body."""
    init = cls.__init__
    if init is object.__init__:
        return None
    code = getattr(init, "__code__", None)
    if code is None or not os.path.isfile(code.co_filename):
        return f"{cls.__name__}.__init__ has no source file"
    if "__signature__" in vars(init):
        return f"{cls.__name__}.__init__ carries a hand-made __signature__"
    owners = [k.__name__ for k in cls.__mro__ if vars(k).get("__init__") is init]
    if init.__qualname__ != f"{owners[0]}.__init__":
        return f"{cls.__name__}.__init__ is {init.__qualname__}, not a method of a class body"
    return None


def public_trainers():
    classes = {name: getattr(trainers, name) for name in trainers.__all__}
    classes.update(registry.trainer_classes())
    return {name: cls for name, cls in classes.items()
            if inspect.isclass(cls) and issubclass(cls, trainers.Trainer)}


@pytest.mark.parametrize("name", sorted(public_trainers()))
def test_every_public_trainer_is_at_most_4_classes_deep(name):
    cls = public_trainers()[name]
    assert len(distkeras_depth(cls)) <= MAX_DEPTH, distkeras_depth(cls)


@pytest.mark.parametrize("name", sorted(public_trainers()))
def test_no_trainer_has_an_init_built_at_run_time(name):
    assert runtime_built_init(public_trainers()[name]) is None


def test_the_structure_checks_can_fail():
    """A chain of mixins and an ``__init__`` made by a function are what they refuse."""
    mixin = type("Accessors", (), {"__module__": "distkeras.compat"})
    deep = type("Deep", (trainers.ADAG, mixin), {"__module__": "distkeras.trainers"})
    assert len(distkeras_depth(deep)) == MAX_DEPTH + 2

    def make_init():
        def __init__(self, keras_model):
            trainers.SingleTrainer.__init__(self, keras_model)
        return __init__

    built = type("Built", (trainers.SingleTrainer,), {"__init__": make_init()})
    assert "not a method of a class body" in runtime_built_init(built)
    namespace = {}
    exec("def __init__(self):\n    pass\n", namespace)  # as dataclasses make theirs
    assert "no source file" in runtime_built_init(
        type("Exec", (trainers.SingleTrainer,), {"__init__": namespace["__init__"]}))
    init = make_init()
    init.__qualname__ = "Signed.__init__"
    init.__signature__ = inspect.signature(init)
    assert "__signature__" in runtime_built_init(
        type("Signed", (trainers.SingleTrainer,), {"__init__": init}))


def test_explicit_constructors_take_the_declared_hyperparameters_after_the_window():
    """A trainer whose hyperparameters dist-keras passed by position writes its signature
    out; it must say what the algorithm declares, in the declared order."""
    for name, algorithm in algorithms.registered().items():
        parameters = inspect.signature(getattr(trainers, name).__init__).parameters
        declared = [(p.name, p.default) for p in algorithm.hyperparameters]
        if not declared or "hyperparameters" in parameters:
            continue  # keyword arguments of the generic constructor
        names = list(parameters)
        window = names.index("communication_window")
        assert [(n, parameters[n].default) for n in names[window + 1:window + 1 +
                len(declared)]] == declared, name


@pytest.mark.parametrize("module", ["plans", "parameter_server", "one_task", "averaging",
                                    "ensemble", "run"])
def test_the_plans_never_call_back_into_the_trainer(module):
    """A plan gets its parts (a worker factory, a server factory) and never holds the
    trainer: no ``trainer`` name or attribute in its module."""
    with open(os.path.join(ROOT, "distkeras", "training", f"{module}.py"),
              encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)} | \
        {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert not {"trainer", "allocate_worker", "allocate_parameter_server"} & used


@pytest.mark.parametrize("path", sorted(glob.glob(
    os.path.join(ROOT, "distkeras", "algorithms", "*.py"))))
def test_no_algorithm_class_over_300_lines(path):
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            assert node.end_lineno - node.lineno + 1 <= 300, node.name


def test_adds_commits_as_sent_is_whether_apply_is_the_base_one():
    for name, algorithm in algorithms.registered().items():
        assert algorithm.adds_commits_as_sent is (algorithm.apply is Algorithm.apply), name
        assert algorithm().adds_commits_as_sent is algorithm.adds_commits_as_sent
    assert {name for name, algorithm in algorithms.registered().items()
            if algorithm.adds_commits_as_sent} == {"DOWNPOUR", "ADAG", "AEASGD", "EAMSGD"}


class ToyStep(Algorithm):
    """A toy built-in (this test registers it): commits ``fraction`` of the change."""

    hyperparameters = (Hyperparameter("fraction", 0.5, check_number, "of the change"),)

    default_window = 3

    def commit(self, weights, pulled, context):
        return self.fraction * (weights - pulled)


@pytest.fixture
def toy_registered():
    algorithms.register(ToyStep)
    try:
        yield ToyStep
    finally:
        algorithms.unregister("ToyStep")


def test_a_registered_algorithm_is_a_trainer_by_every_name_without_other_edits(
        toy_registered):
    """One registration (what a built-in's file does) makes the trainer class, its name in
    the registry, the package's export and the command line's options."""
    import distkeras
    from distkeras import cli

    cls = registry.get_trainer_class("ToyStep")
    assert cls is trainers.ToyStep is distkeras.ToyStep and cls.algorithm is ToyStep
    assert "ToyStep" in distkeras.__all__
    assert len(distkeras_depth(cls)) <= MAX_DEPTH and runtime_built_init(cls) is None
    assert cli.trainer_options(cls)["fraction"] == 0.5
    trainer = cls(build_mlp(8), "adam", "categorical_crossentropy", fraction=0.25)
    assert trainer.communication_window == 3 and trainer.get_config()["fraction"] == 0.25
    assert type(trainer).from_config(trainer.get_config(), build_mlp(8)).fraction == 0.25
    with pytest.raises(TypeError, match="unexpected keyword argument 'fractoin'"):
        cls(build_mlp(8), fractoin=0.25)
    with pytest.raises(ValueError, match="fraction"):
        cls(build_mlp(8), "adam", "mse", fraction="half").validate_arguments()


def test_an_unregistered_name_is_no_trainer():
    with pytest.raises(ValueError, match="Unknown trainer 'ToyStep'"):
        registry.get_trainer_class("ToyStep")
    assert not hasattr(trainers, "ToyStep")


@pytest.mark.spark
def test_a_registered_toy_algorithm_trains_by_name_through_the_registry(
        toy_registered, fashion_train):
    cls = registry.get_trainer_class("ToyStep")
    trainer = cls(build_mlp(16), "adam", "categorical_crossentropy", num_workers=2,
                  batch_size=32, fraction=0.5)
    model = trainer.train(fashion_train.limit(256), verbose=0)
    server = trainer.parameter_server
    assert model.compiled and isinstance(server.algorithm, ToyStep)
    assert server.algorithm.fraction == 0.5 and trainer.num_updates() > 0
    assert sum(record["batch_size"] for record in trainer.get_history()) == 256


@pytest.mark.parametrize("name", sorted(algorithms.registered()))
def test_help_shows_each_trainers_own_arguments(name):
    """``help(ADAG)`` shows the arguments it takes by name, never ``**hyperparameters``."""
    cls = getattr(trainers, name)
    parameters = inspect.signature(cls).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    assert "self" not in parameters
    for hyperparameter in cls.algorithm.hyperparameters:
        assert parameters[hyperparameter.name].default == hyperparameter.default
    for name_ in ("keras_model", "num_workers", "communication_window"):
        assert name_ in parameters
    # The signature is the one the constructor honours: every name binds.
    inspect.signature(cls).bind(None, **{p: parameters[p].default for p in parameters
                                         if p != "keras_model"})
