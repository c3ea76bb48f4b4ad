"""Each bad field of a Punchcard submission, refused alone with a message that names it.

Every case starts from a submission that `validate_submission` (the server's check of
every job it is sent) accepts, and changes one field, so a refusal is that field's. The
same checks answer over HTTP in tests/punchcard/test_punchcard_requests.py. No Spark.
"""

import base64
import re

import pytest

keras = pytest.importorskip("keras")

from conftest import build_mlp  # noqa: E402

from distkeras.job_deployment import Job  # noqa: E402
from distkeras.punchcard.submissions import BadRequest, validate_submission  # noqa: E402

SECRET = "s" * 64
SYSTEM = {"module": "os", "class_name": "function", "config": "system", "registered_name": None}


@pytest.fixture(scope="module")
def good():
    """A submission the server accepts: ADAG with an optimizer object (it travels as its
    Keras config)."""
    from distkeras.trainers import ADAG

    trainer = ADAG(keras_model=build_mlp(), worker_optimizer=keras.optimizers.SGD(0.05),
                   loss="categorical_crossentropy", metrics=["accuracy"], num_workers=2,
                   communication_window=4)
    payload = Job(SECRET, "ok", "hdfs:///data/fashion.parquet", 1, 1, trainer).payload()
    validate_submission(payload)
    return payload


def refusal(body):
    with pytest.raises(BadRequest) as refused:
        validate_submission(body)
    return str(refused.value)


@pytest.mark.parametrize("field, value, says", [
    ("job_name", "../../etc/passwd", "'job_name' must be 1-64 letters"),
    ("job_name", "a;rm -rf /", "'job_name' must be 1-64 letters"),
    ("job_name", "$(touch /tmp/pwned)", "'job_name' must be 1-64 letters"),
    ("job_name", "", "'job_name' must be 1-64 letters"),
    ("job_name", "x" * 65, "'job_name' must be 1-64 letters"),
    ("job_name", "abc\n", "'job_name' must be 1-64 letters"),
    ("job_name", None, "'job_name' must be 1-64 letters"),
    ("data_path", "/data/../../etc", "'data_path' must not contain '..'"),
    ("data_path", "/data/x\n--master", "'data_path' must not contain control characters"),
    ("data_path", 42, "'data_path' must be a non-empty string"),
    ("data_path", "", "'data_path' must be a non-empty string"),
    ("data_path", "--master=yarn", "'data_path' must not start with '-'"),
    ("num_executors", 0, r"'num_executors' must be an integer in 1\.\.1024. Received: 0"),
    ("num_executors", -1, "'num_executors' must be an integer"),
    ("num_executors", "2", "'num_executors' must be an integer"),
    ("num_executors", 10**6, "'num_executors' must be an integer"),
    ("num_executors", True, "'num_executors' must be an integer"),
    ("num_processes", 2.0, "'num_processes' must be an integer"),
    ("model", "not base64!", "'model' must be a base64 .keras archive: it is not valid base64"),
    ("model", base64.b64encode(b"PK\x03\x04garbage").decode(), "not a zip file"),
    ("model", base64.b64encode(b"hello").decode(), "decodes to 5 bytes that are not a zip"),
    ("model", None, "'model' is required"),
    ("trainer", "ADAG", r"'trainer' must be \{\"class_name\""),
    ("trainer", {"class_name": "os.system", "config": {}}, "Unknown trainer 'os.system'"),
    ("trainer", {"class_name": "ADAG", "config": {"no_such_argument": 1}},
     "unexpected keyword argument 'no_such_argument'"),
    ("train_options", {"validation": 2}, "'validation' must be a fraction"),
    ("train_options", {"validation": "/data/../etc"},
     "'train_options.validation' must not contain '..'"),
    ("train_options", {"class_weight": {"a": 1}}, "'class_weight' keys must be class indices"),
    ("train_options", {"sample_weight_col": "a;b"}, "'sample_weight_col' must be a column"),
    ("train_options", {"no_such_option": 1}, "Unknown train options: no_such_option"),
    ("train_options", "shuffle", "train options must be a JSON object"),
])
def test_a_bad_field_is_refused_naming_it(good, field, value, says):
    message = refusal({**good, field: value})
    assert re.search(says, message), message
    assert "/tmp" not in message or "/tmp" in repr(value)  # no server path in the answer


@pytest.mark.parametrize("change, says", [
    ({"communication_window": 0}, "`communication_window` must be an integer >= 1"),
    ({"loss": "categorical_crossentropyy"}, "`loss`: Keras does not know"),
    ({"worker_optimizer": "adamm"}, "`worker_optimizer`: Keras does not know 'adamm'"),
    ({"parallelism_factor": 10**6}, "'parallelism_factor' must be at most 64"),
    # A function outside the allow-list: refused by the config scan before Keras reads
    # it (nothing is imported), and the field is named.
    ({"loss": SYSTEM}, "'loss' refers to the function os.system"),
    ({"worker_optimizer": SYSTEM}, "'worker_optimizer' refers to the function os.system"),
    ({"metrics": ["accuracy", SYSTEM]}, "'metrics' refers to the function os.system"),
    # Configs Keras cannot rebuild: the field is named.
    ({"loss": 5}, "Keras cannot rebuild 'loss' from 5"),
    ({"worker_optimizer": {"class_name": "Adamm", "config": {}}},
     "Keras cannot rebuild 'worker_optimizer'"),
    ({"loss": {"out": {"class_name": "Nope", "config": {}}}}, "Keras cannot rebuild 'loss'"),
], ids=lambda case: "-".join(case) if isinstance(case, dict) else None)
def test_a_bad_trainer_setting_is_refused_naming_it(good, change, says):
    config = {**good["trainer"]["config"], **change}
    message = refusal({**good, "trainer": {"class_name": "ADAG", "config": config}})
    assert says in message, message


def test_a_trainer_of_several_models_is_refused():
    from distkeras.trainers import EnsembleTrainer

    payload = Job(SECRET, "ens", "hdfs:///data/fashion.parquet", 1, 1, EnsembleTrainer(
        build_mlp(), "adam", "categorical_crossentropy")).payload()
    assert "trains several models" in refusal(payload)
