"""The refusals a Punchcard submission meets both in the server's request thread
(`submissions`) and in its `model_check` child process (`keras_checks`): `BadRequest`,
the trainer's registered name, and the model archive's size and configuration (read as
JSON, `config_scan`).
"""

import base64
import io
import zipfile

from distkeras.errors import DistkerasError
from distkeras.punchcard import config_scan
from distkeras.training.registry import get_trainer_class
from distkeras.training.sequential import EnsembleTrainer


class BadRequest(DistkerasError, ValueError):
    """A malformed submission (HTTP 400)."""


def registered_trainer_class(name):
    """The registered trainer class ``name``, refused if unknown or an ensemble."""
    try:
        trainer_class = get_trainer_class(name)
    except ValueError as error:
        raise BadRequest(str(error)) from error
    if issubclass(trainer_class, EnsembleTrainer):
        raise BadRequest(f"{name} trains several models, and a Punchcard job "
                         "returns one: train an ensemble from Python with your own Spark "
                         "session, or submit another trainer.")
    return trainer_class


def scan_configs(model_bytes, trainer_config, registered=None):
    """Refuses code references and oversized state in the archive's config.json and the
    trainer's config (`config_scan`), before Keras reads either."""
    try:
        config_scan.scan(config_scan.read_config(model_bytes), registered, archive=True)
    except config_scan.ConfigRefused as error:
        raise BadRequest(f"The model archive was refused: {error}") from error
    for field, value in trainer_config.items():
        try:
            config_scan.scan(value, registered, f"'{field}'")
        except config_scan.ConfigRefused as error:
            raise BadRequest(f"Bad trainer configuration: {error}") from error


def decode_model(text):
    """The model archive of a submission's ``model`` field."""
    if not text:
        raise BadRequest("'model' is required: a base64 .keras archive.")
    try:
        data = base64.b64decode(text, validate=True)
    except (ValueError, TypeError) as error:
        raise BadRequest("'model' must be a base64 .keras archive: it is not valid "
                         "base64.") from error
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise BadRequest("'model' must be a base64 .keras archive: it decodes to "
                         f"{len(data)} bytes that are not a zip file.")
    _check_unpacked_size(data)
    return data


# Keras stores an archive's files uncompressed: what they unpack to is about what travelled.
# More than this many times the archive (past a floor) is a decompression bomb, which Keras
# would read into this server's memory as it loads the model (its own guard starts at 4 GiB).
MAX_ARCHIVE_EXPANSION = 10
ARCHIVE_EXPANSION_FLOOR = 64 << 20


def unpack_limit(data):
    """The most bytes this server unpacks, or builds weights of, for the archive ``data``."""
    return max(ARCHIVE_EXPANSION_FLOOR, MAX_ARCHIVE_EXPANSION * len(data))


def _check_unpacked_size(data):
    """Refuses an archive whose files declare far more bytes than it holds."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, ValueError) as error:
        raise BadRequest(f"'model' must be a base64 .keras archive: {error}") from error
    limit = unpack_limit(data)
    if unpacked > limit:
        raise BadRequest(
            f"The model archive was refused: its {len(data)} bytes declare {unpacked} bytes "
            f"of files, more than this server unpacks ({limit}). Send the archive as "
            "keras.saving.save_model writes it.")
