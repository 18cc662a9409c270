"""Non-finite guard of the learner update: NaN or inf in the loss, gradients or parameters is caught
within the update that produced it.

The check is *fused* into the update's own XLA program (:func:`guard_update`, a traceable function):
the finite flags are computed beside the update, and with ``--on-nan skip`` the previous state is kept
with ``jnp.where``, so a guarded update costs no extra dispatch and no extra host sync. (A separate
jitted check plus its sync cost ~1.1 ms per update, ~15% of the default CartPole job.) The Anakin loop
calls :func:`guard_update` inside its scan; :class:`UpdateGuard` jits it for the stage-by-stage loops.

Both wrap any ``update(state, batch) -> (state, metrics)`` whose metrics hold ``loss`` and
``grad_norm`` (the global norm of the gradients; it is non-finite iff some gradient is) and whose state
has ``params``; :func:`guard_update` also an ``update(state, batch) -> (state, metrics, outputs)``
(:func:`accerl_jax.learner.make_update` with ``outputs=True``), whose outputs it passes on.
"""
from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from accerl_jax import xla

ON_NAN = ("stop", "skip")
QUANTITIES = ("loss", "gradients", "parameters")
FINITE = -1  # the ``bad`` code of an update whose loss, gradients and parameters are all finite


def check_on_nan(on_nan: str) -> None:
    """Raises ValueError for an ``on_nan`` outside :data:`ON_NAN`."""
    if on_nan not in ON_NAN:
        raise ValueError(f"bad --on-nan {on_nan!r}; expected one of {', '.join(ON_NAN)}")


def finite_flags(metrics: dict, params) -> jax.Array:
    """``[3]`` bool: loss, gradient norm and every parameter finite (traceable)."""
    params_ok = jnp.all(jnp.stack([jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(params)]))
    return jnp.stack([jnp.isfinite(metrics["loss"]), jnp.isfinite(metrics["grad_norm"]), params_ok])


def first_bad(flags: jax.Array) -> jax.Array:
    """``[]`` int32: index into :data:`QUANTITIES` of the first False flag, or :data:`FINITE`."""
    return jnp.where(jnp.all(flags), FINITE, jnp.argmin(flags)).astype(jnp.int32)


def quantity(bad: int) -> Optional[str]:
    """The name of a ``bad`` code (None for :data:`FINITE`)."""
    return None if bad == FINITE else QUANTITIES[bad]


def stop_reason(bad: str, update: int, metrics: dict, where: str = "") -> str:
    """The summary's ``stop_reason`` for a run stopped by a non-finite ``bad`` quantity (``--on-nan stop``):
    names the update (and ``where``, e.g. " of seed 3"), the loss and the gradient norm."""
    return (f"non-finite {bad} at update {update}{where} (loss {float(metrics['loss'])}, "
            f"grad_norm {float(metrics['grad_norm'])})")


def guard_update(update: Callable, on_nan: str) -> Callable:
    """A traceable guarded update ``(state, batch, update_number) -> (state, metrics, bad)``; an
    ``update`` that returns ``(state, metrics, outputs)`` gives ``(state, metrics, bad, outputs)`` (the
    outputs of the forward pass under the parameters the update started from, kept as they are).

    ``bad`` ([] int32) is :data:`FINITE` or the index into :data:`QUANTITIES` of the first non-finite
    quantity of this update; with ``on_nan="skip"`` a bad update returns the *previous* state (the caller
    counts it), with ``"stop"`` the non-finite state (the caller stops and keeps its last good checkpoint).
    ``update_number`` ([] int32, 1-based) numbers the update; the guard itself does not read it (a
    wrapper of :func:`guard_update` may: the fault-injection tests poison chosen updates through it).

    Raises:
      ValueError: for an ``on_nan`` outside :data:`ON_NAN`.
    """
    check_on_nan(on_nan)

    def guarded(state, batch, update_number):
        new_state, metrics, *outputs = update(state, batch)
        bad = first_bad(finite_flags(metrics, new_state.params))
        if on_nan == "skip":
            ok = bad == FINITE
            new_state = jax.tree.map(lambda n, o: jnp.where(ok, n, o), new_state, state)
        return (new_state, metrics, bad, *outputs)

    return guarded


class UpdateGuard:
    """The guarded update as one jitted program, for loops that call the learner from the host.

    Args:
      update: ``update(state, batch) -> (state, metrics)`` (traceable).
      on_nan: ``"stop"``: return the non-finite state with ``bad`` set (the caller stops and keeps its
        last good checkpoint); ``"skip"``: return the *previous* state instead (the update is skipped)
        and count it in ``skipped``.
      skipped: skipped updates so far (from a checkpoint when resuming).
      family: network family, for the compiler options (:func:`accerl_jax.xla.options_for`).

    Calling it with ``(state, batch, update_number)`` returns ``(state, metrics, bad)`` (and the
    update's outputs fourth, for an update that returns them, as :func:`guard_update`): ``bad`` names
    the non-finite quantity in stop mode, else None; ``metrics`` gains ``skipped_updates`` (cumulative
    count). The one host sync is the read of the finite flags.

    An ``update`` over several processes' devices (:class:`accerl_jax.shards.GlobalUpdate`: process-local
    inputs and outputs) is guarded through its ``traced`` form, which the jitted program runs over global
    arrays, and its ``host_wrap``, which converts from and to process-local arrays outside that program.

    Raises:
      ValueError: for an ``on_nan`` outside :data:`ON_NAN`.
    """

    def __init__(self, update: Callable, on_nan: str = "stop", skipped: int = 0, family: str = "mlp"):
        step = xla.jit(guard_update(getattr(update, "traced", update), on_nan), family)
        wrap = getattr(update, "host_wrap", None)
        self.step = step if wrap is None else wrap(step)
        self.on_nan = on_nan
        self.skipped = skipped

    def __call__(self, state, batch, update_number: int = 0):
        new_state, metrics, bad, *outputs = self.step(state, batch, jnp.int32(update_number))
        bad = quantity(int(bad))
        if bad is not None and self.on_nan == "skip":
            self.skipped += 1
            bad = None
        return (new_state, dict(metrics, skipped_updates=jnp.float32(self.skipped)), bad, *outputs)
