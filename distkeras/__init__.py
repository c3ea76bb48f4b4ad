"""Distributed Keras: data-parallel training of Keras 3 models on Apache Spark.

Importing the package makes JAX the default Keras backend (the fastest on CPU), unless
``KERAS_BACKEND`` is already set. The same default applies on the executors, which import
this package before they import Keras.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

__version__ = "0.1.0"
