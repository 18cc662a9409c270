"""Learner: the IMPALA actor-critic loss on corrected targets, data-parallel over all local devices.

Loss per valid step s (Espeholt et al. 2018, https://arxiv.org/abs/1802.01561, section 4):

    -A_s log π(a_s|x_s)  +  c_v · ½ (v_s - V(x_s))²  -  c_H · H(π(·|x_s))

with (v_s, A_s) from the Corrector. Every term is a *masked* mean over valid steps taken across
devices as ``psum(sum) / psum(count)`` (docs/DESIGN.md), so one update on ``N`` devices equals the
single-device update on the same batch. The batch axis ``B`` is sharded with ``jax.shard_map`` over a
1-D mesh of all local devices; the gradient of the replicated parameters is summed over devices
by ``shard_map`` itself (its transpose of the replicated input is a ``psum``).
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import distrax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from accerl_jax import corrector, xla
from accerl_jax.types import ApplyFn, Rollout

AXIS = "batch"


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Hyperparameters of the IMPALA loss.

    Attributes:
      corrector: ``"vtrace"`` or ``"none"``.
      discount: γ per agent step.
      lambda_: V-trace λ.
      clip_rho_threshold: ρ̄.
      clip_pg_rho_threshold: clip of ρ in the policy-gradient advantage.
      value_coef: c_v.
      entropy_coef: c_H.
    """

    corrector: str = "vtrace"
    discount: float = 0.99
    lambda_: float = 1.0
    clip_rho_threshold: float = 1.0
    clip_pg_rho_threshold: float = 1.0
    value_coef: float = 0.5
    entropy_coef: float = 0.01


class LearnerState(NamedTuple):
    params: Any  # flax variables of the learner network
    opt_state: Any  # optax state
    step: jax.Array  # [] int32, updates taken


def loss_sums(params, apply: ApplyFn, batch: Rollout, cfg: LossConfig) -> tuple[jax.Array, dict]:
    """Masked *sums* of the loss terms over a (local) ``[T, B]`` batch.

    Returns:
      ``(count, sums)``: ``count`` [] float32 is the number of valid steps; ``sums`` maps
      ``"pg"``, ``"value"``, ``"entropy"``, ``"rho"`` and ``"vs"`` to [] float32 sums over valid steps.
    """
    logits, v_tm1 = apply(params, batch.obs)
    _, v_t = apply(params, batch.next_obs)
    v_t = jax.lax.stop_gradient(v_t)
    pi = distrax.Categorical(logits=logits)
    log_pi = pi.log_prob(batch.action)
    mask = batch.valid.astype(jnp.float32)
    discount_t = cfg.discount * (1.0 - batch.terminated.astype(jnp.float32))
    done_t = jnp.logical_or(batch.terminated, batch.truncated)
    log_rho = jax.lax.stop_gradient(log_pi) - batch.log_prob
    targets = corrector.correct(
        cfg.corrector,
        jax.lax.stop_gradient(v_tm1),
        v_t,
        batch.reward,
        discount_t,
        log_rho,
        done_t,
        lambda_=cfg.lambda_,
        clip_rho_threshold=cfg.clip_rho_threshold,
        clip_pg_rho_threshold=cfg.clip_pg_rho_threshold,
    )
    entropy = pi.entropy()
    sums = {
        "pg": jnp.sum(mask * -targets.pg_advantage * log_pi),
        "value": jnp.sum(mask * 0.5 * (targets.vs - v_tm1) ** 2),
        "entropy": jnp.sum(mask * entropy),
        "rho": jnp.sum(mask * jnp.exp(log_rho)),
        "vs": jnp.sum(mask * targets.vs),
    }
    return jnp.sum(mask), sums


def make_update(
    apply: ApplyFn,
    optimizer: optax.GradientTransformation,
    cfg: LossConfig,
    mesh: Mesh | None = None,
    family: str = "mlp",
):
    """Build the jitted, data-parallel ``update(state, batch) -> (state, metrics)``.

    Args:
      apply: learner network apply function.
      optimizer: optax transformation.
      cfg: :class:`LossConfig`.
      mesh: 1-D mesh with axis ``"batch"``; default: all local devices.
      family: network family, for the compiler options (:func:`accerl_jax.xla.options_for`).

    Returns:
      ``update``: takes :class:`LearnerState` (replicated) and a :class:`Rollout` ``[T, B, ...]`` with
      ``B`` divisible by the number of devices; returns the new state and a dict of [] float32 metrics
      (``loss``, ``pg_loss``, ``value_loss``, ``entropy``, ``rho_mean``, ``vs_mean``, ``grad_norm``).
      Raises ValueError (when called) if ``B`` is not divisible by the device count.
    """
    mesh = mesh or make_mesh()
    n_dev = mesh.devices.size

    def _local(state: LearnerState, batch: Rollout):
        def total_loss(params):
            count, sums = loss_sums(params, apply, batch, cfg)
            count = jax.lax.psum(count, AXIS)
            count = jnp.maximum(count, 1.0)
            loss = (sums["pg"] + cfg.value_coef * sums["value"] - cfg.entropy_coef * sums["entropy"]) / count
            return loss, (count, sums)

        (loss, (count, sums)), grads = jax.value_and_grad(total_loss, has_aux=True)(state.params)
        # No psum of grads here: params are replicated (P()), so under shard_map's varying-axes checking
        # (check_vma=True) their gradient already is the sum over devices; a second psum doubled it.
        sums = jax.lax.psum(sums, AXIS)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {
            "loss": jax.lax.psum(loss, AXIS),
            "pg_loss": sums["pg"] / count,
            "value_loss": sums["value"] / count,
            "entropy": sums["entropy"] / count,
            "rho_mean": sums["rho"] / count,
            "vs_mean": sums["vs"] / count,
            "grad_norm": optax.global_norm(grads),
        }
        return LearnerState(params, opt_state, state.step + 1), metrics

    batch_spec = P(None, AXIS)
    sharded = jax.shard_map(_local, mesh=mesh, in_specs=(P(), batch_spec), out_specs=(P(), P()))
    jitted = xla.jit(sharded, family)

    def update(state: LearnerState, batch: Rollout):
        b = batch.action.shape[1]
        if b % n_dev:
            raise ValueError(f"batch size B={b} is not divisible by the {n_dev} learner devices; use a multiple of {n_dev}")
        return jitted(state, batch)

    return update


def make_mesh(devices=None) -> Mesh:
    """A 1-D mesh named ``"batch"`` over ``devices`` (default: all local devices)."""
    devices = jax.local_devices() if devices is None else devices
    return Mesh(np.asarray(devices), (AXIS,))


def init_state(params, optimizer: optax.GradientTransformation, mesh: Mesh | None = None) -> LearnerState:
    """Fresh :class:`LearnerState` for ``params``, replicated over ``mesh`` (default: all local devices).

    Placing it with the same sharding that ``update`` returns keeps ``update`` from compiling twice.
    """
    mesh = mesh or make_mesh()
    make = jax.jit(lambda p: LearnerState(p, optimizer.init(p), jnp.zeros((), jnp.int32)),
                   out_shardings=NamedSharding(mesh, P()))
    return make(params)


def make_optimizer(learning_rate: float, max_grad_norm: float, total_updates: int, anneal: bool = True):
    """Adam with global-norm clipping, learning rate linearly annealed to 0 over ``total_updates``."""
    lr = optax.linear_schedule(learning_rate, 0.0, max(total_updates, 1)) if anneal else learning_rate
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(lr, eps=1e-5))
