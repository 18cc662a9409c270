"""Running statistics of accerl_jax.normalize against numpy on the concatenated data."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from accerl_jax import normalize as nz


def test_chan_combination_of_batches_equals_numpy_on_their_concatenation():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, (n, 4)).astype(np.float32) for n in (5, 17, 1, 40)]
    stats = nz.batch_stats(jnp.asarray(batches[0]))
    for b in batches[1:]:
        stats = nz.combine(stats, nz.batch_stats(jnp.asarray(b)))
    data = np.concatenate(batches)
    np.testing.assert_allclose(stats.count, len(data))
    np.testing.assert_allclose(stats.mean, data.mean(0), rtol=1e-5)
    np.testing.assert_allclose(stats.var, data.var(0), rtol=1e-4)
    # Two halves combined (two devices' shares) equal the whole batch at once (one device).
    whole = nz.batch_stats(jnp.asarray(data))
    halves = nz.combine(nz.batch_stats(jnp.asarray(data[:31])), nz.batch_stats(jnp.asarray(data[31:])))
    np.testing.assert_allclose(halves.mean, whole.mean, rtol=1e-5)
    np.testing.assert_allclose(halves.m2, whole.m2, rtol=1e-4)


def test_normalized_observations_are_standardised_and_clipped():
    rng = np.random.default_rng(1)
    data = rng.normal(-2.0, 5.0, (1000, 3)).astype(np.float32)
    stats = nz.batch_stats(jnp.asarray(data))
    out = np.asarray(nz.normalize_obs(stats, jnp.asarray(data)))
    want = np.clip((data - data.mean(0)) / np.sqrt(data.var(0) + 1e-8), -10, 10)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    far = np.asarray(nz.normalize_obs(stats, jnp.full((1, 3), 1e6, jnp.float32)))
    assert np.all(far == 10.0)


def test_weights_leave_invalid_samples_out():
    data = np.arange(12, dtype=np.float32).reshape(6, 2)
    valid = np.array([1, 0, 1, 1, 0, 1], bool)
    stats = nz.batch_stats(jnp.asarray(data), jnp.asarray(valid))
    np.testing.assert_allclose(stats.mean, data[valid].mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats.var, data[valid].var(0), rtol=1e-5)


def test_statistics_start_as_gyms_running_mean_std():
    """Mean 0, variance 1 with a tiny count: the first rollout (normalised before any statistics) passes
    unchanged, and one batch then outweighs the prior."""
    stats = nz.init_stats((2,))
    x = jnp.asarray([[0.5, -3.0]], jnp.float32)
    np.testing.assert_allclose(nz.normalize_obs(stats, x), x, rtol=1e-6)
    data = np.random.default_rng(3).normal(5.0, 2.0, (50, 2)).astype(np.float32)
    after = nz.combine(stats, nz.batch_stats(jnp.asarray(data)))
    np.testing.assert_allclose(after.mean, data.mean(0), rtol=1e-4)
    np.testing.assert_allclose(after.var, data.var(0), rtol=1e-4)


def _gym_returns(rewards, dones, discount):
    """gym's NormalizeReward accumulator, step by step in numpy (returns seen by the statistics)."""
    g = np.zeros(rewards.shape[1])
    seen = []
    for r, d in zip(rewards, dones):
        g = g * discount + r
        seen.append(g.copy())
        g[d] = 0.0
    return np.stack(seen), g


def test_reward_scaling_resets_the_return_at_episode_ends():
    rng = np.random.default_rng(2)
    t, b, discount = 30, 4, 0.9
    rewards = rng.normal(1.0, 1.0, (t, b)).astype(np.float32)
    dones = rng.random((t, b)) < 0.15  # terminated or truncated
    state = nz.init_state((1,), b, observations=False, rewards=True)
    obs = np.zeros((t, b, 1), np.float32)
    valid = np.ones((t, b), bool)
    # Two rollouts of 15 steps: the accumulator carries over between them.
    for lo in (0, 15):
        sl = slice(lo, lo + 15)
        state = nz.update_from_rollout(state, jnp.asarray(obs[sl]), jnp.asarray(rewards[sl]), jnp.asarray(dones[sl]),
                                       jnp.asarray(valid[sl]), discount)
    seen, end = _gym_returns(rewards, dones, discount)
    np.testing.assert_allclose(state.returns, end, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state.reward.count, t * b + nz.PRIOR_COUNT)
    np.testing.assert_allclose(state.reward.var, seen.var(), rtol=1e-4)
    scaled = np.asarray(nz.scale_reward(state.reward, jnp.asarray(rewards)))
    np.testing.assert_allclose(scaled, np.clip(rewards / np.sqrt(seen.var() + 1e-8), -10, 10), rtol=1e-4)
    assert state.obs is None
