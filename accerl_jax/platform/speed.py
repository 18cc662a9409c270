"""Forward-pass timing of a policy, in its fastest jitted configuration (docs/DESIGN.md, "A fair baseline").

:func:`forward_seconds` times ``K`` forward passes inside one jitted ``lax.scan`` (as the Anakin actor
runs them), each on a different ``[B, *obs_shape]`` slice, so XLA can neither hoist nor drop them.
:func:`policy_speedup` times the uncompressed and the compressed policy side by side, interleaved,
each in the fastest of the XLA:CPU configurations tried, and reports the ratio.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from accerl_jax.platform import xla
from accerl_jax.types import ApplyFn

def _scan_forward(apply: ApplyFn, compiler_options):
    def run(params, obs_seq):
        def body(acc, obs):
            logits, _ = apply(params, obs)
            return acc + jnp.sum(logits), None

        return jax.lax.scan(body, jnp.zeros(()), obs_seq)[0]

    return jax.jit(run, compiler_options=compiler_options)


def forward_seconds(fn, params, obs_seq, repeats: int) -> float:
    """Median wall seconds per forward pass of a compiled ``fn(params, obs_seq [K, B, ...])``."""
    jax.block_until_ready(fn(params, obs_seq))  # compile + warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(params, obs_seq))
        times.append(time.perf_counter() - start)
    return float(np.median(times)) / obs_seq.shape[0]


def policy_speedup(
    base_apply: ApplyFn,
    base_params,
    actor_apply: ApplyFn,
    actor_params,
    obs_seq: jax.Array,
    family: str = "mlp",
    rounds: int = 3,
    repeats: int = 5,
    identical: bool = False,
) -> dict:
    """Forward-pass speed of the compressed policy relative to the uncompressed one.

    Args:
      base_apply, base_params: the uncompressed (learner) policy.
      actor_apply, actor_params: the compressed (actor) policy.
      obs_seq: ``[K, B, *obs_shape]`` real observations; ``B`` is the actor's batch size.
      family: network family; conv networks on CPU are timed in every configuration of
        :func:`accerl_jax.platform.xla.candidate_configs` and the fastest is kept for each policy.
      rounds: interleaved measurement rounds (median taken), to share machine noise between the two.
      identical: the actor runs the uncompressed policy itself (``--compressor none``): only it is timed,
        and the speedup is 1 by definition (timing it twice would report noise as a speedup).

    Returns:
      dict with ``base_forward_s`` and ``actor_forward_s`` (seconds per forward pass of ``B``
      observations), ``actor_policy_speedup`` (= base / actor; > 1 means the compressed policy is
      faster), and the configuration each ran in.
    """
    configs = xla.candidate_configs(family)
    base_fns = {n: _scan_forward(base_apply, o) for n, o in configs.items()}
    actor_fns = base_fns if identical else {n: _scan_forward(actor_apply, o) for n, o in configs.items()}
    base_t = {n: [] for n in configs}
    actor_t = base_t if identical else {n: [] for n in configs}
    for _ in range(rounds):
        for n in configs:
            base_t[n].append(forward_seconds(base_fns[n], base_params, obs_seq, repeats))
            if not identical:
                actor_t[n].append(forward_seconds(actor_fns[n], actor_params, obs_seq, repeats))
    base_name = min(configs, key=lambda n: np.median(base_t[n]))
    actor_name = min(configs, key=lambda n: np.median(actor_t[n]))
    base_s = float(np.median(base_t[base_name]))
    actor_s = float(np.median(actor_t[actor_name]))
    return {
        "base_forward_s": base_s,
        "actor_forward_s": actor_s,
        "actor_policy_speedup": base_s / actor_s,
        "base_config": base_name,
        "actor_config": actor_name,
        "forward_batch": int(obs_seq.shape[1]),
    }


def forward_timer(apply: ApplyFn, family: str = "mlp", repeats: int = 3):
    """A timer of ``apply``'s forward pass compiled as the actor runs it (:func:`accerl_jax.platform.xla.options_for`).

    Returns ``timer(params, obs_seq [K, B, *obs_shape]) -> seconds`` per forward pass of ``B`` observations
    (median of ``repeats`` timed scans of ``K`` forwards; the first call also compiles, untimed). The
    compiled function is kept by the timer, so calling it again does not recompile. Used by
    ``--compressor auto`` (:mod:`accerl_jax.compressor.auto`) to rank its candidates.
    """
    fn = _scan_forward(apply, xla.options_for(family))
    return lambda params, obs_seq: forward_seconds(fn, params, obs_seq, repeats)
