"""Non-finite guard of the learner update: NaN or inf in the loss, gradients or parameters is caught
within the update that produced it (issue 7, "Interrupts and faults").

:class:`UpdateGuard` wraps any ``update(state, batch) -> (state, metrics)`` whose metrics hold ``loss``
and ``grad_norm`` (the global norm of the gradients; it is non-finite iff some gradient is) and whose
state has ``params``. It is loop-agnostic: the Anakin/host loop calls it, and so can a Sebulba learner.
"""
from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

ON_NAN = ("stop", "skip")
QUANTITIES = ("loss", "gradients", "parameters")


@jax.jit
def _finite(loss, grad_norm, params) -> jax.Array:
    """[3] bool: loss, gradient norm and every parameter finite."""
    params_ok = jnp.all(jnp.stack([jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(params)]))
    return jnp.stack([jnp.isfinite(loss), jnp.isfinite(grad_norm), params_ok])


def nonfinite_quantity(metrics: dict, params) -> Optional[str]:
    """The first of ``"loss"``, ``"gradients"``, ``"parameters"`` that is not finite, or None."""
    ok = np.asarray(_finite(metrics["loss"], metrics["grad_norm"], params))
    return None if ok.all() else QUANTITIES[int(np.argmin(ok))]


class UpdateGuard:
    """Call ``update`` and check its result.

    Args:
      update: ``update(state, batch) -> (state, metrics)``.
      on_nan: ``"stop"``: return the non-finite state with ``bad`` set (the caller stops and keeps its
        last good checkpoint); ``"skip"``: return the *previous* state instead (the update is skipped)
        and count it in ``skipped``.
      skipped: skipped updates so far (from a checkpoint when resuming).

    Calling it returns ``(state, metrics, bad)``: ``bad`` names the non-finite quantity in stop mode,
    else None; ``metrics`` gains ``skipped_updates`` (cumulative count).

    Raises:
      ValueError: for an ``on_nan`` outside :data:`ON_NAN`.
    """

    def __init__(self, update: Callable, on_nan: str = "stop", skipped: int = 0):
        if on_nan not in ON_NAN:
            raise ValueError(f"bad --on-nan {on_nan!r}; expected one of {', '.join(ON_NAN)}")
        self.update = update
        self.on_nan = on_nan
        self.skipped = skipped

    def __call__(self, state, batch):
        new_state, metrics = self.update(state, batch)
        bad = nonfinite_quantity(metrics, new_state.params)
        if bad is not None and self.on_nan == "skip":
            self.skipped += 1
            new_state, bad = state, None
        return new_state, dict(metrics, skipped_updates=jnp.float32(self.skipped)), bad
