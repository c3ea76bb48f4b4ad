"""The training path's layout (issue #34): `distkeras.trainers` is a thin face over
`distkeras.training`, no module there takes another module's private names, and no module
or class there is too long to read. No Spark started."""

import ast
import glob
import os

import pytest
from layout_checks import private_names_taken_from_other_modules

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
TRAINING_PATH = sorted(glob.glob(os.path.join(ROOT, "distkeras", "training", "*.py"))) + [
    os.path.join(ROOT, "distkeras", name) for name in
    ("trainers.py", os.path.join("executor", "epochs.py"),
     os.path.join("ml", "estimators.py"))]
IDS = [os.path.relpath(path, ROOT) for path in TRAINING_PATH]


@pytest.mark.parametrize("path", TRAINING_PATH, ids=IDS)
def test_no_module_takes_another_modules_private_names(path):
    assert private_names_taken_from_other_modules(path) == []


@pytest.mark.parametrize("path", TRAINING_PATH, ids=IDS)
def test_no_module_over_600_lines_nor_class_over_300(path):
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    assert source.count("\n") <= 600
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            assert node.end_lineno - node.lineno + 1 <= 300, node.name


def test_the_trainers_face_gives_the_training_packages_classes():
    from distkeras import trainers
    from distkeras.training import asynchronous, sequential, trainer

    assert trainers.Trainer is trainer.Trainer
    assert trainers.SingleTrainer is sequential.SingleTrainer
    assert trainers.AsynchronousDistributedTrainer is \
        asynchronous.AsynchronousDistributedTrainer
    assert issubclass(trainers.ADAG, trainers.AlgorithmTrainer)
    # Neither the base class nor a run's sequence names a subclass: what a run can do is
    # its plan's declaration (`plans.Plan`), not a test of the trainer's class.
    subclasses = ("SingleTrainer", "AveragingTrainer", "EnsembleTrainer",
                  "AsynchronousDistributedTrainer", "DistributedTrainer")
    for module in ("trainer.py", "driver.py", "plans.py", "run.py"):
        with open(os.path.join(ROOT, "distkeras", "training", module),
                  encoding="utf-8") as handle:
            names = {node.id for node in ast.walk(ast.parse(handle.read()))
                     if isinstance(node, ast.Name)}
        assert not names & set(subclasses), module
