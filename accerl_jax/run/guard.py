"""Non-finite guard of the learner update: NaN or inf in the update's *inputs* (the env's observations
and rewards, the behaviour policy μ's ``log_prob``, the compressed actor parameters μ ran with) or in its
loss, gradients or parameters is caught within the update that produced it, and named by the first bad
part in the data flow (:data:`QUANTITIES`, inputs first): a diverged student's NaN ``log_prob`` is
blamed on the compressed actor, not on the learner's loss downstream of it.

The check is *fused* into the update's own XLA program (:func:`guard_update`, a traceable function):
the finite flags are computed beside the update, and with ``--on-nan skip`` the previous state is kept
with ``jnp.where``, so a guarded update costs no extra dispatch and no extra host sync (a separate
jitted check would add both to every update, a large share of a small job's update). The Anakin loop
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

from accerl_jax.platform import xla

ON_NAN = ("stop", "skip")
# In data-flow order: the env's data, the actor's behaviour log-probs, the learner's own quantities.
QUANTITIES = ("observations", "rewards", "behaviour log_prob", "compressed actor parameters", "loss", "gradients",
              "parameters")
FINITE = -1  # the ``bad`` code of an update whose inputs, loss, gradients and parameters are all finite
LOG_PROB, ACTOR = QUANTITIES.index("behaviour log_prob"), QUANTITIES.index("compressed actor parameters")
# The parts of the actor side: a bad one of these with a finite learner is the compressor's (or its
# student's) fault, not the learner's.
ACTOR_SIDE = ("behaviour log_prob", "compressed actor parameters")
# --on-nan skip stops the run (as "diverged", naming the cause) after this many consecutive skipped updates:
# a run that keeps skipping is not training.
MAX_SKIP_STREAK = 5


def check_on_nan(on_nan: str) -> None:
    """Raises ValueError for an ``on_nan`` outside :data:`ON_NAN`."""
    if on_nan not in ON_NAN:
        raise ValueError(f"bad --on-nan {on_nan!r}; expected one of {', '.join(ON_NAN)}")


def all_finite(tree) -> jax.Array:
    """``[]`` bool: every float leaf of ``tree`` finite (traceable; True for a tree without float leaves)."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
              if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def _valid_finite(batch, name: str) -> jax.Array:
    """``[]`` bool: ``batch.<name>`` ([T, B, ...]) finite at every valid step (``batch.valid`` [T, B]
    where the batch has one); True for a batch without that field."""
    x = getattr(batch, name, None)
    if x is None or not jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact):
        return jnp.bool_(True)
    ok = jnp.isfinite(x)
    valid = getattr(batch, "valid", None)
    if valid is not None and valid.shape == ok.shape[:valid.ndim]:
        ok = ok | ~valid.reshape(valid.shape + (1,) * (ok.ndim - valid.ndim))
    return jnp.all(ok)


def input_flags(batch) -> jax.Array:
    """``[4]`` bool: the batch's observations (``obs`` and ``bootstrap_obs``), rewards and behaviour
    ``log_prob`` finite at its valid steps, and a placeholder True for the compressed actor parameters
    (checked by :func:`refine`, where the caller has them). Fields the batch lacks count as finite."""
    obs_ok = _valid_finite(batch, "obs") & all_finite(getattr(batch, "bootstrap_obs", None))
    return jnp.stack([obs_ok, _valid_finite(batch, "reward"), _valid_finite(batch, "log_prob"), jnp.bool_(True)])


def finite_flags(metrics: dict, params, batch=None) -> jax.Array:
    """``[7]`` bool, one per :data:`QUANTITIES` (traceable): the batch's inputs (:func:`input_flags`; all
    True without a ``batch``), then the loss, the gradient norm and every parameter finite."""
    inputs = input_flags(batch) if batch is not None else jnp.ones((4,), bool)
    return jnp.concatenate([inputs, jnp.stack([jnp.isfinite(metrics["loss"]), jnp.isfinite(metrics["grad_norm"]),
                                               all_finite(params)])])


def refine(bad: jax.Array, actor_params) -> jax.Array:
    """``bad`` ([] int32, :func:`first_bad`) with the compressed actor parameters that produced the
    batch taken into account (traceable): when the update is bad downstream of the env's data
    (``bad >=`` :data:`LOG_PROB`) and they are non-finite, the cause is :data:`ACTOR` (their NaN
    ``log_prob`` is the symptom, not the learner's loss). A finite update stays :data:`FINITE`."""
    actor_bad = ~all_finite(actor_params)
    return jnp.where(actor_bad & (bad >= LOG_PROB), ACTOR, bad).astype(jnp.int32)


def first_bad(flags: jax.Array) -> jax.Array:
    """``[]`` int32: index into :data:`QUANTITIES` of the first False flag, or :data:`FINITE`."""
    return jnp.where(jnp.all(flags), FINITE, jnp.argmin(flags)).astype(jnp.int32)


def quantity(bad: int) -> Optional[str]:
    """The name of a ``bad`` code (None for :data:`FINITE`)."""
    return None if bad == FINITE else QUANTITIES[bad]


def stop_reason(bad: str, update: int, metrics: dict, where: str = "", streak: int = 0) -> str:
    """The summary's ``stop_reason`` for a run stopped by a non-finite ``bad`` quantity (``--on-nan stop``,
    or ``streak`` > 0: ``--on-nan skip`` after ``streak`` consecutive skipped updates): names the update
    (and ``where``, e.g. " of seed 3"), the loss and the gradient norm, and for an actor-side cause
    (:data:`ACTOR_SIDE`) that the learner itself was finite."""
    side = "; the compressed actor (compressor/student) diverged, the learner did not" if bad in ACTOR_SIDE else ""
    skips = f"{streak} consecutive updates skipped (--on-nan skip), the last for " if streak else ""
    return (f"{skips}non-finite {bad} at update {update}{where} (loss {float(metrics['loss'])}, "
            f"grad_norm {float(metrics['grad_norm'])}){side}")


def guard_update(update: Callable, on_nan: str) -> Callable:
    """A traceable guarded update ``(state, batch, update_number, hyper=None) -> (state, metrics, bad)``
    (``hyper``: the update's traced hyperparameters, :func:`accerl_jax.learner.make_update`); an
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

    def guarded(state, batch, update_number, hyper=None):
        new_state, metrics, *outputs = update(state, batch, hyper)
        bad = first_bad(finite_flags(metrics, new_state.params, batch))
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
      streak: consecutive skipped updates up to the last one (from a checkpoint when resuming).
      family: network family, for the compiler options (:func:`accerl_jax.platform.xla.options_for`).

    Calling it with ``(state, batch, update_number)`` returns ``(state, metrics, bad)`` (and the
    update's outputs fourth, for an update that returns them, as :func:`guard_update`): ``bad`` names
    the non-finite quantity (:data:`QUANTITIES`) in stop mode, and in skip mode once more than
    :data:`MAX_SKIP_STREAK` updates in a row were skipped (``streak`` then says how many), else None;
    ``metrics`` gains ``skipped_updates`` (cumulative count). ``actor_params`` (optional), the compressed
    parameters the batch's behaviour policy μ ran with, refine a bad ``log_prob`` or learner quantity
    into :data:`ACTOR` when they are non-finite (:func:`refine`; read only for a bad update). The one host
    sync of a finite update is the read of the finite flags.

    An ``update`` over several processes' devices (:class:`accerl_jax.run.shards.GlobalUpdate`: process-local
    inputs and outputs) is guarded through its ``traced`` form, which the jitted program runs over global
    arrays, and its ``host_wrap``, which converts from and to process-local arrays outside that program.

    Raises:
      ValueError: for an ``on_nan`` outside :data:`ON_NAN`.
    """

    def __init__(self, update: Callable, on_nan: str = "stop", skipped: int = 0, family: str = "mlp",
                 streak: int = 0):
        step = xla.jit(guard_update(getattr(update, "traced", update), on_nan), family)
        wrap = getattr(update, "host_wrap", None)
        self.step = step if wrap is None else wrap(step)
        # The update's hyperparameters go in as the program's input (not its constants): a run that differs
        # only in their values reuses the compiled program.
        self.hyper = getattr(update, "hyper", None)
        self.on_nan = on_nan
        self.skipped = skipped
        self.streak = streak

    def __call__(self, state, batch, update_number: int = 0, actor_params=None):
        new_state, metrics, bad, *outputs = self.step(state, batch, jnp.int32(update_number), self.hyper)
        code = int(bad)
        if code != FINITE and actor_params is not None:
            code = int(refine(jnp.int32(code), actor_params))
        bad = quantity(code)
        if self.on_nan == "skip":
            self.streak = self.streak + 1 if bad is not None else 0
            self.skipped += bad is not None
            if self.streak <= MAX_SKIP_STREAK:
                bad = None
        return (new_state, dict(metrics, skipped_updates=jnp.float32(self.skipped)), bad, *outputs)
