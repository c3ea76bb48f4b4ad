"""distkeras trainers as `pyspark.ml` pipeline stages.

`KerasEstimator` wraps any distkeras trainer; ``fit(dataframe)`` trains with it and returns
a `KerasModel`, a Transformer that adds the model's predictions with `ModelPredictor`. So
preprocessing, training and postprocessing run as one Pipeline::

    from pyspark.ml import Pipeline
    # train: a "features" column and a class index per row in "label_index"
    trainer = SingleTrainer(keras_model=mlp, worker_optimizer="adam",
                            loss="categorical_crossentropy", label_col="one_hot")
    pipeline = Pipeline(stages=[OneHotTransformer(10, "label_index", "one_hot"),
                                KerasEstimator(trainer),
                                LabelIndexTransformer(10)])
    fitted = pipeline.fit(train)              # trains the model
    fitted.transform(test)                    # + prediction, prediction_index
    fitted.save(path)                         # PipelineModel.load(path) reads it back

Both stages save and load with a Pipeline: the Params as Spark ML metadata, the Keras
model as a ``model.keras`` file in the stage's folder (read back with ``safe_mode=True``),
and, for the estimator, the trainer's class and ``get_config()``.
"""

import importlib
import logging

from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasPredictionCol, HasWeightCol
from pyspark.ml.util import (DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader,
                             MLWritable, MLWriter)

from distkeras.data import frame_checks
from distkeras.keras_io.archives import deserialize_model, serialize_model
from distkeras.keras_io.compile_config import serialize_keras_object, with_learning_rate
from distkeras.ml.params import getter, set_given, set_params, setter, to_int, to_number
from distkeras.ml.predictors import ModelPredictor, check_batch_size
from distkeras.session import is_connect
from distkeras.training.callbacks import as_callback_list
from distkeras.training.trainer import Trainer

logger = logging.getLogger(__name__)

MODEL_FILE = "model.keras"


def _to_features_col(value):
    """TypeConverter: a column name or a list of names (a multi-input model)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise TypeError(f"`features_col` must be a column name or a list of names. "
                    f"Received: {value!r}")


def _to_class_weight(value):
    """TypeConverter: a dict from class index to weight. Keys saved as JSON come back as
    strings ("0"); they are indices again here."""
    if not isinstance(value, dict):
        raise TypeError(f"`class_weight` must be a dict from class index to weight, for "
                        f"example {{0: 1.0, 1: 5.0}}. Received: {value!r}")
    try:
        return {int(key): float(weight) for key, weight in value.items()}
    except (TypeError, ValueError) as error:
        raise TypeError(f"`class_weight` must map class indices (integers) to numbers. "
                        f"Received: {value!r}") from error


def _to_optimizer_name(value):
    """TypeConverter: the name of a Keras optimizer ("adam", "sgd", ...)."""
    if not isinstance(value, str) or not value:
        raise TypeError(f"`workerOptimizer` must be the name of a Keras optimizer, for "
                        f"example 'adam'. Received: {value!r}")
    return value


def _check_classic(spark, path):
    """Refuses to save a stage from a Spark Connect session, before anything is written:
    the model file goes through the driver's Hadoop file system, which a Connect client
    does not have.

    Raises:
        ValueError: Naming the path and what to do instead.
    """
    if is_connect(spark):
        raise ValueError(
            f"Saving a distkeras stage to {path} needs a classic SparkSession (the model "
            "file is written through the driver's Hadoop file system), and this is a Spark "
            "Connect one. Save the Keras model itself instead (distkeras.utils.save_model("
            "stage.keras_model, path) or model.save(path)), or save from a classic session.")


def _write_bytes(spark, path, data):
    """Writes ``data`` to a new file at ``path`` on any Hadoop file system Spark can reach."""
    jvm = spark.sparkContext._jvm
    java_path = jvm.org.apache.hadoop.fs.Path(path)
    file_system = java_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    stream = file_system.create(java_path, False)
    try:
        stream.write(bytearray(data))
    finally:
        stream.close()


def _read_bytes(spark, path):
    """The bytes of the file at ``path`` (any Hadoop file system Spark can reach)."""
    rows = spark.read.format("binaryFile").load(path).select("content").collect()
    if len(rows) != 1:
        raise FileNotFoundError(f"Expected one Keras model file at {path}; found {len(rows)}.")
    return bytes(rows[0]["content"])


def _model_path(path):
    return path.rstrip("/") + "/" + MODEL_FILE


def _load_keras_model(spark, path, compile=False):
    """The Keras model saved in the stage folder ``path``, or an error that says how to
    load one that needs custom objects (Keras's own names neither the path nor the fix)."""
    data = _read_bytes(spark, _model_path(path))
    try:
        return deserialize_model(data, compile=compile)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"Could not rebuild the Keras model saved at {_model_path(path)}: {error}\n"
            "A model with custom layers, losses, metrics or activations needs them in this "
            "session: define or import them, then load inside `with keras.saving."
            "custom_object_scope({'MyLayer': MyLayer, 'my_loss': my_loss}):`, or register "
            "them with `@keras.saving.register_keras_serializable()`.") from error


class _HasKerasParams(HasPredictionCol):
    batchSize = Param(Params._dummy(), "batchSize", "rows per model call when predicting",
                      typeConverter=TypeConverters.toInt)
    setParams = set_params
    setPredictionCol = setter("predictionCol")
    setBatchSize = setter("batchSize")
    getBatchSize = getter("batchSize")

    def _init_params(self, output_col, batch_size):
        self._setDefault(predictionCol="prediction", batchSize=1024)
        set_given(self, predictionCol=output_col, batchSize=batch_size)


class KerasModel(Model, _HasKerasParams, MLReadable, MLWritable):
    """A trained Keras model as a Spark ML Transformer: adds a prediction column.

    Predictions come from `ModelPredictor` (``array<float>`` per row, on the executors).

    Args:
        keras_model: The trained `keras.Model`.
        features_col: The input column, or a list of columns for a multi-input model.
        output_col: The prediction column to add (Param ``predictionCol``).
        batch_size: Rows per model call.

    Attributes:
        keras_model: The `keras.Model`.
    """

    featuresCol = Param(Params._dummy(), "featuresCol", "input column(s) of the model",
                        typeConverter=_to_features_col)
    setFeaturesCol = setter("featuresCol")
    getFeaturesCol = getter("featuresCol")

    def __init__(self, keras_model=None, features_col="features", output_col="prediction",
                 batch_size=1024):
        super().__init__()
        self.keras_model = keras_model
        self._setDefault(featuresCol="features")
        set_given(self, featuresCol=features_col)
        self._init_params(output_col, batch_size)

    def _transform(self, dataset):
        if self.keras_model is None:
            raise ValueError("This KerasModel holds no Keras model; fit a KerasEstimator or "
                             "pass keras_model=.")
        predictor = ModelPredictor(self.keras_model,
                                   features_col=self.getOrDefault(self.featuresCol),
                                   output_col=self.getOrDefault(self.predictionCol),
                                   batch_size=self.getOrDefault(self.batchSize))
        return predictor.predict(dataset)

    def write(self):
        """An MLWriter: Params as metadata, the Keras model as ``model.keras``."""
        return _KerasModelWriter(self)

    @classmethod
    def read(cls):
        """An MLReader for `KerasModel`."""
        return _KerasModelReader(cls)


class _KerasModelWriter(MLWriter):
    def __init__(self, instance):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path):
        if self.instance.keras_model is None:
            raise ValueError("Cannot save a KerasModel that holds no Keras model.")
        _check_classic(self.sparkSession, path)
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession)
        _write_bytes(self.sparkSession, _model_path(path),
                     serialize_model(self.instance.keras_model))


class _KerasModelReader(MLReader):
    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path):
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        instance.keras_model = _load_keras_model(self.sparkSession, path, compile=True)
        return instance


class KerasEstimator(Estimator, _HasKerasParams, HasWeightCol, MLReadable, MLWritable):
    """Any distkeras trainer as a Spark ML Estimator.

    ``fit(dataframe)`` runs ``trainer.train(dataframe)`` and returns a `KerasModel` that
    reads the trainer's ``features_col``. The trainer keeps its results
    (``get_history()``, ``get_training_time()``) of the last fit.

    Args:
        trainer: A distkeras trainer (for example `distkeras.trainers.ADAG`). Trainers that
            return several models (`EnsembleTrainer`) are not supported.
        output_col: The prediction column the fitted model adds.
        batch_size: Rows per model call when the fitted model predicts.
        weight_col: A numeric column weighing each row's loss (Param ``weightCol``; the
            trainer's ``sample_weight_col``), or None.
        class_weight: A dict from class index to the weight of that class's rows (Param
            ``classWeight``; the trainer's ``class_weight``), or None.
        validation: A fraction of the rows to hold out and evaluate after each epoch
            (Param ``validation``; ``trainer.get_validation_history()``), or None.
        callbacks: Keras callbacks for `train()` (kept with the estimator, not saved with
            the Pipeline: pass them again after loading).
        shuffle: Whether to shuffle the rows before each epoch (Param ``shuffle``; the
            ``shuffle`` of `train()`), as Keras's ``fit`` does by default.
        num_epoch: Passes over the data (Param ``numEpoch``), or None: the trainer's
            ``num_epoch``.
        training_batch_size: Rows per training minibatch (Param ``trainingBatchSize``), or
            None: the trainer's ``batch_size``.
        worker_optimizer: The name of a Keras optimizer (Param ``workerOptimizer``), or
            None: the trainer's ``worker_optimizer``.
        learning_rate: The learning rate of the worker optimizer (Param ``learningRate``;
            not AEASGD's elastic ``learning_rate``), or None: the optimizer's own.

    The training Params (``numEpoch``, ``trainingBatchSize``, ``workerOptimizer``,
    ``learningRate``) replace the trainer's settings for one fit, so
    ``ParamGridBuilder().addGrid(estimator.numEpoch, [1, 2])`` tunes them with Spark's
    ``CrossValidator``; the trainer itself keeps its own.
    """

    validation = Param(Params._dummy(), "validation",
                       "fraction of the rows to hold out for validation (0 < v < 1)",
                       typeConverter=TypeConverters.toFloat)

    shuffle = Param(Params._dummy(), "shuffle",
                    "whether to shuffle the rows before each epoch (trainer.train's shuffle)",
                    typeConverter=TypeConverters.toBoolean)

    classWeight = Param(Params._dummy(), "classWeight",
                        "weight of each class's rows, by class index",
                        typeConverter=_to_class_weight)
    numEpoch = Param(Params._dummy(), "numEpoch",
                     "passes over the data (unset: the trainer's num_epoch)",
                     typeConverter=to_int)
    trainingBatchSize = Param(Params._dummy(), "trainingBatchSize",
                              "rows per training minibatch (unset: the trainer's batch_size)",
                              typeConverter=to_int)
    workerOptimizer = Param(Params._dummy(), "workerOptimizer",
                            "name of the Keras optimizer of the workers (unset: the "
                            "trainer's worker_optimizer)", typeConverter=_to_optimizer_name)
    learningRate = Param(Params._dummy(), "learningRate",
                         "learning rate of the worker optimizer (unset: the optimizer's own)",
                         typeConverter=to_number)
    setWeightCol = setter("weightCol")
    setValidation = setter("validation")
    setShuffle = setter("shuffle")
    setClassWeight = setter("classWeight")
    setNumEpoch = setter("numEpoch")
    setTrainingBatchSize = setter("trainingBatchSize")
    setWorkerOptimizer = setter("workerOptimizer")
    setLearningRate = setter("learningRate")
    # Getters, as Spark's own stages have one for every Param (weightCol's and
    # predictionCol's come with Spark's shared Params).
    getValidation = getter("validation")
    getShuffle = getter("shuffle")
    getClassWeight = getter("classWeight")
    getNumEpoch = getter("numEpoch")
    getTrainingBatchSize = getter("trainingBatchSize")
    getWorkerOptimizer = getter("workerOptimizer")
    getLearningRate = getter("learningRate")

    def __init__(self, trainer=None, output_col="prediction", batch_size=1024,
                 weight_col=None, validation=None, callbacks=None, class_weight=None,
                 shuffle=False, num_epoch=None, training_batch_size=None,
                 worker_optimizer=None, learning_rate=None):
        super().__init__()
        self.trainer = trainer
        self.callbacks = as_callback_list(callbacks)  # one alone, as fit takes
        self._init_params(output_col, batch_size)
        self._setDefault(shuffle=False)
        set_given(self, weightCol=weight_col, validation=validation,
                   classWeight=class_weight, shuffle=shuffle, numEpoch=num_epoch,
                   trainingBatchSize=training_batch_size, workerOptimizer=worker_optimizer,
                   learningRate=learning_rate)

    def _given(self, param):
        return self.getOrDefault(param) if self.isDefined(param) else None

    def _trainer_settings(self):
        """The trainer settings that this estimator's training Params replace (for its
        runs only: the trainer keeps its own)."""
        settings = {}
        if self.isDefined(self.numEpoch):
            settings["num_epoch"] = self.getOrDefault(self.numEpoch)
        if self.isDefined(self.trainingBatchSize):
            settings["batch_size"] = self.getOrDefault(self.trainingBatchSize)
        optimizer = self._given(self.workerOptimizer)
        if self.isDefined(self.learningRate):
            if optimizer is None:  # a compiled model lends its own
                optimizer = self.trainer.compiled_settings()["worker_optimizer"]
            if optimizer is None:
                raise ValueError("`learningRate` sets the learning rate of the trainer's "
                                 "worker_optimizer, and the trainer has none: give the "
                                 "trainer worker_optimizer=..., or set the estimator's "
                                 "workerOptimizer.")
            optimizer = with_learning_rate(optimizer, self.getOrDefault(self.learningRate),
                                           self.trainer.master_model)
            if getattr(self.trainer, "sets_worker_learning_rate", False):
                settings["learning_rate"] = None  # the trainer's would replace this one
        if optimizer is not None:
            settings["worker_optimizer"] = optimizer
        return settings

    def _fit(self, dataset):
        import keras

        if self.trainer is None or not hasattr(self.trainer, "train"):
            raise TypeError("KerasEstimator needs a distkeras trainer, for example "
                            f"KerasEstimator(ADAG(...)). Received: trainer={self.trainer!r}")
        check_batch_size(self.getOrDefault(self.batchSize))
        if not getattr(self.trainer.plan, "watches_one_model", True):
            # refused before it trains, not after
            raise TypeError(f"{type(self.trainer).__name__} returns several models; "
                            "KerasEstimator supports trainers that return one keras.Model.")
        # Copies of an estimator share its trainer (Params.copy is shallow): each fit's
        # settings reach its own run only, so fits in parallel threads do not mix them.
        model = self.trainer.train(
            dataset, shuffle=self.getOrDefault(self.shuffle),
            sample_weight_col=self._given(self.weightCol) or None,
            class_weight=self._given(self.classWeight),
            validation_data=self._given(self.validation),
            callbacks=self.callbacks or None, overrides=self._trainer_settings() or None)
        if not isinstance(model, keras.Model):
            raise TypeError(
                f"{type(self.trainer).__name__}.train() returned {type(model).__name__}, not "
                "one keras.Model; KerasEstimator supports trainers that return one model.")
        # The trainer keeps the columns as given: a dict by input name, in the model's order.
        features_col = frame_checks.columns_by_name(self.trainer.features_col, model, "inputs",
                                                    "features_col")
        fitted = KerasModel(model, features_col=features_col,
                            output_col=self.getOrDefault(self.predictionCol),
                            batch_size=self.getOrDefault(self.batchSize))
        fitted._resetUid(self.uid.replace("KerasEstimator", "KerasModel"))
        return fitted

    def write(self):
        """An MLWriter: Params, trainer class and config as metadata, its model as a file."""
        return _KerasEstimatorWriter(self)

    @classmethod
    def read(cls):
        """An MLReader for `KerasEstimator`."""
        return _KerasEstimatorReader(cls)


class _KerasEstimatorWriter(MLWriter):
    def __init__(self, instance):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path):
        trainer = self.instance.trainer
        if trainer is None:
            raise ValueError("Cannot save a KerasEstimator without a trainer.")
        _check_classic(self.sparkSession, path)
        trainer_class = f"{type(trainer).__module__}.{type(trainer).__qualname__}"
        # The model is read back uncompiled: the settings a compiled model lends are saved
        # as the trainer's own (in the saved config; the trainer keeps its own).
        config = trainer.get_config()
        config.update(_serialized(trainer.compiled_settings()))
        extra = {"trainer": {"class": trainer_class, "config": config}}
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession,
                                         extraMetadata=extra)
        _write_bytes(self.sparkSession, _model_path(path), serialize_model(trainer.master_model))


def _serialized(settings):
    """``settings`` (Keras objects by name) as a trainer's `get_config` writes them."""
    return {name: value if name == "loss_weights" else serialize_keras_object(value)
            for name, value in settings.items()}


def _trainer_class(qualified_name, path):
    """The trainer class saved as ``qualified_name``, or an error that says to define or
    import it first (a trainer of one's own, written in a notebook or a script, is not
    there in a new session until that code runs again)."""
    module_name, _, class_name = qualified_name.rpartition(".")
    try:
        trainer_class = getattr(importlib.import_module(module_name), class_name, None)
    except ImportError:
        trainer_class = None
    if trainer_class is None:
        raise ValueError(
            f"The estimator saved at {path} trains with {qualified_name}, which this session "
            f"cannot find: define or import {class_name} before loading (a trainer "
            "class defined inside a function cannot be found again: define it at the top "
            "level of a module or notebook).")
    return trainer_class


class _KerasEstimatorReader(MLReader):
    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path):
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        trainer_class = _trainer_class(metadata["trainer"]["class"], path)
        if not (isinstance(trainer_class, type) and issubclass(trainer_class, Trainer)):
            raise TypeError(f"{metadata['trainer']['class']} (saved at {path}) is not a "
                            "distkeras trainer class.")
        keras_model = _load_keras_model(self.sparkSession, path)
        instance = self.cls(trainer_class.from_config(metadata["trainer"]["config"],
                                                      keras_model=keras_model))
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        return instance
