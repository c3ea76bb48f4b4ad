"""The transport: the wire between the workers and the driver, and the parameter server
built on it. The servers run on the driver, in threads of the trainer's process; the
frames, connections and a worker's checks run on both ends.

- `networking`: the wire format (frames, checked against limits and shapes, never
  pickled), connections, the token handshake (driver and executor).
- `exchange_checks`: what a worker checks of the update it commits and of the server's
  replies (executor).
- `socket_transport`: the server's socket part: accept, handshake, eviction, one thread
  per connection, the dispatch of actions (driver).
- `center`: the center variable, its lock, and the pull and commit exchanges (driver).
- `history_messages`: the step records and metric states as a worker's messages carry
  them (executor writes, driver reads).
- `history_sink`: the workers' step records, failures, goodbyes, task retries and epoch
  ends (driver).
- `epoch_barrier`: workers wait at each epoch's end while the driver ends it (driver).
- `parameter_servers`: the servers, each holding those parts (driver).

`distkeras.networking` and `distkeras.parameter_servers` are the dist-keras import paths
(thin faces).
"""
