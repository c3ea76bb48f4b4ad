"""What runs inside a Spark task: the workers and what they need on an executor.

- `task_spec`: the immutable `TaskSpec` the driver builds and ships with each worker.
- `replica`: the worker's Keras model (`ModelReplica`) and its steps.
- `worker`: the base `Worker`: the model rebuilt, the partition's minibatches, the run.
- `sequential`: `SequentialWorker` (SingleTrainer) and `EnsembleWorker`.
- `network`: `NetworkWorker`, which talks to the parameter server (`pull`, `commit`).
- `windowed`: `WindowedWorker`, the loop an `Algorithm` runs, and the built-ins' workers.
- `averaging`: `AveragingWorker` and `SequentialEpochWorker` (a server at epoch ends).
- `failures`: a worker's failure, as the driver hears it.
- `jax_steps`, `backend`, `affinity`: JAX's fast steps, Keras's backend on the executor,
  one set of CPU cores per worker.
- `epochs`: a worker's later epochs, replayed from the executor's local disk.
- `step_history`: the per-step records, kept and sent to the driver; `metric_sums`: the
  metric state added up per epoch for the driver's exact epoch values.

The public import path stays `distkeras.workers`; this package imports nothing itself.
"""
