"""``distill:<student>``: knowledge distillation of the learner (teacher) into a smaller student.

Loss on recent actor observations x (Hinton et al. 2015, https://arxiv.org/abs/1503.02531; AcceRL,
arXiv 2211.15023, section 3):

    L = T² · mean_x KL(softmax(z_teacher/T) ‖ softmax(z_student/T)) + c_v · mean_x (V_student - V_teacher)²

with KL(p ‖ q) = Σ_a p_a (log p_a - log q_a) written out. A continuous-action (diagonal Gaussian)
policy distils with the exact KL of the two Gaussians, summed over the D action dimensions,

    KL(N(m_t, s_t²) ‖ N(m_s, s_s²)) = Σ_d [log s_s - log s_t + (s_t² + (m_t - m_s)²) / (2 s_s²) - 1/2],

where temperature does not apply (T must be 1). The student has its own Adam optimizer
and takes ``steps`` full-batch gradient steps per call of ``compress``; the actor runs the student.
The teacher's outputs on x come from a forward pass of the learner parameters given to ``compress``,
or, given ``compress(..., teacher=(z_teacher, V_teacher))`` (``takes_teacher``), from the learner's own
forward pass over the same observations: no second teacher pass, and the student then tracks the
learner parameters of one update before.
With ``children > 0`` (``--distill-children``, search runs) the student also learns the teacher at the
observations of search roots' children as the search's tree holds them (:func:`children_loss`): the
search compares its actions by ``r + γ V(child)``, so what it needs of the student's value is the
differences between siblings, which a value fitted at the roots alone gets no better than the spread of
the siblings (docs/RESULTS.md, "Breakout-MinAtar past 150k steps"). The teacher's outputs at the children
come from a forward pass of the learner parameters given to ``compress``.
Student sizes are the presets of :data:`accerl_jax.networks.STUDENT_PRESETS`; ``prune:<f>+distill``
fine-tunes the structurally pruned network instead (``init_student``).

Two modes:

* synchronous (default): ``compress`` runs the ``steps`` gradient steps and returns the new student.
* asynchronous (``asynchronous=True``, the paper's distillation "beside the learner"): a background
  thread owns the student and its optimizer. ``compress`` hands it the latest teacher parameters and
  observations (a newer snapshot replaces one not yet started) and returns at once with the student
  published last; the thread runs ``steps`` jitted gradient steps per snapshot and publishes a new
  student with a higher ``version``. The actor thus runs a student that may be one snapshot behind,
  which the Corrector accounts for. The thread is a daemon; jitted steps release the GIL, so it
  overlaps the learner and actor only where there are idle cores (the ``distill_overlap`` benchmark,
  ``python -m experiments.bench run distill_overlap``, measures it). In this mode the ``state`` argument of ``compress`` is not read:
  the state returned is the thread's last published one.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from accerl_jax import networks
from accerl_jax.platform import xla
from accerl_jax.compressor.base import Compressor
from accerl_jax.types import ApplyFn


class DistillState(NamedTuple):
    student_params: Any  # flax variables of the student network
    opt_state: Any  # optax state of the student's optimizer
    steps: jax.Array  # [] int32, distillation gradient steps taken so far
    loss: jax.Array  # [] float32, distillation loss at the last step
    version: jax.Array  # [] int32, students published so far (one per compress call / async snapshot)


def categorical_kl(t_logits, s_logits, temperature: float):
    """``KL(softmax(t/T) ‖ softmax(s/T))`` per row. ``[N, A]`` float32 logits -> ``[N]`` float32 nats."""
    log_p = jax.nn.log_softmax(t_logits / temperature)
    log_q = jax.nn.log_softmax(s_logits / temperature)
    return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)


def gaussian_kl(t_out, s_out):
    """``KL(N_teacher ‖ N_student)`` of diagonal Gaussians per row, summed over action dimensions.

    Args:
      t_out, s_out: ``[N, 2D]`` float32 policy outputs, mean then log-std
        (:class:`~accerl_jax.networks.MLPGaussianActorCritic`).
    Returns:
      ``[N]`` float32 nats.
    """
    t_mean, t_log_std = jnp.split(t_out, 2, axis=-1)
    s_mean, s_log_std = jnp.split(s_out, 2, axis=-1)
    var_ratio = jnp.exp(2.0 * (t_log_std - s_log_std))
    mean_term = jnp.square(t_mean - s_mean) * jnp.exp(-2.0 * s_log_std)
    return jnp.sum(s_log_std - t_log_std + 0.5 * (var_ratio + mean_term) - 0.5, axis=-1)


def distillation_loss(t_logits, t_value, s_logits, s_value, temperature: float, value_coef: float,
                      continuous: bool = False):
    """``T² KL(teacher ‖ student) + c_v MSE(value)``, means over the leading axis.

    Args:
      t_logits, s_logits: ``[N, A]`` float32 logits of teacher and student, or with ``continuous``
        ``[N, 2D]`` Gaussian outputs (mean then log-std; then ``temperature`` must be 1).
      t_value, s_value: ``[N]`` float32 values.
    Returns:
      ``[]`` float32 loss.
    """
    kl = gaussian_kl(t_logits, s_logits) if continuous else categorical_kl(t_logits, s_logits, temperature)
    return temperature**2 * jnp.mean(kl) + value_coef * jnp.mean((s_value - t_value) ** 2)


def children_loss(t_logits, t_value, s_logits, s_value, valid, temperature: float, value_coef: float,
                  sibling_coef: float):
    """The distillation loss at search roots' children, masked to the valid ones:

        mean_valid [T² KL(teacher ‖ student) + c_v (V_s - V_t)²] + c_sib · mean_valid ((V_s - m_s) - (V_t - m_t))²

    where ``m`` is each root's mean value over its valid children (the sibling term: the value differences
    between a root's actions, which decide the search's comparison ``r + γ V(child)``).

    Args:
      t_logits, s_logits: ``[K, A, A']`` float32 logits of teacher and student at ``K`` roots' ``A``
        children (``A'`` actions each).
      t_value, s_value: ``[K, A]`` float32 values there.
      valid: ``[K, A]`` bool, the children to learn (expanded, not past an episode's end).
      temperature, value_coef: as :func:`distillation_loss`; sibling_coef: ``c_sib``.
    Returns:
      ``[]`` float32 loss (0 where no child is valid).
    """
    w = valid.astype(jnp.float32)
    count = jnp.maximum(jnp.sum(w), 1.0)
    kl = categorical_kl(t_logits, s_logits, temperature)
    loss = jnp.sum(w * (temperature**2 * kl + value_coef * (s_value - t_value) ** 2)) / count
    per_root = jnp.maximum(jnp.sum(w, axis=1, keepdims=True), 1.0)
    centred = lambda v: v - jnp.sum(w * v, axis=1, keepdims=True) / per_root  # noqa: E731
    return loss + sibling_coef * jnp.sum(w * (centred(s_value) - centred(t_value)) ** 2) / count


def distill(
    teacher_apply: ApplyFn,
    student: networks.NetworkSpec,
    *,
    steps: int = 4,
    learning_rate: float = 1e-3,
    temperature: float = 1.0,
    value_coef: float = 0.5,
    init_student: Callable[[Any], Any] | None = None,
    asynchronous: bool = False,
    children: int = 0,
    sibling_coef: float = 10.0,
    minibatches: int = 1,
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
      init_student: maps the learner's initial params to the student's initial params (e.g. structured
        pruning); default: a fresh random initialisation of ``student``.
      asynchronous: run distillation in a background thread (see the module docstring).
      children: search roots per ``compress`` call whose children the student also learns
        (:func:`children_loss`; evenly spaced over the ``N`` roots given, all of them where ``children >=
        N``); 0: the roots only. The compressor then declares ``takes_children``.
      sibling_coef: ``c_sib`` of :func:`children_loss`.
      minibatches: ``M``; gradient step ``i`` of a call learns the rows ``i mod M``, ``i mod M + M``, ...
        of the first ``(N // M) * M`` of the ``N`` observations given, and likewise of the ``K`` roots'
        children (all ``N`` or ``K`` rows where fewer than ``M`` are given); 1: every step learns all
        rows. With ``steps = M`` each row is learnt once per call, at ``1 / M`` of the student's cost of
        full-batch steps (the teacher's outputs are computed once for all rows either way).

    Raises:
      ValueError: if ``steps < 0``, ``temperature <= 0``, ``children < 0``, ``sibling_coef < 0`` or
        ``minibatches < 1``, or ``temperature != 1`` or ``children > 0`` for a Gaussian student.
    """
    if steps < 0 or temperature <= 0:
        raise ValueError(f"distill needs steps >= 0 and temperature > 0, got steps={steps}, temperature={temperature}")
    if children < 0 or sibling_coef < 0:
        raise ValueError(f"distill needs children >= 0 and sibling_coef >= 0, got children={children}, "
                         f"sibling_coef={sibling_coef}")
    if minibatches < 1:
        raise ValueError(f"distill needs minibatches >= 1, got {minibatches}")
    continuous = student.action_dim > 0
    if continuous and temperature != 1.0:
        raise ValueError(f"distill of a Gaussian policy takes temperature 1 (the exact KL), got {temperature}")
    if continuous and children:
        raise ValueError("distill of a Gaussian policy takes no search children (a search has discrete actions)")
    student_apply = networks.make_apply(student)
    optimizer = optax.adam(learning_rate)

    def _minibatch(x, i):
        # Rows i mod M, i mod M + M, ... of the first (len(x) // M) * M rows of x (x itself where M == 1).
        if minibatches == 1:
            return x
        n = x.shape[0] // minibatches
        if n == 0:  # fewer rows than minibatches: every step learns them all
            return x
        rows = x[:n * minibatches].reshape((n, minibatches) + x.shape[1:])
        return jax.lax.dynamic_index_in_dim(rows, i % minibatches, axis=1, keepdims=False)

    def _step_on(state: DistillState, i, obs, t_logits, t_value, kids=None):
        # Gradient step i of a call: on minibatch i mod M of the roots and of the children.
        obs, t_logits, t_value = (_minibatch(x, i) for x in (obs, t_logits, t_value))
        kids = None if kids is None else tuple(_minibatch(x, i) for x in kids)
        return _step(state, obs, t_logits, t_value, kids)

    @functools.partial(xla.jit, family=student.family)
    def _step(state: DistillState, obs, t_logits, t_value, kids=None):
        # kids: (child_obs [K, A, *obs], valid [K, A], teacher logits [K, A, A'], teacher values [K, A]).
        def loss_fn(p):
            s_logits, s_value = student_apply(p, obs)
            loss = distillation_loss(t_logits, t_value, s_logits, s_value, temperature, value_coef, continuous)
            if kids is not None:
                c_obs, valid, c_logits, c_value = kids
                cs_logits, cs_value = student_apply(p, _rows(c_obs))
                loss = loss + children_loss(c_logits, c_value, cs_logits.reshape(c_logits.shape),
                                            cs_value.reshape(c_value.shape), valid, temperature, value_coef,
                                            sibling_coef)
            return loss

        loss, grads = jax.value_and_grad(loss_fn)(state.student_params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.student_params)
        params = optax.apply_updates(state.student_params, updates)
        return DistillState(params, opt_state, state.steps + 1, loss.astype(jnp.float32), state.version)

    def _rows(x):  # [K, A, *obs] -> [K * A, *obs]
        return x.reshape((-1,) + x.shape[2:])

    def _kids(params, kids):
        # The K evenly spaced roots' children and the teacher's outputs there, or None (run_steps drops the
        # children where children == 0).
        if kids is None:
            return None
        c_obs, valid = kids
        n = c_obs.shape[0]
        k = min(children, n)
        pick = jnp.arange(k) * (n // k)
        c_obs, valid = c_obs[pick], valid[pick]
        c_logits, c_value = teacher_apply(params, _rows(c_obs))
        return c_obs, valid, c_logits.reshape(valid.shape + c_logits.shape[1:]), c_value.reshape(valid.shape)

    @jax.jit
    def _fused_steps(state: DistillState, obs, t_logits, t_value, kids=None):
        return jax.lax.fori_loop(0, steps, lambda i, s: _step_on(s, i, obs, t_logits, t_value, kids), state)

    @jax.jit
    def _fused(state: DistillState, params, obs, kids=None):
        t_logits, t_value = teacher_apply(params, obs)
        return _fused_steps(state, obs, t_logits, t_value, _kids(params, kids))

    @jax.jit
    def _fused_taught(state: DistillState, params, obs, t_logits, t_value, kids):
        return _fused_steps(state, obs, t_logits, t_value, _kids(params, kids))

    teacher = xla.jit(teacher_apply, student.family)
    kids_teacher = xla.jit(_kids, student.family)
    # Gradient steps of a conv net inside one XLA:CPU loop run many times slower than separate calls
    # (docs/DESIGN.md, "Known XLA:CPU pitfall"); other students (MLP, MinAtar's im2col net) are fused into
    # one call, conv students (xla.is_conv: CNN, IMPALA) are not.
    fuse = not xla.is_conv(student.family)

    @functools.partial(xla.one_shot_jit, family=student.family)  # runs once
    def _init(key, params):
        if init_student is None:
            student_params = networks.build(student).init(key, jnp.zeros((1,) + student.obs_shape, jnp.float32))
        else:
            student_params = init_student(params)
        zero = jnp.zeros((), jnp.int32)
        return DistillState(student_params, optimizer.init(student_params), zero, jnp.zeros(()), zero)

    def run_steps(state, params, obs, outputs=None, kids=None):
        # outputs: the teacher's (logits, values) at obs, from the learner's own forward pass; kids: the
        # search roots' (child_obs, child_valid), or None.
        kids = kids if children else None
        if fuse:
            if outputs is None:
                state = _fused(state, params, obs, kids)
            elif kids is None:
                state = _fused_steps(state, obs, *outputs)
            else:
                state = _fused_taught(state, params, obs, *outputs, kids)
        else:
            t_logits, t_value = teacher(params, obs) if outputs is None else outputs
            taught = None if kids is None else kids_teacher(params, kids)
            for i in range(steps):
                state = _step_on(state, i, obs, t_logits, t_value, taught)
        return state._replace(version=state.version + 1)

    worker = _AsyncWorker(run_steps) if asynchronous else None

    def init(params, key, obs=None):
        state = _init(key, params)
        if worker is not None:
            worker.reset(state)
        return state.student_params, state

    def compress(params, state, obs, teacher=None, children=None):
        if worker is not None:
            if obs is not None:
                worker.submit(params, obs, teacher, children)
            state = worker.latest()
        elif obs is not None:
            state = run_steps(state, params, obs, teacher, children)
        return state.student_params, state

    return Compressor(init, compress, actor_apply=lambda apply: student_apply, timed_stages=("distill",),
                      takes_teacher=True, takes_children=children > 0)


class _AsyncWorker:
    """A daemon thread running ``run_steps(state, params, obs, teacher, children)`` on the newest submitted
    snapshot.

    ``submit`` replaces a snapshot the thread has not started yet (the newest teacher wins); ``latest``
    returns the last published state without waiting; ``wait`` blocks until every submitted snapshot
    has been distilled (for tests and for a clean end of training).
    """

    def __init__(self, run_steps):
        self._run_steps = run_steps
        self._cond = threading.Condition()
        self._state = None
        self._pending = None
        self._busy = False
        self._error = None
        self._thread = threading.Thread(target=self._loop, name="accerl-distill", daemon=True)
        self._thread.start()

    def reset(self, state) -> None:
        with self._cond:
            self._state, self._pending = state, None

    def submit(self, params, obs, teacher=None, children=None) -> None:
        with self._cond:
            self._raise()
            self._pending = (params, obs, teacher, children)
            self._cond.notify_all()

    def latest(self):
        with self._cond:
            self._raise()
            return self._state

    def wait(self):
        with self._cond:
            self._cond.wait_for(lambda: (self._pending is None and not self._busy) or self._error is not None)
            self._raise()
            return self._state

    def _raise(self):
        if self._error is not None:
            raise RuntimeError("asynchronous distillation failed") from self._error

    def _loop(self):
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None)
                (params, obs, teacher, children), self._pending, self._busy = self._pending, None, True
                state = self._state
            try:
                new = jax.block_until_ready(self._run_steps(state, params, obs, teacher, children))
            except Exception as err:  # surfaced to the caller at its next submit/latest
                with self._cond:
                    self._error, self._busy = err, False
                    self._cond.notify_all()
                return
            with self._cond:
                self._state, self._busy = new, False
                self._cond.notify_all()
