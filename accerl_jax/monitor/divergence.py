"""Divergence of the actor's (compressed) policy from the learner's: KL(π_learner ‖ π_actor) and greedy
agreement, for categorical and diagonal Gaussian policies."""
from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.jit
def policy_divergence(learner_logits: jax.Array, actor_logits: jax.Array) -> dict:
    """KL(π_learner ‖ π_actor) and greedy-action agreement, means over ``[N, A]`` logits.

    Returns dict of [] float32: ``kl_learner_actor`` (nats) and ``action_agreement`` (fraction).
    """
    log_p = jax.nn.log_softmax(learner_logits)
    log_q = jax.nn.log_softmax(actor_logits)
    kl = jnp.mean(jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1))
    agree = jnp.mean((jnp.argmax(learner_logits, -1) == jnp.argmax(actor_logits, -1)).astype(jnp.float32))
    return {"kl_learner_actor": kl, "action_agreement": agree}


def gaussian_policy_divergence(learner_out: jax.Array, actor_out: jax.Array) -> dict:
    """The continuous counterpart of :func:`policy_divergence` for diagonal Gaussian policies.

    Args:
      learner_out, actor_out: ``[N, 2D]`` policy outputs (mean then log-std, as
        :class:`accerl_jax.networks.MLPGaussianActorCritic` returns them).

    Returns:
      dict of [] float32: ``kl_learner_actor`` = mean over N of KL(π_learner ‖ π_actor) in nats, closed form
      summed over the D dimensions; ``action_agreement`` = fraction of the N states where the two means are
      within 0.1 learner standard deviations in every dimension (the continuous analogue of equal greedy
      actions).
    """
    m_p, log_s_p = jnp.split(learner_out, 2, axis=-1)
    m_q, log_s_q = jnp.split(actor_out, 2, axis=-1)
    var_p, var_q = jnp.exp(2 * log_s_p), jnp.exp(2 * log_s_q)
    kl = jnp.sum(log_s_q - log_s_p + (var_p + (m_p - m_q) ** 2) / (2 * var_q) - 0.5, axis=-1)
    agree = jnp.all(jnp.abs(m_p - m_q) <= 0.1 * jnp.exp(log_s_p), axis=-1).astype(jnp.float32)
    return {"kl_learner_actor": jnp.mean(kl), "action_agreement": jnp.mean(agree)}
