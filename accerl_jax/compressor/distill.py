"""``distill:<student>``: knowledge distillation of the learner (teacher) into a smaller student.

Loss on recent actor observations x (Hinton et al. 2015, https://arxiv.org/abs/1503.02531; AcceRL,
arXiv 2211.15023, section 3):

    L = T² · mean_x KL(softmax(z_teacher/T) ‖ softmax(z_student/T)) + c_v · mean_x (V_student - V_teacher)²

with KL(p ‖ q) = Σ_a p_a (log p_a - log q_a) written out. The student has its own Adam optimizer
and takes ``steps`` full-batch gradient steps per call of ``compress``; the actor runs the student.
Student sizes are the presets of :data:`accerl_jax.networks.STUDENT_PRESETS`.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from accerl_jax import networks, xla
from accerl_jax.compressor.base import Compressor
from accerl_jax.types import ApplyFn


class DistillState(NamedTuple):
    student_params: Any  # flax variables of the student network
    opt_state: Any  # optax state of the student's optimizer
    steps: jax.Array  # [] int32, distillation gradient steps taken so far
    loss: jax.Array  # [] float32, distillation loss at the last step


def distillation_loss(t_logits, t_value, s_logits, s_value, temperature: float, value_coef: float):
    """``T² KL(teacher ‖ student) + c_v MSE(value)``, means over the leading axis.

    Args:
      t_logits, s_logits: ``[N, A]`` float32 logits of teacher and student.
      t_value, s_value: ``[N]`` float32 values.
    Returns:
      ``[]`` float32 loss.
    """
    log_p = jax.nn.log_softmax(t_logits / temperature)
    log_q = jax.nn.log_softmax(s_logits / temperature)
    kl = jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)
    return temperature**2 * jnp.mean(kl) + value_coef * jnp.mean((s_value - t_value) ** 2)


def distill(
    teacher_apply: ApplyFn,
    student: networks.NetworkSpec,
    *,
    steps: int = 4,
    learning_rate: float = 1e-3,
    temperature: float = 1.0,
    value_coef: float = 0.5,
) -> Compressor:
    """Distillation compressor.

    Args:
      teacher_apply: apply function of the learner network (the teacher).
      student: the student's :class:`~accerl_jax.networks.NetworkSpec` (see
        :func:`accerl_jax.networks.student_spec`).
      steps: distillation gradient steps per ``compress`` call (per learner update).
      learning_rate: Adam learning rate of the student.
      temperature: softmax temperature T.
      value_coef: weight c_v of the value MSE.

    Raises:
      ValueError: if ``steps < 0`` or ``temperature <= 0``.
    """
    if steps < 0 or temperature <= 0:
        raise ValueError(f"distill needs steps >= 0 and temperature > 0, got steps={steps}, temperature={temperature}")
    student_apply = networks.make_apply(student)
    optimizer = optax.adam(learning_rate)

    @functools.partial(xla.jit, family=student.family)
    def _step(state: DistillState, obs, t_logits, t_value):
        def loss_fn(p):
            s_logits, s_value = student_apply(p, obs)
            return distillation_loss(t_logits, t_value, s_logits, s_value, temperature, value_coef)

        loss, grads = jax.value_and_grad(loss_fn)(state.student_params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.student_params)
        params = optax.apply_updates(state.student_params, updates)
        return DistillState(params, opt_state, state.steps + 1, loss.astype(jnp.float32))

    @jax.jit
    def _fused(state: DistillState, params, obs):
        t_logits, t_value = teacher_apply(params, obs)
        return jax.lax.fori_loop(0, steps, lambda _, s: _step(s, obs, t_logits, t_value), state)

    teacher = xla.jit(teacher_apply, student.family)
    # Gradient steps of a conv net inside one XLA:CPU loop run ~20x slower than separate calls
    # (docs/DESIGN.md, "Known XLA:CPU pitfall"); MLP students are fused into one call, CNN students are not.
    fuse = student.family == "mlp"

    @jax.jit
    def _init(key):
        student_params = networks.build(student).init(key, jnp.zeros((1,) + student.obs_shape, jnp.float32))
        return DistillState(student_params, optimizer.init(student_params), jnp.zeros((), jnp.int32), jnp.zeros(()))

    def init(params, key):
        state = _init(key)
        return state.student_params, state

    def compress(params, state, obs):
        if obs is None:
            return state.student_params, state
        if fuse:
            state = _fused(state, params, obs)
            return state.student_params, state
        t_logits, t_value = teacher(params, obs)
        for _ in range(steps):
            state = _step(state, obs, t_logits, t_value)
        return state.student_params, state

    return Compressor(init, compress, actor_apply=lambda apply: student_apply)
