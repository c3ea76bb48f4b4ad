"""The driver's side of training: a trainer's settings, its runs and their execution plans.

What runs on the driver when `train()` is called, and nothing that runs on an executor:

- `trainer`, `sequential`, `asynchronous`: the trainer classes. Their constructors store
  the arguments; nothing changes them afterwards. `algorithm_trainers`: the trainers of
  the registered algorithms (`algorithms.register`), derived from them; `compat`:
  dist-keras's getters and setters, derived from the settings they read.
- `settings`: the frozen settings one run resolves from them.
- `run`: the state one run owns (history, validator, server, timings), and the
  `run.RunResults` it leaves; `results`: the getters that read them.
- `driver`: the sequence of one `train()`; `preparation`: the checks before the first
  Spark job; `worker_setup`: what the workers are given, and the returned model's compile.
- `plans` and one module per plan (`one_task`, `averaging`, `ensemble`,
  `parameter_server`): the Spark jobs and servers of a run, with their capabilities
  declared; each is given its parts (worker and server factories) and never calls back
  into the trainer; `serving`: the one owner of a server's lifecycle; `launch`: the Spark job;
  `shortfalls`: the warnings of a run that trained less than asked.
- `validation_data`: the validation rows, held on the driver; `callbacks`: the checks of
  the Keras callbacks; `validator`: their per-epoch evaluation and calls.
- `checks`: the checks of a trainer's settings; `options`: ``train()``'s options as they
  travel in JSON (the CLI, Punchcard); `registry`: the trainer classes by name.
- `spark_jobs`: the Spark jobs as the driver sees them (the task function, replies in
  chunks, the driver's address); `monitor`: the progress bar and the stall watch;
  `checkpoints`: the center variable saved and restored; `epoch_metrics`: the epoch's
  exact metric values from the workers' reports; `batch_statistics`: BatchNormalization
  statistics measured again for averaged weights; `history`: a run's step history
  averaged over the workers, saved and loaded.

`distkeras.trainers` is the public face: import the trainers from there.
"""
