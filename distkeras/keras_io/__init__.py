"""Keras I/O: what of a Keras model travels, and how (the driver and the executors).

- `archives`: a model as the bytes of a `.keras` archive (safe mode, no pickle), its
  declared size, and as a file on any Hadoop path.
- `compile_config`: optimizers, losses and metrics as JSON-able configs, rebuilt with
  `compile_arguments`, and the driver's checks of what every executor's compile would
  refuse.
- `custom_objects`: the custom classes and functions a model names, found on the driver
  and shipped with the Spark task.
- `model_state`: what the weights leave out: the random generators' and the optimizer's
  state.

`distkeras.utils` (dist-keras's name) is a face of some of its names.
"""
