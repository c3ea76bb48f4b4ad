"""A faster `train_on_batch` for the JAX backend.

Keras's own `train_on_batch` copies the whole training state back into the model's
variables and waits for the loss after every step. `model.fit` does neither; this does what
fit does: it keeps the state as JAX arrays between steps and writes it back only when the
weights are read or written (once per communication window). Per-step logs stay JAX arrays
until they are read, so steps are dispatched without waiting for the previous one.
"""

import jax
import jax.numpy as jnp


class JaxTrainStep:
    """Runs training steps on a compiled Keras model (JAX backend), syncing lazily.

    Args:
        model: A compiled `keras.Model` on the JAX backend.
    """

    def __init__(self, model):
        self.model = model
        self.state = None
        self._fresh_metrics = None

    @staticmethod
    def supported(model):
        """Whether the fast path applies (JAX backend, jit-compiled, single device)."""
        import keras

        return (keras.backend.backend() == "jax" and not model.run_eagerly
                and getattr(model, "jit_compile", True)
                and keras.distribution.distribution() is None)

    def __call__(self, x, y, sample_weight=None):
        """Runs one step; returns the logs (JAX scalars, per batch)."""
        model = self.model
        data = (x, y, sample_weight)
        if self.state is None:
            model._symbolic_build(data_batch=data)
            model.make_train_function()
            model.reset_metrics()
            self.state = model._get_jax_state(
                trainable_variables=True, non_trainable_variables=True,
                optimizer_variables=True, metrics_variables=True,
                purge_model_variables=False)
            # The state is donated to the compiled step, so keep a private copy of the
            # reset metric values to start every step from (per-batch logs).
            self._fresh_metrics = [jnp.array(value, copy=True) for value in self.state[3]]
        metrics = [jnp.array(value, copy=True) for value in self._fresh_metrics]
        state = (*self.state[:3], metrics)
        model._jax_state_synced = False
        logs, self.state = model.train_function(state, iter([data]))
        return logs

    def sync(self):
        """Writes the state back into the model's variables (before they are read)."""
        if self.state is None:
            return
        trainable, non_trainable, optimizer, metrics = self.state
        self.model._jax_state = {
            "trainable_variables": trainable,
            "non_trainable_variables": non_trainable,
            "optimizer_variables": optimizer,
            "metrics_variables": metrics,
        }
        self.model._jax_state_synced = False
        self.model.jax_state_sync()
        self.state = None  # the variables hold the truth now; re-read them at the next step


def to_float(value):
    """A log value (JAX or numpy scalar) as a Python float."""
    return float(jax.device_get(value)) if isinstance(value, jax.Array) else float(value)
