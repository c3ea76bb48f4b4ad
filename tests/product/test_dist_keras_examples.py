"""dist-keras's own example runs with only the changes docs/porting.md lists.

The script below is the original's code (examples/mnist.py, then the cells of mnist.ipynb
that mnist.py lacks, of cerndb/dist-keras at its last commit), where every line that
differs carries a ``# porting.md:`` comment naming the change; the example's own settings
(its "modify these variables" block: local mode, workers, epochs) are set for a small run.
The data is Fashion-MNIST written in the examples' CSV layout. It runs in a fresh Python
process, which starts its own SparkContext as the example does.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.spark

# examples/mnist.py, then the cells of mnist.ipynb that mnist.py lacks (show_instances'
# .toArray(), a DOWNPOUR MLP on the dense features, parameter_server.num_updates).
MNIST_PY = r'''
from distkeras.evaluators import *
from distkeras.predictors import *
from distkeras.trainers import *
from distkeras.transformers import *
from distkeras.utils import *

from keras.layers import *  # porting.md: keras.layers.convolutional / keras.layers.core
from keras.models import Sequential
from keras.optimizers import *

from pyspark import SparkConf
from pyspark import SparkContext

from pyspark.ml.evaluation import MulticlassClassificationEvaluator
from pyspark.ml.feature import OneHotEncoder
from pyspark.ml.feature import StandardScaler
from pyspark.ml.feature import StringIndexer
from pyspark.ml.feature import VectorAssembler

import pwd
import os


# First, setup the Spark variables. You can modify them to your needs.
application_name = "Distributed Keras MNIST Notebook"
using_spark_2 = False
local = True  # the example's setting: a local run
path_train = "data/mnist_train.csv"
path_test = "data/mnist_test.csv"
if local:
    # Tell master to use local resources.
    master = "local[2]"  # the example's setting (it had local[*])
    num_processes = 2  # the example's setting (it had 3)
    num_executors = 1
else:
    # Tell master to use YARN.
    master = "yarn"  # porting.md: Spark 3 refuses "yarn-client"
    num_executors = 20
    num_processes = 1

# This variable is derived from the number of cores and executors, and will be used to assign the number of model trainers.
num_workers = num_executors * num_processes

print("Number of desired executors: " + repr(num_executors))  # porting.md: `x` is repr(x)
print("Number of desired processes / executor: " + repr(num_processes))
print("Total number of workers: " + repr(num_workers))

# Use the DataBricks CSV reader, this has some nice functionality regarding invalid values.
# porting.md: the PYSPARK_SUBMIT_ARGS line (--packages com.databricks:spark-csv) is deleted

conf = SparkConf()
conf.set("spark.app.name", application_name)
conf.set("spark.master", master)
conf.set("spark.executor.cores", repr(num_processes))
conf.set("spark.executor.instances", repr(num_executors))
conf.set("spark.executor.memory", "4g")
conf.set("spark.locality.wait", "0")
conf.set("spark.serializer", "org.apache.spark.serializer.KryoSerializer");
conf.set("spark.local.dir", "/tmp/" + get_os_username() + "/dist-keras");
conf.set("spark.ui.enabled", "false")  # the test's: no web UI on a shared machine

# Check if the user is running Spark 2.0 +
if using_spark_2:
    sc = SparkSession.builder.config(conf=conf) \
            .appName(application_name) \
            .getOrCreate()
else:
    # Create the Spark context.
    sc = SparkContext(conf=conf)
    # Add the missing imports
    from pyspark import SQLContext
    sqlContext = SQLContext(sc)

# Check if we are using Spark 2.0
if using_spark_2:
    reader = sc
else:
    reader = sqlContext
# Read the training dataset.
raw_dataset_train = reader.read.format('com.databricks.spark.csv') \
                          .options(header='true', inferSchema='true') \
                          .load(path_train)
# Read the testing dataset.
raw_dataset_test = reader.read.format('com.databricks.spark.csv') \
                         .options(header='true', inferSchema='true') \
                         .load(path_test)

# First, we would like to extract the desired features from the raw dataset.
# We do this by constructing a list with all desired columns.
# This is identical for the test set.
features = raw_dataset_train.columns
features.remove('label')

# Next, we use Spark's VectorAssembler to "assemble" (create) a vector of all desired features.
# http://spark.apache.org/docs/latest/ml-features.html#vectorassembler
vector_assembler = VectorAssembler(inputCols=features, outputCol="features")
# This transformer will take all columns specified in features, and create an additional column
# "features" which will contain all the desired features aggregated into a single vector.
dataset_train = vector_assembler.transform(raw_dataset_train)
dataset_test = vector_assembler.transform(raw_dataset_test)

# Define the number of output classes.
nb_classes = 10
encoder = OneHotTransformer(nb_classes, input_col="label", output_col="label_encoded")
dataset_train = encoder.transform(dataset_train)
dataset_test = encoder.transform(dataset_test)

# Allocate a MinMaxTransformer from Distributed Keras to normalize the features..
# o_min -> original_minimum
# n_min -> new_minimum
transformer = MinMaxTransformer(n_min=0.0, n_max=1.0, \
                                o_min=0.0, o_max=250.0, \
                                input_col="features", \
                                output_col="features_normalized")
# Transform the dataset.
dataset_train = transformer.transform(dataset_train)
dataset_test = transformer.transform(dataset_test)

# mnist.ipynb's show_instances, without the drawing.
def show_instances(column):
    num_instances = 6
    instances = dataset_train.select(column).take(num_instances)
    for i in range(0, num_instances):
        instance = instances[i]
        instance = instance[column].toArray().reshape((28, 28))
        instances[i] = instance
    return instances

print("Instance maxima: %s %s" % (show_instances("features")[0].max(),
                                  show_instances("features_normalized")[0].max()))

# Keras expects the vectors to be in a particular shape, we can reshape the
# vectors using Spark.
reshape_transformer = ReshapeTransformer("features_normalized", "matrix", (28, 28, 1))
dataset_train = reshape_transformer.transform(dataset_train)
dataset_test = reshape_transformer.transform(dataset_test)

# Now, create a Keras model.
# Taken from Keras MNIST example.

# Declare model parameters.
img_rows, img_cols = 28, 28
# number of convolutional filters to use
nb_filters = 32
# size of pooling area for max pooling
pool_size = (2, 2)
# convolution kernel size
kernel_size = (3, 3)
input_shape = (img_rows, img_cols, 1)

# Construct the model.
convnet = Sequential()
# porting.md: Convolution2D(n, rows, cols, border_mode=...) is Conv2D(n, (rows, cols), padding=...)
convnet.add(Conv2D(nb_filters, (kernel_size[0], kernel_size[1]),
                   padding='valid',
                   input_shape=input_shape))
convnet.add(Activation('relu'))
convnet.add(Conv2D(nb_filters, (kernel_size[0], kernel_size[1])))
convnet.add(Activation('relu'))
convnet.add(MaxPooling2D(pool_size=pool_size))
convnet.add(Flatten())
convnet.add(Dense(225))
convnet.add(Activation('relu'))
convnet.add(Dense(nb_classes))
convnet.add(Activation('softmax'))

# Define the optimizer and the loss.
optimizer_convnet = 'adam'
loss_convnet = 'categorical_crossentropy'

# Print the summary.
convnet.summary()

# We can also evaluate the dataset in a distributed manner.
# However, for this we need to specify a procedure how to do this.
def evaluate_accuracy(model, test_set, features="matrix"):
    evaluator = AccuracyEvaluator(prediction_col="prediction_index", label_col="label")
    predictor = ModelPredictor(keras_model=model, features_col=features)
    transformer = LabelIndexTransformer(output_dim=nb_classes)
    test_set = test_set.select(features, "label")
    test_set = predictor.predict(test_set)
    test_set = transformer.transform(test_set)
    score = evaluator.evaluate(test_set)

    return score

# Select the desired columns, this will reduce network usage.
dataset_train = dataset_train.select("features_normalized", "matrix","label", "label_encoded")
dataset_test = dataset_test.select("features_normalized", "matrix","label", "label_encoded")
# Keras expects DenseVectors.
dense_transformer = DenseTransformer(input_col="features_normalized", output_col="features_normalized_dense")
dataset_train = dense_transformer.transform(dataset_train)
dataset_test = dense_transformer.transform(dataset_test)
dataset_train.repartition(num_workers)
dataset_test.repartition(num_workers)
# Assing the training and test set.
training_set = dataset_train.repartition(num_workers)
test_set = dataset_test.repartition(num_workers)
# Cache them.
training_set.cache()
test_set.cache()

# Precache the trainingset on the nodes using a simple count.
print(training_set.count())

# Use the ADAG optimizer. You can also use a SingleWorker for testing purposes -> traditional
# non-distributed gradient descent.
trainer = ADAG(keras_model=convnet, worker_optimizer=optimizer_convnet, loss=loss_convnet,
               num_workers=num_workers, batch_size=16, communication_window=5, num_epoch=1,
               features_col="matrix", label_col="label_encoded")  # num_epoch: was 5
trained_model = trainer.train(training_set)

print("Training time: " + str(trainer.get_training_time()))
print("Accuracy: " + str(evaluate_accuracy(trained_model, test_set)))
print("Number of parameter server updates: " + str(trainer.parameter_server.num_updates))

# mnist.ipynb's MLP, trained by DOWNPOUR (given a learning_rate, as workflow.ipynb does) on the
# dense vectors.
mlp = Sequential()
mlp.add(Dense(1000, input_shape=(784,)))
mlp.add(Activation('relu'))
mlp.add(Dense(250))
mlp.add(Activation('relu'))
mlp.add(Dense(10))
mlp.add(Activation('softmax'))
trainer = DOWNPOUR(keras_model=mlp, worker_optimizer='adam', loss='categorical_crossentropy',
                   num_workers=num_workers, batch_size=4, communication_window=5,
                   learning_rate=0.001, num_epoch=1,
                   features_col="features_normalized_dense", label_col="label_encoded")
trained_model = trainer.train(training_set)
print("MLP accuracy: " + str(evaluate_accuracy(trained_model, test_set,
                                                 "features_normalized_dense")))
print("MLP updates: " + str(trainer.parameter_server.num_updates))
'''


def _write_mnist_csv(path, images, labels):
    """The MNIST CSV layout of dist-keras's examples: a header, then ``label`` and the
    784 pixels (0 to 255) per line."""
    header = ",".join(["label"] + [f"pixel{i}" for i in range(784)])
    rows = np.column_stack([labels, images.reshape(len(images), -1)]).astype(np.int64)
    np.savetxt(path, rows, fmt="%d", delimiter=",", header=header, comments="")


def _run_example(tmp_path, source):
    script = tmp_path / "example.py"
    script.write_text(source)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    return {line.split(": ", 1)[0]: line.split(": ", 1)[1]
            for line in result.stdout.splitlines() if ": " in line}


def test_dist_keras_mnist_example_runs_with_only_the_porting_guides_changes(tmp_path):
    from distkeras.datasets import load_fashion_mnist_numpy

    images, labels = load_fashion_mnist_numpy("train")
    (tmp_path / "data").mkdir()
    _write_mnist_csv(tmp_path / "data" / "mnist_train.csv", images[:600], labels[:600])
    _write_mnist_csv(tmp_path / "data" / "mnist_test.csv", images[600:800], labels[600:800])

    printed = _run_example(tmp_path, MNIST_PY)

    # .toArray() on VectorAssembler's vectors and on MinMaxTransformer's.
    raw, normalized = (float(value) for value in printed["Instance maxima"].split())
    assert raw == pytest.approx(normalized * 250.0) and raw > 100
    # A model that learned nothing scores about 0.1 (on 1,000 rows both scored 0.65-0.69).
    assert float(printed["Accuracy"]) > 0.3
    assert float(printed["MLP accuracy"]) > 0.3
    assert int(printed["Number of parameter server updates"]) > 0
    assert int(printed["MLP updates"]) > 0
