"""Learner: actor-critic losses on corrected targets, data-parallel over all local devices.

Three losses (``LossConfig.loss`` and ``LossConfig.corrector``):

* IMPALA actor-critic (``loss="actor-critic"`` with corrector ``vtrace``, ``is`` or ``none``), per valid
  step s (Espeholt et al. 2018, https://arxiv.org/abs/1802.01561, section 4):

      -A_s log π(a_s|x_s)  +  c_v · ½ (v_s - V(x_s))²  -  c_H · H(π(·|x_s))

  with (v_s, A_s) from the Corrector.
* Retrace actor-critic (``loss="actor-critic"`` with corrector ``retrace``; discrete actions, a network
  with a Q head): the Q critic is regressed to the Retrace targets G_s (Munos et al. 2016,
  https://arxiv.org/abs/1606.02647), the policy follows the critic's advantage as ACER does (Wang et al.
  2017, https://arxiv.org/abs/1611.01224, eq. 7's first term; no trust region, no bias-correction term,
  which needs μ over all actions and the rollout stores μ of the taken action only):

      -min(ρ̄_pg, ρ_s) (G_s - Σ_a π(a|x_s) Q(x_s, a)) log π(a_s|x_s)
        + c_v · ½ [(G_s - Q(x_s, a_s))² + (Σ_a π(a|x_s) Q(x_s, a) - V(x_s))²]  -  c_H · H(π(·|x_s))

  (the V head regresses to E_π Q, so ``apply(...)[1]`` stays a state value for the compressors).
* APPO (``loss="appo"``, Sample Factory's asynchronous PPO, Petrenko et al. 2020,
  https://arxiv.org/abs/2006.11751): targets (v_s, A_s) from the Corrector once per rollout with the
  parameters θ_old the update starts from, then ``epochs`` passes of ``minibatches`` gradient steps on
  PPO's clipped surrogate (Schulman et al. 2017, https://arxiv.org/abs/1707.06347, eq. 7) with
  r_s = π_θ(a_s|x_s) / π_θold(a_s|x_s): the Corrector removes the actor's (compressed, stale) μ, the
  clip keeps the epochs near θ_old. Minibatches are whole trajectories (columns of ``B``) drawn from one
  permutation of the *global* batch per epoch (:func:`minibatch_columns`, keyed by the run's seed through
  :attr:`LearnerState.key`); with several devices and minibatches each device gathers the batch and takes
  its share of every minibatch, so the update is the same on any number of devices, and every
  minibatch's means are global (psum of sums over psum of counts).

* Search (``loss="search"``, the search agent's, ``--agent search``): cross-entropy to the search's
  action weights and a value regression to n-step returns, :func:`accerl_jax.search.targets.search_loss_sums`.

One forward pass over the rollout: the values (and, for Retrace, logits and Q) a row bootstraps from are
the next row's, from the same pass, with gradients stopped; only the observations no row starts at (the
last row's next observation and the final observations of truncated steps, ``Rollout.bootstrap_obs``,
``K + 1`` rows) take a second, small forward pass (:func:`next_step_outputs`). A terminated step takes
the next row's (the reset observation's) value, which its discount 0 multiplies away.

Continuous actions (a ``[T, B, D]`` float ``action``) use the diagonal Gaussian of
:func:`accerl_jax.networks.policy_distribution`; log-probabilities are summed over the D dimensions. Every term is a *masked* mean over valid steps taken across
devices as ``psum(sum) / psum(count)`` (docs/DESIGN.md), so one update on ``N`` devices equals the
single-device update on the same batch. The batch axis ``B`` is sharded with ``jax.shard_map`` over a
1-D mesh of all local devices; the gradient of the replicated parameters is summed over devices
by ``shard_map`` itself (its transpose of the replicated input is a ``psum``).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from accerl_jax import corrector
from accerl_jax.platform import xla
from accerl_jax.networks import policy_distribution
from accerl_jax.types import ApplyFn, Rollout, bootstrap_slot

AXIS = "batch"
LOSSES = ("actor-critic", "appo", "search")


def loss_conflict(loss: str, corrector_name: str, epochs: int, minibatches: int) -> tuple[str, str] | None:
    """The rule of the losses that these settings break, as ``(rule, reason)``; None when they fit.

    ``rule`` is ``"corrector"`` (not one of :data:`accerl_jax.corrector.CORRECTORS`), ``"loss"`` (not one
    of :data:`LOSSES`), ``"appo-retrace"`` (APPO needs state-value advantages), ``"passes"`` (``epochs``
    or ``minibatches`` below 1) or ``"passes-without-appo"`` (more than one pass needs ``appo``). The one
    home of these rules: :class:`LossConfig` raises ``ValueError(reason)``, the plan a ConfigError naming
    the flags (:func:`accerl_jax.run.plan.make_loss_config`).
    """
    if corrector_name not in corrector.CORRECTORS:
        return "corrector", f"unknown corrector {corrector_name!r}; expected one of {', '.join(corrector.CORRECTORS)}"
    if loss not in LOSSES:
        return "loss", f"unknown loss {loss!r}; expected one of {', '.join(LOSSES)}"
    if loss == "appo" and corrector_name == "retrace":
        return "appo-retrace", ("loss 'appo' needs state-value advantages; use corrector vtrace, is or none, "
                                "not retrace (retrace trains a Q critic with loss 'actor-critic')")
    if epochs < 1 or minibatches < 1:
        return "passes", f"epochs and minibatches must be >= 1, got {epochs} and {minibatches}"
    if loss != "appo" and (epochs, minibatches) != (1, 1):
        return "passes-without-appo", "epochs and minibatches other than 1 need loss 'appo'"
    return None


def batch_conflict(batch_size: int, devices: int, minibatches: int = 1, rollout_length: int | None = None) -> str | None:
    """How a global batch of ``batch_size`` environments fails to split over ``devices`` learner devices
    and ``minibatches`` minibatches: ``"devices"`` (not a multiple of ``devices``), ``"minibatches"`` (not
    of ``devices x minibatches``), or None when it splits. With ``rollout_length`` (APPO's minibatches of
    single transitions, ``--minibatch-unit transitions``) the minibatches split the ``rollout_length x
    batch_size`` transitions instead, so those must be a multiple of ``devices x minibatches``. The one home
    of the rule: the update raises ValueError on it (:func:`make_update`), the plan a ConfigError naming
    ``--num-envs``."""
    if batch_size % devices:
        return "devices"
    if (batch_size * (rollout_length or 1)) % (devices * minibatches):
        return "minibatches"
    return None


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Hyperparameters of the learner's loss.

    Attributes:
      corrector: ``"vtrace"``, ``"retrace"``, ``"is"`` or ``"none"`` (:data:`accerl_jax.corrector.CORRECTORS`).
      loss: ``"actor-critic"`` (IMPALA, or the Retrace actor-critic for ``corrector="retrace"``),
        ``"appo"`` (not with ``retrace``) or ``"search"`` (the search agent's). See the module docstring.
      ppo_clip: APPO's ε, the surrogate clips r_s to [1 - ε, 1 + ε].
      epochs: APPO passes over each rollout.
      minibatches: APPO minibatches per pass (of the global batch ``B``, the same on any device count).
      discount: γ per agent step.
      lambda_: V-trace λ.
      clip_rho_threshold: ρ̄.
      clip_pg_rho_threshold: clip of ρ in the policy-gradient advantage.
      value_coef: c_v.
      entropy_coef: c_H.
      n_step: ``"search"``: horizon of the n-step value targets (:mod:`accerl_jax.search.targets`).
      normalize_advantages: APPO: each minibatch's advantages normalised to mean 0, std 1
        (:func:`normalized_advantages`).
      clip_value: APPO: the value loss is the larger of the squared errors of V_θ and of the clipped
        V_θold + clip(V_θ - V_θold, -ε, ε) (ε = ``ppo_clip``), as CleanRL's PPO (``clip_vloss``) and
        PureJaxRL's (:func:`appo_loss_sums`).
      minibatch_unit: APPO: what a minibatch draws, ``"columns"`` (whole trajectories: columns of the
        ``[T, B]`` batch) or ``"transitions"`` (single steps of the ``T * B``, as PureJaxRL's and
        CleanRL's PPO shuffle them; APPO's targets are computed once per update, before the epochs, so
        no minibatch needs a sequence).
      search_target: ``"search"``: the policy target, ``"search"`` (the search's action weights) or
        ``"learner"`` (recomputed with the learner's prior and value, :mod:`accerl_jax.search.targets`).
      value_target: ``"search"``: ``"n-step"`` (n-step returns, one-player envs) or ``"outcome"`` (the
        game's outcome for the player to move, self-play two-player games: ``--env pgx:<game>``).
    """

    corrector: str = "vtrace"
    discount: float = 0.99
    lambda_: float = 1.0
    clip_rho_threshold: float = 1.0
    clip_pg_rho_threshold: float = 1.0
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    loss: str = "actor-critic"
    ppo_clip: float = 0.2
    epochs: int = 1
    minibatches: int = 1
    n_step: int = 10
    normalize_advantages: bool = False
    clip_value: bool = False
    minibatch_unit: str = "columns"
    search_target: str = "search"
    value_target: str = "n-step"

    def __post_init__(self):
        conflict = loss_conflict(self.loss, self.corrector, self.epochs, self.minibatches)
        if conflict is not None:
            raise ValueError(conflict[1])

    @property
    def optimizer_steps(self) -> int:
        """Optimizer (gradient) steps per rollout: ``epochs * minibatches``."""
        return self.epochs * self.minibatches


# The learner's numeric hyperparameters that change no shape: the update takes them as a traced input
# (:func:`make_update`'s ``hyper``), so that runs differing only in their values share one compiled
# program (the persistent cache's hit) and a sweep vmaps over them. The loss's, then the optimizer's.
LOSS_HYPER = ("discount", "lambda_", "clip_rho_threshold", "clip_pg_rho_threshold", "value_coef", "entropy_coef",
              "ppo_clip")
OPTIMIZER_HYPER = ("learning_rate", "max_grad_norm")
HYPER = LOSS_HYPER + OPTIMIZER_HYPER


def with_hyper(cfg: LossConfig, hyper: dict) -> LossConfig:
    """``cfg`` with its :data:`LOSS_HYPER` fields taken from ``hyper`` (``{name: [] float32}``, traced
    inside a program); the rest (names, pass counts) stay static."""
    return dataclasses.replace(cfg, **{k: hyper[k] for k in LOSS_HYPER})


@dataclasses.dataclass(frozen=True)
class AdamConfig:
    """The learner's optimizer as settings: Adam (ε = 1e-5) after global-norm gradient clipping, the
    learning rate linear from ``learning_rate`` to 0 over ``total_steps`` optimizer steps (optax
    ``linear_schedule``) or constant (``anneal=False``). :func:`make_update` builds it from its traced
    ``hyper`` (``learning_rate``, ``max_grad_norm``), so another value reuses the compiled program;
    ``init`` makes the (value-independent) optimizer state.

    Attributes:
      learning_rate: float, the initial learning rate (the default of ``hyper``).
      max_grad_norm: float, the global-norm clip (the default of ``hyper``).
      total_steps: int, optimizer steps over the run (the schedule's length).
      anneal: bool, anneal linearly to 0 (True) or keep constant.
    """

    learning_rate: float
    max_grad_norm: float
    total_steps: int
    anneal: bool = True

    def schedule(self, learning_rate=None) -> optax.Schedule:
        """The rate per optimizer step (:func:`make_schedule`) from ``learning_rate`` (float or traced
        [] float32; default: :attr:`learning_rate`)."""
        return make_schedule(self.learning_rate if learning_rate is None else learning_rate, self.total_steps,
                             self.anneal)

    def transform(self, learning_rate=None, max_grad_norm=None) -> optax.GradientTransformation:
        """The optax transformation for these values (default: the attributes'), :func:`make_optimizer`."""
        return make_optimizer(self.learning_rate if learning_rate is None else learning_rate,
                              self.max_grad_norm if max_grad_norm is None else max_grad_norm,
                              self.total_steps, self.anneal)

    def init(self, params):
        """The optimizer state for ``params`` (the same structure for every value)."""
        return self.transform().init(params)


def default_hyper(cfg: LossConfig, optimizer) -> dict:
    """``{name: numpy float32 []}``: ``cfg``'s :data:`LOSS_HYPER` values and, for an :class:`AdamConfig`
    ``optimizer``, its :data:`OPTIMIZER_HYPER` values: the ``hyper`` an update takes when given none."""
    values = {k: getattr(cfg, k) for k in LOSS_HYPER}
    if isinstance(optimizer, AdamConfig):
        values.update(learning_rate=optimizer.learning_rate, max_grad_norm=optimizer.max_grad_norm)
    return {k: np.float32(v) for k, v in values.items()}


class LearnerOutputs(NamedTuple):
    """The learner network's outputs at ``batch.obs`` under the parameters an update starts from (its own
    forward pass; gradients stopped). A distillation compressor takes them as its teacher's outputs
    (:class:`accerl_jax.compressor.Compressor` ``takes_teacher``) instead of a second forward pass."""

    policy_out: jax.Array  # [T, B, A] float32 logits, or [T, B, 2D] Gaussian mean then log-std
    value: jax.Array  # [T, B] float32 state values


class LearnerState(NamedTuple):
    params: Any  # flax variables of the learner network
    opt_state: Any  # optax state
    step: jax.Array  # [] int32, optimizer steps taken
    key: jax.Array  # [2] uint32 PRNG key of the learner's own draws (APPO's minibatch order), from the run's seed


def is_continuous(batch: Rollout) -> bool:
    """True when the rollout's actions are continuous (float ``[T, B, D]``)."""
    return bool(jnp.issubdtype(batch.action.dtype, jnp.floating))


def ratio_sums(log_rho: jax.Array, mask: jax.Array, cfg: LossConfig) -> dict:
    """Masked sums of importance-ratio statistics over valid steps (the Monitor's ratio metrics).

    Args:
      log_rho: ``[T, B]`` float32 log ρ_s = log π(a_s|x_s) - log μ(a_s|x_s) (summed over action dimensions).
      mask: ``[T, B]`` float32, 1 on valid steps.
      cfg: its ``clip_rho_threshold`` is ρ̄; c̄ is the trace-coefficient clip of V-trace and Retrace,
        c_s = λ min(c̄, ρ_s) (:data:`accerl_jax.corrector.CLIP_C_THRESHOLD`).

    Returns:
      dict of [] float32 sums over valid steps: ``abs_log_rho`` of |log ρ_s|, ``rho_clipped`` and
      ``c_clipped`` the counts of steps with ρ_s > ρ̄ and ρ_s > c̄ (where min(ρ̄, ρ_s) and min(c̄, ρ_s)
      clip), ``rho_beyond`` the count with ρ_s > ρ̄ · :data:`~accerl_jax.corrector.CLIP_MARGIN` (clipped
      by more than rounding), ``rho_excess`` of max(ρ_s - ρ̄, 0) (the weight clipping removes) and
      ``rho_total`` of ρ_s. The ratio is measured whatever the corrector (``none`` ignores it, so there it
      shows how much correction the run goes without).
    """
    log_rho = jax.lax.stop_gradient(log_rho)
    rho = jnp.exp(log_rho)
    return {
        "abs_log_rho": jnp.sum(mask * jnp.abs(log_rho)),
        "rho_clipped": jnp.sum(mask * (rho > cfg.clip_rho_threshold)),
        "c_clipped": jnp.sum(mask * (rho > corrector.CLIP_C_THRESHOLD)),
        "rho_beyond": jnp.sum(mask * (rho > cfg.clip_rho_threshold * corrector.CLIP_MARGIN)),
        "rho_excess": jnp.sum(mask * jnp.maximum(rho - cfg.clip_rho_threshold, 0.0)),
        "rho_total": jnp.sum(mask * rho),
    }


def next_step_outputs(x_tm1, x_boot, truncated: jax.Array):
    """Network outputs at the destination state of every row, from the rollout's own forward pass.

    Args:
      x_tm1: pytree of ``[T, B, ...]`` outputs at ``batch.obs`` (e.g. ``v_tm1``), times [0, T-1].
      x_boot: the same pytree of ``[K + 1, B, ...]`` outputs at ``batch.bootstrap_obs``.
      truncated: ``[T, B]`` bool.

    Returns:
      pytree of ``[T, B, ...]`` outputs at the next state of each row (e.g. ``v_t``), times [1, T],
      gradients stopped: ``x_tm1[s + 1]`` for ``s < T - 1``, except a truncated row with ``K > 0``, which
      takes its final observation's ``x_boot[slot]`` (:func:`accerl_jax.types.bootstrap_slot`); the last
      row takes ``x_boot[K]``. A terminated row gets the reset observation's output: every use multiplies
      it by ``discount_t = 0``. Equal to the outputs at ``Transition.next_obs`` wherever a bootstrap is
      used (:class:`accerl_jax.types.Rollout`).
    """
    k = jax.tree.leaves(x_boot)[0].shape[0] - 1
    slot = jnp.clip(bootstrap_slot(truncated), 0, max(k - 1, 0))
    trunc = truncated[:-1]

    def one(tm1, boot):
        nxt = tm1[1:]
        if k:  # static: K = 0 rollouts (envpool) hold their final observations in obs
            trailing = (1,) * (tm1.ndim - 2)
            final = jnp.take_along_axis(boot[:k], slot.reshape(slot.shape + trailing), axis=0)
            nxt = jnp.where(trunc.reshape(trunc.shape + trailing), final, nxt)
        return jnp.concatenate([nxt, boot[k:]])

    return jax.lax.stop_gradient(jax.tree.map(one, x_tm1, x_boot))


def loss_sums(params, apply: ApplyFn, batch: Rollout, cfg: LossConfig) -> tuple[jax.Array, dict]:
    """Masked *sums* of the actor-critic loss terms over a (local) ``[T, B]`` batch.

    ``apply`` is ``(params, obs) -> (policy_out, value)``, or ``-> (logits, value, q)``
    (:func:`accerl_jax.networks.make_apply_with_q`) for ``cfg.corrector == "retrace"``. One forward pass
    over ``batch.obs`` ``[T, B]`` and one over ``batch.bootstrap_obs`` ``[K + 1, B]``
    (:func:`next_step_outputs`).

    Returns:
      ``(count, sums)``: ``count`` [] float32 is the number of valid steps; ``sums`` maps
      ``"pg"``, ``"value"``, ``"entropy"``, ``"rho"`` and ``"vs"`` to [] float32 sums over valid steps
      (for retrace, ``"vs"`` sums the Retrace targets G_s), plus the :func:`ratio_sums` of π/μ.

    Raises:
      ValueError: for ``retrace`` with continuous actions.
    """
    return _loss_sums_and_outputs(params, apply, batch, cfg)[:2]


def _loss_sums_and_outputs(params, apply: ApplyFn, batch: Rollout, cfg: LossConfig):
    """:func:`loss_sums` and the :class:`LearnerOutputs` of its forward pass over ``batch.obs``."""
    if cfg.corrector == "retrace":
        return _retrace_loss_sums(params, apply, batch, cfg)
    continuous = is_continuous(batch)
    out, v_tm1 = apply(params, batch.obs)[:2]
    v_t = next_step_outputs(v_tm1, apply(params, batch.bootstrap_obs)[1], batch.truncated)
    pi = policy_distribution(out, continuous)
    log_pi = pi.log_prob(batch.action)
    mask = batch.valid.astype(jnp.float32)
    log_rho = jax.lax.stop_gradient(log_pi) - batch.log_prob
    targets = _value_targets(cfg, v_tm1, v_t, batch, log_rho)
    entropy = pi.entropy()
    sums = {
        "pg": jnp.sum(mask * -targets.pg_advantage * log_pi),
        "value": jnp.sum(mask * 0.5 * (targets.vs - v_tm1) ** 2),
        "entropy": jnp.sum(mask * entropy),
        "rho": jnp.sum(mask * jnp.exp(log_rho)),
        "vs": jnp.sum(mask * targets.vs),
        **ratio_sums(log_rho, mask, cfg),
    }
    return jnp.sum(mask), sums, _outputs(out, v_tm1)


def _outputs(policy_out, value) -> LearnerOutputs:
    return jax.lax.stop_gradient(LearnerOutputs(policy_out.astype(jnp.float32), value.astype(jnp.float32)))


def _discount_and_done(cfg: LossConfig, batch: Rollout):
    discount_t = cfg.discount * (1.0 - batch.terminated.astype(jnp.float32))
    return discount_t, jnp.logical_or(batch.terminated, batch.truncated)


def _value_targets(cfg: LossConfig, v_tm1, v_t, batch: Rollout, log_rho) -> corrector.VTraceOutput:
    """(v_s, A_s) from the state-value corrector ``cfg.corrector``; constants (gradients stopped)."""
    discount_t, done_t = _discount_and_done(cfg, batch)
    return corrector.correct(
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


def _retrace_loss_sums(params, apply, batch: Rollout, cfg: LossConfig):
    """Masked sums of the Retrace actor-critic loss (module docstring); ``apply`` returns Q as well."""
    if is_continuous(batch):
        raise ValueError("corrector 'retrace' supports discrete actions only (it needs Q over all actions)")
    logits, v_tm1, q_tm1 = apply(params, batch.obs)
    logits_boot, _, q_boot = apply(params, batch.bootstrap_obs)
    logits_t, q_t = next_step_outputs((logits, q_tm1), (logits_boot, q_boot), batch.truncated)
    pi = policy_distribution(logits, False)
    log_pi = pi.log_prob(batch.action)
    log_pi_sg = jax.lax.stop_gradient(log_pi)
    mask = batch.valid.astype(jnp.float32)
    discount_t, done_t = _discount_and_done(cfg, batch)
    # Row s bootstraps at x_{s+1}: the next row's action and behaviour prob (the last row's are unused:
    # retrace cuts the trace there).
    a_t = jnp.concatenate([batch.action[1:], batch.action[-1:]])
    log_mu_t = jnp.concatenate([batch.log_prob[1:], jnp.zeros_like(batch.log_prob[-1:])])
    pi_t = jax.nn.softmax(logits_t)
    targets = corrector.retrace(
        jax.lax.stop_gradient(q_tm1), q_t, batch.action, a_t, batch.reward, discount_t, pi_t,
        jnp.exp(log_mu_t), done_t, lambda_=cfg.lambda_,
    )
    q_a = jnp.take_along_axis(q_tm1, batch.action[..., None], axis=-1)[..., 0]
    v_pi = jax.lax.stop_gradient(jnp.sum(jax.nn.softmax(logits) * q_tm1, axis=-1))
    log_rho = log_pi_sg - batch.log_prob
    rho = jnp.exp(log_rho)
    advantage = jax.lax.stop_gradient(jnp.minimum(cfg.clip_pg_rho_threshold, rho) * (targets - v_pi))
    sums = {
        "pg": jnp.sum(mask * -advantage * log_pi),
        "value": jnp.sum(mask * 0.5 * ((targets - q_a) ** 2 + (v_pi - v_tm1) ** 2)),
        "entropy": jnp.sum(mask * pi.entropy()),
        "rho": jnp.sum(mask * rho),
        "vs": jnp.sum(mask * targets),
        **ratio_sums(log_rho, mask, cfg),
    }
    return jnp.sum(mask), sums, _outputs(logits, v_tm1)


class AppoTargets(NamedTuple):
    """Per-rollout APPO targets, computed once with θ_old. Each ``[T, B]`` float32, gradients stopped."""

    log_pi_old: jax.Array  # log π_θold(a_s|x_s)
    vs: jax.Array  # value targets from the corrector
    advantage: jax.Array  # policy-gradient advantages from the corrector
    rho: jax.Array  # π_θold / μ
    log_rho: jax.Array  # log π_θold - log μ
    value: jax.Array  # V_θold(x_s), the value the clipped value loss (LossConfig.clip_value) stays near


def appo_targets(params, apply: ApplyFn, batch: Rollout, cfg: LossConfig) -> AppoTargets:
    """The corrector's targets for APPO with the parameters the update starts from (θ_old); forward
    passes as :func:`loss_sums`."""
    return _appo_targets_and_outputs(params, apply, batch, cfg)[0]


def _appo_targets_and_outputs(params, apply: ApplyFn, batch: Rollout, cfg: LossConfig):
    """:func:`appo_targets` and the :class:`LearnerOutputs` (under θ_old) of its forward pass."""
    out, v_tm1 = apply(params, batch.obs)[:2]
    v_t = next_step_outputs(v_tm1, apply(params, batch.bootstrap_obs)[1], batch.truncated)
    log_pi = policy_distribution(out, is_continuous(batch)).log_prob(batch.action)
    log_rho = log_pi - batch.log_prob
    targets = _value_targets(cfg, v_tm1, v_t, batch, log_rho)
    old = AppoTargets(log_pi, targets.vs, targets.pg_advantage, jnp.exp(log_rho), log_rho, v_tm1)
    return jax.lax.stop_gradient(old), _outputs(out, v_tm1)


def appo_loss_sums(params, apply: ApplyFn, batch: Rollout, old: AppoTargets, cfg: LossConfig):
    """Masked sums of APPO's loss on one (minibatch) ``[T, b]`` batch; keys as :func:`loss_sums`, with
    ``"pg"`` the clipped surrogate -min(r A, clip(r, 1-ε, 1+ε) A) and ``"rho"`` the ratio r = π_θ/π_θold;
    the :func:`ratio_sums` are of the actor's ratio π_θold/μ. ``"value"``: ½ (v_s - V_θ)², or with
    ``cfg.clip_value`` ½ max((v_s - V_θ)², (v_s - V_θold - clip(V_θ - V_θold, -ε, ε))²) (Schulman et al.'s
    PPO code, "The 37 implementation details of PPO", detail 9)."""
    out, v_tm1 = apply(params, batch.obs)[:2]
    pi = policy_distribution(out, is_continuous(batch))
    log_pi = pi.log_prob(batch.action)
    ratio = jnp.exp(log_pi - old.log_pi_old)
    clipped = jnp.clip(ratio, 1.0 - cfg.ppo_clip, 1.0 + cfg.ppo_clip)
    surrogate = jnp.minimum(ratio * old.advantage, clipped * old.advantage)
    value_error = (old.vs - v_tm1) ** 2
    if cfg.clip_value:
        near_old = old.value + jnp.clip(v_tm1 - old.value, -cfg.ppo_clip, cfg.ppo_clip)
        value_error = jnp.maximum(value_error, (old.vs - near_old) ** 2)
    mask = batch.valid.astype(jnp.float32)
    sums = {
        "pg": jnp.sum(mask * -surrogate),
        "value": jnp.sum(mask * 0.5 * value_error),
        "entropy": jnp.sum(mask * pi.entropy()),
        "rho": jnp.sum(mask * jax.lax.stop_gradient(ratio)),
        "vs": jnp.sum(mask * old.vs),
        **ratio_sums(old.log_rho, mask, cfg),
    }
    return jnp.sum(mask), sums


def transitions_as_columns(batch: Rollout, old: AppoTargets) -> tuple[Rollout, AppoTargets]:
    """A ``[T, B]`` batch and its APPO targets as ``[1, T * B]``: every transition its own column, so that
    :func:`minibatch_columns` draws single transitions (``--minibatch-unit transitions``). Only what
    :func:`appo_loss_sums` reads keeps its meaning (``obs``, ``action``, ``valid`` and the targets);
    ``bootstrap_obs``, which has no per-transition row, is replaced by ``obs``."""
    def flat(x):
        return x.reshape((1, x.shape[0] * x.shape[1]) + x.shape[2:])

    fields = {f: flat(getattr(batch, f)) for f in batch._fields if f != "bootstrap_obs"}
    return batch._replace(**fields, bootstrap_obs=fields["obs"]), jax.tree.map(flat, old)


def normalized_advantages(advantage: jax.Array, mask: jax.Array, axis_name: str | None = None) -> jax.Array:
    """``(A - mean) / (std + 1e-8)`` with the masked mean and (population) std of the minibatch's
    advantages, summed over ``axis_name``'s devices when given, so that a minibatch split over devices is
    normalised as one (PureJaxRL's ``ppo.py`` and CleanRL's ``ppo.py`` ``norm_adv``: ``(A - A.mean()) /
    (A.std() + 1e-8)`` per minibatch).

    Args:
      advantage: ``[T, b]`` float32 advantages (this device's part of the minibatch).
      mask: ``[T, b]`` float32, 1 for valid samples; invalid ones count in neither statistic.
      axis_name: the devices' mesh axis inside ``shard_map``, or None on one device.

    Returns:
      ``[T, b]`` float32 normalised advantages, 0 at invalid samples (a minibatch without valid samples,
      whose std is 0, then holds no values divided by 1e-8).
    """
    sums = jnp.stack([jnp.sum(mask), jnp.sum(mask * advantage)])
    if axis_name is not None:
        sums = jax.lax.psum(sums, axis_name)
    count = jnp.maximum(sums[0], 1.0)
    mean = sums[1] / count
    sq = jnp.sum(mask * (advantage - mean) ** 2)
    if axis_name is not None:
        sq = jax.lax.psum(sq, axis_name)
    return jnp.where(mask > 0, (advantage - mean) / (jnp.sqrt(sq / count) + 1e-8), 0.0)


# The learner's stream of a seed: fold_in(PRNGKey(seed), LEARNER_STREAM), apart from the split(., 3) of
# the network, compressor and actor keys (accerl_jax.run.build), whose counters are 0..5.
LEARNER_STREAM = 0x4C524E


def learner_key(seed) -> jax.Array:
    """The learner's PRNG key for a run seed: ``fold_in(PRNGKey(seed), LEARNER_STREAM)``, ``[2]`` uint32.

    Distinct seeds (and the ``--num-seeds`` replicas ``seed + k``) get distinct keys, so they draw
    different minibatch orders."""
    return jax.random.fold_in(jax.random.PRNGKey(seed), LEARNER_STREAM)


def minibatch_columns(key: jax.Array, step, batch_size: int, epochs: int, minibatches: int, num_devices: int = 1,
                      device=0) -> jax.Array:
    """Which trajectories (columns of the global ``[T, B]`` batch) each APPO optimizer step of one device uses.

    Each epoch draws one permutation of the ``B = batch_size`` columns from ``fold_in(key, step)`` and
    ``split`` s it into ``minibatches`` consecutive minibatches of ``B / minibatches`` columns; device ``d``
    of ``num_devices`` takes the ``d``-th equal part of each minibatch. The minibatches are thus the same
    whatever the device count: an update on ``N`` devices takes the same gradient steps as on one (its
    means are global, psum of sums over psum of counts). With ``minibatches == 1`` every step uses the
    whole batch and ``batch_size`` is the device's own share: no permutation, no gather.

    Args:
      key: ``[2]`` uint32, the learner's key (:attr:`LearnerState.key`).
      step: ``[]`` int32 optimizer steps taken before this update (:attr:`LearnerState.step`).
      batch_size: ``B`` (global when ``minibatches > 1``), divisible by ``minibatches * num_devices``.
      device: this device's index on the mesh axis (``lax.axis_index``).

    Returns:
      ``[epochs * minibatches, B / (minibatches * num_devices)]`` int32 column indices (one device's share
      of the global batch when ``minibatches == 1``: ``arange(B)`` every step).
    """
    if minibatches == 1:
        return jnp.broadcast_to(jnp.arange(batch_size, dtype=jnp.int32), (epochs, batch_size))
    keys = jax.random.split(jax.random.fold_in(key, step), epochs)
    perms = jax.vmap(lambda k: jax.random.permutation(k, batch_size))(keys).astype(jnp.int32)
    share = batch_size // (minibatches * num_devices)
    per_device = perms.reshape(epochs * minibatches, num_devices, share)
    return jax.lax.dynamic_index_in_dim(per_device, device, axis=1, keepdims=False)


def make_update(
    apply: ApplyFn,
    optimizer: optax.GradientTransformation,
    cfg: LossConfig,
    mesh: Mesh | None = None,
    family: str = "mlp",
    learning_rate: optax.Schedule | None = None,
    outputs: bool = False,
):
    """Build the jitted, data-parallel ``update(state, batch, hyper=None) -> (state, metrics)``
    (``outputs``: ``-> (state, metrics, LearnerOutputs)``).

    ``hyper`` (``{name: [] float32}``, :data:`HYPER`'s names) holds the numeric hyperparameters as an
    *input* of the compiled program, not constants in it: :data:`LOSS_HYPER` replace ``cfg``'s fields and,
    with an :class:`AdamConfig` optimizer, :data:`OPTIMIZER_HYPER` its learning rate and clip. Runs that
    differ only in these values share one compiled program, and a caller may vmap over them (a sweep).
    None: ``update.hyper`` (:func:`default_hyper`, the values of ``cfg`` and ``optimizer``). A caller that
    traces the update inside a program of its own must pass ``hyper`` as that program's input, or the
    values become its constants again.

    Args:
      apply: learner network apply function; for ``cfg.corrector == "retrace"`` the one that also returns
        Q (:func:`accerl_jax.networks.make_apply_with_q`).
      optimizer: an :class:`AdamConfig` (built from ``hyper``), or an optax transformation (its values
        fixed in the program; its schedule counts optimizer steps: ``cfg.optimizer_steps`` per
        rollout).
      cfg: :class:`LossConfig`.
      mesh: 1-D mesh with axis ``"batch"``; default: all local devices.
      family: network family, for the compiler options (:func:`accerl_jax.platform.xla.options_for`) and, with APPO,
        whether its gradient steps are unrolled (:func:`accerl_jax.platform.xla.gradient_loop_unroll`: conv nets on
        XLA:CPU).
      learning_rate: an optax transformation's schedule (:func:`make_schedule`), to report the learning
        rate of each step as the metric ``learning_rate``; None: not reported. An :class:`AdamConfig`'s
        rate is always reported.
      outputs: also return the :class:`LearnerOutputs` ``[T, B, ...]`` of the update's own forward pass
        over ``batch.obs`` under the parameters it starts from (APPO: θ_old), sharded like the batch: the
        teacher's outputs a distillation compressor reuses (no second forward pass).

    Returns:
      ``update``: takes :class:`LearnerState` (replicated) and a :class:`Rollout` ``[T, B, ...]`` with
      ``B`` divisible by the number of devices (times ``cfg.minibatches`` for APPO); returns the new state
      and a dict of [] float32 metrics (``loss``, ``pg_loss``, ``value_loss``, ``entropy``, ``rho_mean``,
      ``vs_mean``, ``grad_norm``; the actor's importance ratios ρ = π/μ over valid steps:
      ``abs_log_rho_mean`` = mean |log ρ|, ``rho_clipped_frac`` and ``c_clipped_frac`` = fractions of
      steps with ρ > ρ̄ (``clip_rho_threshold``) and ρ > c̄ (:data:`accerl_jax.corrector.CLIP_C_THRESHOLD`),
      ``rho_beyond_frac`` = the fraction with ρ > ρ̄ · :data:`~accerl_jax.corrector.CLIP_MARGIN`,
      ``rho_clipped_mass`` = Σ max(ρ - ρ̄, 0) / Σ ρ, the share of the ratios' weight clipping removes;
      ``learning_rate`` if a schedule is given; for APPO the means over its ``epochs * minibatches`` steps,
      ``rho_mean`` is the PPO ratio π_θ/π_θold and the ratio statistics are of π_θold/μ).
      ``state.step`` counts optimizer steps. Every mean is a global masked mean, psum(sum) / psum(count).
      Raises ValueError (when called) if ``B`` is not divisible as required.
    """
    mesh = mesh or make_mesh()
    n_dev = mesh.devices.size
    platform = mesh.devices.flat[0].platform
    defaults = default_hyper(cfg, optimizer)
    traced_optimizer = isinstance(optimizer, AdamConfig)

    def _grad_step(state: LearnerState, sums_fn, cfg: LossConfig, opt, schedule):
        """One optimizer step on the global masked-mean loss of ``sums_fn(params) -> (count, sums, aux)``;
        returns ``(state, metrics, aux)``."""

        def total_loss(params):
            count, sums, aux = sums_fn(params)
            count = jax.lax.psum(count, AXIS)
            count = jnp.maximum(count, 1.0)
            loss = (sums["pg"] + cfg.value_coef * sums["value"] - cfg.entropy_coef * sums["entropy"]) / count
            return loss, (count, sums, aux)

        (loss, (count, sums, aux)), grads = jax.value_and_grad(total_loss, has_aux=True)(state.params)
        # No psum of grads here: params are replicated (P()), so under shard_map's varying-axes checking
        # (check_vma=True) their gradient already is the sum over devices; a second psum doubled it.
        sums = jax.lax.psum(sums, AXIS)
        updates, opt_state = opt.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {
            "loss": jax.lax.psum(loss, AXIS),
            "pg_loss": sums["pg"] / count,
            "value_loss": sums["value"] / count,
            "entropy": sums["entropy"] / count,
            "rho_mean": sums["rho"] / count,
            "vs_mean": sums["vs"] / count,
            "grad_norm": optax.global_norm(grads),
            "abs_log_rho_mean": sums["abs_log_rho"] / count,
            "rho_clipped_frac": sums["rho_clipped"] / count,
            "c_clipped_frac": sums["c_clipped"] / count,
            "rho_beyond_frac": sums["rho_beyond"] / count,
            "rho_clipped_mass": sums["rho_excess"] / jnp.maximum(sums["rho_total"], 1e-30),
        }
        if schedule is not None:  # the rate this step used: optax's schedule counts steps from 0
            metrics["learning_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
        return LearnerState(params, opt_state, state.step + 1, state.key), metrics, aux

    def _local(state: LearnerState, batch: Rollout, hyper: dict):
        cfg_h = with_hyper(cfg, hyper)
        if traced_optimizer:
            opt = optimizer.transform(hyper["learning_rate"], hyper["max_grad_norm"])
            schedule = optimizer.schedule(hyper["learning_rate"])
        else:
            opt, schedule = optimizer, learning_rate
        grad_step = functools.partial(_grad_step, cfg=cfg_h, opt=opt, schedule=schedule)
        if cfg.loss == "search":  # the search agent's loss; its package imports this module, hence here
            from accerl_jax.search.targets import search_loss_sums

            return grad_step(state, lambda p: search_loss_sums(p, apply, batch, cfg_h))
        if cfg.loss != "appo":
            return grad_step(state, lambda p: _loss_sums_and_outputs(p, apply, batch, cfg_h))
        old, teacher = _appo_targets_and_outputs(state.params, apply, batch, cfg_h)
        if cfg.minibatches > 1 and n_dev > 1:
            # Minibatches are drawn from the *global* batch: every device holds all of it (its columns in
            # device order, as sharded) and takes its share of each minibatch's columns.
            batch, old = jax.lax.all_gather((batch, old), AXIS, axis=1, tiled=True)
        if cfg.minibatch_unit == "transitions" and cfg.minibatches > 1:
            batch, old = transitions_as_columns(batch, old)
        idx = minibatch_columns(state.key, state.step, batch.action.shape[1], cfg.epochs, cfg.minibatches,
                                n_dev, jax.lax.axis_index(AXIS) if cfg.minibatches > 1 else 0)

        def step(st, cols):
            take = lambda x: jnp.take(x, cols, axis=1)  # noqa: E731
            sub, sub_old = jax.tree.map(take, batch), jax.tree.map(take, old)
            if cfg.normalize_advantages:
                mask = sub.valid.astype(jnp.float32)
                sub_old = sub_old._replace(advantage=normalized_advantages(sub_old.advantage, mask, AXIS))
            return grad_step(st, lambda p: (*appo_loss_sums(p, apply, sub, sub_old, cfg_h), ()))[:2]

        steps = cfg.optimizer_steps
        state, metrics = jax.lax.scan(step, state, idx, unroll=xla.gradient_loop_unroll(family, steps, platform))
        return state, jax.tree.map(jnp.mean, metrics), teacher

    def _local_out(state: LearnerState, batch: Rollout, hyper: dict):
        return _local(state, batch, hyper) if outputs else _local(state, batch, hyper)[:2]

    batch_spec = P(None, AXIS)
    out_specs = (P(), P(), batch_spec) if outputs else (P(), P())
    sharded = jax.shard_map(_local_out, mesh=mesh, in_specs=(P(), batch_spec, P()), out_specs=out_specs)
    jitted = xla.jit(sharded, family)

    def update(state: LearnerState, batch: Rollout, hyper: dict | None = None):
        b = batch.action.shape[1]
        transitions = cfg.minibatch_unit == "transitions" and cfg.minibatches > 1
        conflict = batch_conflict(b, n_dev, cfg.minibatches, batch.action.shape[0] if transitions else None)
        if conflict == "devices":
            raise ValueError(f"batch size B={b} is not divisible by the {n_dev} learner devices; use a multiple of {n_dev}")
        if conflict == "minibatches":
            what = f"T x B={batch.action.shape[0] * b} transitions" if transitions else f"batch size B={b}"
            raise ValueError(f"{what} is not divisible by {n_dev} devices x {cfg.minibatches} minibatches; "
                             f"use a multiple of {n_dev * cfg.minibatches}")
        return jitted(state, batch, defaults if hyper is None else hyper)

    update.hyper = defaults
    return update


def make_mesh(devices=None) -> Mesh:
    """A 1-D mesh named ``"batch"`` over ``devices`` (default: all local devices; a multi-host run passes
    ``jax.devices()``, the devices of every process, and feeds the update through
    :func:`accerl_jax.run.shards.make_global_update`)."""
    devices = jax.local_devices() if devices is None else devices
    return Mesh(np.asarray(devices), (AXIS,))


def init_state(params, optimizer: optax.GradientTransformation, mesh: Mesh | None = None, *,
               key: jax.Array) -> LearnerState:
    """Fresh :class:`LearnerState` for ``params``, replicated over ``mesh`` (default: all local devices).

    ``key`` ([2] uint32, e.g. :func:`learner_key` of the run's seed) seeds the learner's own draws; it is
    part of the state, so a checkpoint carries it and a resumed run draws what the uninterrupted one would.

    Placing it with the same sharding that ``update`` returns keeps ``update`` from compiling twice.
    """
    mesh = mesh or make_mesh()
    make = xla.one_shot_jit(lambda p, k: LearnerState(p, optimizer.init(p), jnp.zeros((), jnp.int32), k),
                            out_shardings=NamedSharding(mesh, P()))
    return make(params, key)


class Learner(NamedTuple):
    """The Learner component (docs/DESIGN.md) as a pair of pure functions, in optax's manner
    (``GradientTransformation(init, update)``); :func:`make_learner` builds it.

    ``init(params, key) -> LearnerState``: a fresh state for ``params`` (``key``: ``[2]`` uint32, e.g.
    :func:`learner_key` of the run's seed), replicated over the state's mesh (:func:`init_state`).
    ``update(state, batch) -> (state, metrics)`` (with ``outputs``: ``(state, metrics, LearnerOutputs)``):
    one jitted, data-parallel update on a :class:`~accerl_jax.types.Rollout` ``[T, B, ...]``
    (:func:`make_update`, which documents the metrics and the errors).
    """

    init: Callable[[Any, jax.Array], "LearnerState"]
    update: Callable


def make_learner(
    apply: ApplyFn,
    optimizer: optax.GradientTransformation,
    cfg: LossConfig,
    mesh: Mesh | None = None,
    *,
    family: str = "mlp",
    learning_rate: optax.Schedule | None = None,
    outputs: bool = False,
    state_mesh: Mesh | None = None,
) -> Learner:
    """The :class:`Learner` pair for a loss, an optimizer and a mesh.

    Args:
      apply, optimizer, cfg, mesh, family, learning_rate, outputs: as :func:`make_update`.
      state_mesh: where ``init`` places the state (default: ``mesh``); a multi-process run whose update
        assembles the global batch (:func:`accerl_jax.run.shards.make_global_update`) keeps a process-local
        state on one device.

    Returns:
      ``Learner(init, update)``; ``update`` raises ValueError (when called) for a batch that does not split
      over the devices and minibatches.
    """
    mesh = mesh or make_mesh()
    state_mesh = state_mesh or mesh

    def init(params, key: jax.Array) -> LearnerState:
        return init_state(params, optimizer, state_mesh, key=key)

    return Learner(init, make_update(apply, optimizer, cfg, mesh, family, learning_rate, outputs))


def make_schedule(learning_rate: float, total_updates: int, anneal: bool = True) -> optax.Schedule:
    """The learner's learning rate per optimizer step: linear from ``learning_rate`` to 0 over
    ``total_updates`` steps (optax ``linear_schedule``), or constant if not ``anneal``."""
    if not anneal:
        return optax.constant_schedule(learning_rate)
    return optax.linear_schedule(learning_rate, 0.0, max(total_updates, 1))


def make_optimizer(learning_rate: float, max_grad_norm: float, total_updates: int, anneal: bool = True):
    """Adam with global-norm clipping, learning rate :func:`make_schedule` (linearly annealed to 0 over
    ``total_updates``)."""
    lr = make_schedule(learning_rate, total_updates) if anneal else learning_rate
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(lr, eps=1e-5))
