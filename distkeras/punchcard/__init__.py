"""Punchcard: a job server that trains on the cluster what a notebook sends it (seed 002).

The modules, by where they run and what they may touch:

- In the client's notebook: `client` (`Job`: submit, follow, fetch the trained model),
  over `protocol` (the header and routes both sides share). It imports nothing below.
- In the server's process: `commands` (``distkeras punchcard``, ``distkeras secret``),
  `front` (waitress, hardened against slow and hostile clients), `app` (the Flask
  routes), `service` (`Punchcard`: submissions, job states), `scheduler` (which job
  starts when), `processes` (each job's process), `job_files` (each job's folder),
  `store` (the SQLite job table), `secrets_file`, `audit` (the audit log),
  `submissions` (the checks a submission passes: the security boundary, with `refusals`,
  the checks the child process makes too), `data_roots`
  (what data a job may read) and `config_scan` (a Keras configuration read as JSON).
- In a short-lived child process under resource limits: `model_check`, which runs
  `keras_checks` (what Keras builds of a submission).
- In each job's process: `distkeras.cli.punchcard_job` (its memory limit, the same checks again, then
  ``distkeras train``).

Importing this package imports none of them; ``distkeras.job_deployment`` is the
dist-keras name of the same API.
"""
