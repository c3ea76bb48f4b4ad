"""docs/writing-an-algorithm.md's tutorial, and docs/optimizers.md's usage block and
staleness block, run as printed, and the defaults the algorithms page states are the
code's."""

import glob
import inspect
import os
import re

import pytest
from conftest import accuracy, build_mlp
from readme_support import section_blocks

DOCS = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "docs")
DOC = os.path.join(DOCS, "optimizers.md")
TUTORIAL = os.path.join(DOCS, "writing-an-algorithm.md")
MARKER = "<!-- tutorial -->"
ALGORITHM_MARKER = "<!-- algorithm-tutorial -->"


def read_doc(path=DOC):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def tutorial_code(text, marker=MARKER):
    """The fenced ```python block on the line right after the ``marker`` line."""
    lines = text.splitlines()
    starts = [index for index, line in enumerate(lines) if line.strip() == marker]
    assert len(starts) == 1, f"expected one {marker} marker, found {len(starts)}"
    start = starts[0] + 1
    assert lines[start].strip() == "```python", "the marker must precede a ```python block"
    end = lines.index("```", start + 1)
    return "\n".join(lines[start + 1:end]) + "\n"


def test_tutorial_block_is_found():
    code = tutorial_code(read_doc(TUTORIAL))
    assert "class HalfStepWorker(NetworkWorker)" in code
    assert code.rstrip().endswith("model = trainer.train(dataframe)")


@pytest.mark.spark
def test_tutorial_runs_as_printed(spark, fashion_train, fashion_test):
    import keras

    from distkeras.parameter_servers import SocketParameterServer

    code = tutorial_code(read_doc(TUTORIAL))
    # As a reader pasting the block into a notebook or a script: its classes belong to
    # __main__, which Spark's cloudpickle ships to the executors by value.
    namespace = {"__name__": "__main__", "spark": spark,
                 "dataframe": fashion_train.limit(2000)}
    exec(compile(code, TUTORIAL, "exec"), namespace)

    model = namespace["model"]
    assert isinstance(model, keras.Model)
    assert model.compiled
    assert accuracy(model, fashion_test) > 0.5

    servers = [value for value in namespace.values()
               if isinstance(value, type) and issubclass(value, SocketParameterServer)
               and value.__module__ == "__main__"]
    assert len(servers) == 1
    trainer = namespace["trainer"]
    assert type(trainer.parameter_server) is servers[0]
    assert trainer.parameter_server.num_updates > 0
    assert len(trainer.get_staleness()) == trainer.parameter_server.num_updates
    # Every step was trained and reported: 1,000 rows per worker, num_epoch passes.
    rows = sum(record["batch_size"] for record in trainer.get_history())
    assert rows == 2000 * trainer.num_epoch


@pytest.mark.spark
def test_algorithm_tutorial_runs_as_printed(spark, fashion_train, fashion_test):
    import keras

    from distkeras.algorithms import Algorithm
    from distkeras.transport.parameter_servers import AlgorithmServer
    from distkeras.trainers import AlgorithmTrainer

    code = tutorial_code(read_doc(TUTORIAL), ALGORITHM_MARKER)
    namespace = {"__name__": "__main__", "spark": spark,
                 "dataframe": fashion_train.limit(2000)}
    exec(compile(code, TUTORIAL, "exec"), namespace)

    model, trainer = namespace["model"], namespace["trainer"]
    assert isinstance(model, keras.Model) and model.compiled
    assert accuracy(model, fashion_test) > 0.5
    algorithm = namespace["HalfStep"]
    assert issubclass(algorithm, Algorithm) and isinstance(trainer, AlgorithmTrainer)
    server = trainer.parameter_server
    assert type(server) is AlgorithmServer and isinstance(server.algorithm, algorithm)
    assert server.algorithm.fraction == 0.5 and trainer.communication_window == 4
    assert server.num_updates > 0
    assert len(trainer.get_staleness()) == server.num_updates
    rows = sum(record["batch_size"] for record in trainer.get_history())
    assert rows == 2000 * trainer.num_epoch


def test_the_algorithm_block_of_the_overview_is_the_rule_it_states():
    import numpy as np

    from distkeras.transport.networking import weights_array
    from distkeras.trainers import AlgorithmTrainer

    (block,) = doc_section_blocks(read_doc(), "## Write your own optimizer")
    namespace = {"__name__": "__main__"}
    exec(compile(block, DOC, "exec"), namespace)
    rule = namespace["HalfStep"]()
    pulled = weights_array([np.array([1.0, 2.0], np.float32)])
    weights = weights_array([np.array([2.0, 0.0], np.float32)])
    update = rule.commit(weights, pulled, None)
    assert update[0].tolist() == [1.0, -2.0]
    assert rule.apply(pulled, update, None)[0].tolist() == [1.5, 1.0]
    assert issubclass(namespace["HalfStepTrainer"], AlgorithmTrainer)


def _summary_rows(text):
    """The "Summary" table: trainer name -> (window cell, other-defaults cell)."""
    section = text.split("## Summary", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] not in ("trainer", "---"):
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def test_stated_defaults_match_the_code():
    from distkeras import trainers

    rows = _summary_rows(read_doc())
    assert set(rows) == {"SingleTrainer", "AveragingTrainer", "EnsembleTrainer", "DOWNPOUR",
                         "ADAG", "DynSGD", "AEASGD", "EAMSGD", "Experimental", "DiLoCo",
                         "FedAdam", "AllReduceTrainer"}
    for name, (window, others) in rows.items():
        cls = getattr(trainers, name)
        if issubclass(cls, trainers.AsynchronousDistributedTrainer):
            if window.startswith("workers, at most "):  # ADAG's: min(num_workers, N)
                assert int(window.split()[-1]) == cls.default_window_for(10**6), name
                assert [cls.default_window_for(n) for n in (1, 2, 40)] == \
                    [1, 2, cls.default_window_for(10**6)], name
            else:
                assert int(window) == cls.default_window_for(10**6), name
                assert cls.default_window_for(40) == cls.default_window_for(10**6), name
        _check_defaults(cls, others, name)


def _check_defaults(cls, text, where):
    """Every ``name=value`` that ``text`` states in backticks is ``cls``'s default."""
    from distkeras import trainers

    parameters = inspect.signature(cls.__init__).parameters
    stated = re.findall(r"`(\w+)=([^`]+)`", text)
    for key, value in stated:
        if key == "communication_window":
            assert issubclass(cls, trainers.AsynchronousDistributedTrainer), where
            assert int(value) == cls.default_window_for(10**6), where
        else:
            assert key in parameters, (where, key)
            assert repr(parameters[key].default) == value, (where, key)
    return stated


def test_each_algorithm_page_states_the_code_defaults():
    from distkeras import trainers

    pages = sorted(glob.glob(os.path.join(os.path.dirname(DOC), "algorithms", "*.md")))
    assert len(pages) == 11
    for page in pages:
        text = read_doc(page)
        name = text.splitlines()[0].removeprefix("# ").strip()
        defaults = text.split("## Defaults", 1)[1].split("\n## ", 1)[0]
        cls = getattr(trainers, name)
        stated = _check_defaults(cls, defaults, page)
        if cls is not trainers.SingleTrainer:  # it has no parameters of its own
            assert stated, page


def doc_section_blocks(text, heading):
    """The fenced ```python blocks of the section under ``heading`` (a ``## `` title
    line, or None for the text before the first one)."""
    lines = text.splitlines()
    if heading is None:
        return section_blocks(lines, 0)
    assert heading in lines, f"docs/optimizers.md has no section {heading!r}"
    return section_blocks(lines, lines.index(heading) + 1)


@pytest.mark.spark
def test_usage_and_staleness_blocks_run_as_printed(spark, fashion_train, capsys):
    from collections import Counter

    import keras

    from distkeras.trainers import ADAG

    text = read_doc()
    (usage,) = doc_section_blocks(text, None)
    (staleness,) = doc_section_blocks(text, "## Staleness")
    # The one change: 2,000 rows. The page's blocks name `ADAG`, `mlp` and `dataframe`
    # as defined before them.
    namespace = {"__name__": "__main__", "ADAG": ADAG, "mlp": build_mlp(32),
                 "dataframe": fashion_train.limit(2000)}
    exec(compile(usage + staleness, DOC, "exec"), namespace)

    model, trainer = namespace["model"], namespace["trainer"]
    assert isinstance(model, keras.Model) and model.compiled
    pairs = namespace["staleness"]
    assert len(pairs) == trainer.parameter_server.num_updates > 0
    assert {worker for worker, _ in pairs} <= {0, 1}
    assert all(isinstance(lag, int) and lag >= 0 for _, lag in pairs)
    assert str(Counter(lag for _, lag in pairs)) in capsys.readouterr().out
