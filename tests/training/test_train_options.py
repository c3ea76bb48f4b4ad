"""The train options that travel as JSON (CLI, Punchcard): checked by type and range."""

import pytest

from distkeras.training.options import normalize


def test_defaults_and_typed_values():
    assert normalize(None) == {"shuffle": False, "validation": None,
                               "sample_weight_col": None, "class_weight": None}
    options = normalize({"shuffle": True, "validation": 0.25, "sample_weight_col": "w",
                         "class_weight": {"0": 1, "3": 2.5}})
    assert options == {"shuffle": True, "validation": 0.25, "sample_weight_col": "w",
                       "class_weight": {0: 1.0, 3: 2.5}}
    assert normalize({"validation": "hdfs:///data/val"})["validation"] == "hdfs:///data/val"


def test_a_validation_path_goes_through_the_given_check():
    def refuse(path):
        raise ValueError(f"not under the allowed roots: {path}")

    with pytest.raises(ValueError, match="not under the allowed roots: /etc"):
        normalize({"validation": "/etc"}, check_path=refuse)


@pytest.mark.parametrize("options, message", [
    ([], "must be a JSON object"),
    ({"epochs": 3}, "Unknown train options: epochs"),
    ({"shuffle": "yes"}, "'shuffle' must be true or false"),
    ({"validation": 1.0}, "'validation' must be a fraction"),
    ({"validation": True}, "'validation' must be a fraction"),
    ({"sample_weight_col": "w; DROP"}, "'sample_weight_col' must be a column name"),
    # A pattern ending in `$` lets a trailing newline through, to a job that then fails.
    ({"sample_weight_col": "w\n"}, "'sample_weight_col' must be a column name"),
    ({"class_weight": {}}, "non-empty object"),
    ({"class_weight": {"-1": 2}}, "keys must be class indices"),
    ({"class_weight": {"1": "2"}}, "of class 1 must be a number"),
    # What train() itself refuses, refused here too: before Spark starts, or the job runs.
    ({"class_weight": {"1": float("nan")}}, "of class 1 must be a number >= 0"),
    ({"class_weight": {"1": float("inf")}}, "of class 1 must be a number >= 0"),
    ({"class_weight": {"1": -5}}, "of class 1 must be a number >= 0"),
    ({"class_weight": {"\u00b2": 2}}, "keys must be class indices"),
])
def test_bad_options_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        normalize(options)
