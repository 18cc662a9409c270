"""The rules every corrector and loss obeys, checked at the learner level.

A *table* network makes the rules exact and easy to state: observations are integer indices, and
``apply(params, obs)`` looks up logits, value and Q in per-state tables, so the gradient with respect to
one state's table entry is the gradient with respect to that state's value.
"""

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402

from accerl_jax import learner, networks  # noqa: E402
from accerl_jax.actor import sample_action  # noqa: E402
from accerl_jax.monitor import gaussian_policy_divergence, policy_divergence  # noqa: E402
from accerl_jax.types import Rollout, pack_bootstrap_obs  # noqa: E402

A, D = 3, 2
N_STATES = 64


def _table_params(seed=0, continuous=False):
    rng = np.random.default_rng(seed)
    width = 2 * D if continuous else A
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    out = rng.normal(size=(N_STATES, width))
    if continuous:
        out[:, D:] = -0.5 + 0.1 * out[:, D:]  # log-std around -0.5
    return {"pi": f32(out), "v": f32(rng.normal(size=N_STATES)), "q": f32(rng.normal(size=(N_STATES, A)))}


def table_apply(params, obs):
    return params["pi"][obs], params["v"][obs], params["q"][obs]


def table_apply2(params, obs):
    return params["pi"][obs], params["v"][obs]


def _apply_for(cfg):
    return table_apply if cfg.corrector == "retrace" else table_apply2


def _episode_rows(t0, length, end, rng, continuous=False):
    """Rows of one episode: obs indices t0.., next_obs = obs+1, the last next_obs is the final state."""
    obs = np.arange(t0, t0 + length)
    action = rng.normal(size=(length, D)) if continuous else rng.integers(0, A, size=length)
    return dict(
        obs=obs, next_obs=obs + 1, action=action,
        log_prob=np.log(rng.uniform(0.2, 0.9, size=length)), reward=rng.normal(size=length),
        terminated=np.arange(length) == length - 1 if end == "terminate" else np.zeros(length, bool),
        truncated=np.arange(length) == length - 1 if end == "truncate" else np.zeros(length, bool),
        valid=np.ones(length, bool),
    )


def _invalid_rows(n, rng, t0=N_STATES - 8, continuous=False):
    """envpool-like reset/padding rows: not MDP transitions (valid False), arbitrary content."""
    obs = t0 + rng.integers(0, 6, size=n)
    action = rng.normal(size=(n, D)) if continuous else rng.integers(0, A, size=n)
    return dict(obs=obs, next_obs=obs + 1, action=action, log_prob=np.full(n, -3.0), reward=50 * rng.normal(size=n),
                terminated=np.zeros(n, bool), truncated=np.zeros(n, bool), valid=np.zeros(n, bool))


def _column(parts):
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _rollout(columns, continuous=False):
    stack = {k: np.stack([c[k] for c in columns], axis=1) for k in columns[0]}
    t = stack["obs"].shape[0]
    # Invalid rows' next_obs are not the next row's obs, but no valid target reads them (the rows that
    # follow an episode end): the packed rollout drops them, any K holds every column.
    boot = pack_bootstrap_obs(stack["obs"], stack["next_obs"], stack["truncated"], t - 1)
    return Rollout(
        obs=jnp.asarray(stack["obs"], jnp.int32), action=jnp.asarray(stack["action"], jnp.float32 if continuous else jnp.int32),
        log_prob=jnp.asarray(stack["log_prob"], jnp.float32), reward=jnp.asarray(stack["reward"], jnp.float32),
        terminated=jnp.asarray(stack["terminated"]), truncated=jnp.asarray(stack["truncated"]),
        valid=jnp.asarray(stack["valid"]), bootstrap_obs=jnp.asarray(boot, jnp.int32),
        episode_return=jnp.zeros(stack["reward"].shape, jnp.float32),
        episode_length=jnp.zeros(stack["reward"].shape, jnp.int32),
    )


CONFIGS = {
    "vtrace": learner.LossConfig(corrector="vtrace", lambda_=0.9, discount=0.95),
    "is": learner.LossConfig(corrector="is", lambda_=0.9, discount=0.95, clip_rho_threshold=2.0),
    "none": learner.LossConfig(corrector="none", lambda_=0.9, discount=0.95),
    "retrace": learner.LossConfig(corrector="retrace", lambda_=0.9, discount=0.95),
}


def _sums(params, batch, cfg):
    return learner.loss_sums(params, _apply_for(cfg), batch, cfg)


def _appo_sums(params, batch, cfg):
    old = learner.appo_targets(params, table_apply2, batch, cfg)
    return learner.appo_loss_sums(params, table_apply2, batch, old, cfg)


# ------------------------------------------------------------------------------------------------
# Targets are constants: value-loss gradient w.r.t. every bootstrap value is exactly zero.


@pytest.mark.parametrize("name", list(CONFIGS) + ["appo"])
def test_value_loss_gradient_only_through_the_regressed_value(name):
    rng = np.random.default_rng(1)
    cfg = learner.LossConfig(loss="appo", lambda_=0.9, discount=0.95) if name == "appo" else CONFIGS[name]
    col = _column([_episode_rows(0, 6, "terminate", rng), _episode_rows(10, 5, "truncate", rng),
                   _episode_rows(20, 5, "cut", rng)])
    batch = _rollout([col])
    params = _table_params(2)
    fn = _appo_sums if name == "appo" else _sums
    grads = jax.grad(lambda p: fn(p, batch, cfg)[1]["value"])(params)
    obs = np.asarray(batch.obs).ravel()
    others = np.setdiff1d(np.arange(N_STATES), obs)  # bootstrap-only states (final observations, x_T)
    table = "q" if name == "retrace" else "v"
    np.testing.assert_array_equal(np.asarray(grads[table])[others], 0.0)
    if name == "retrace":
        # d/dQ(x_s, ·) of ½(G - Q(x_s,a_s))²: only the taken action, exactly Q - G; nothing through G.
        q_all = np.asarray(params["q"])
        g = np.asarray(grads["q"])
        targets_sum = float(fn(params, batch, cfg)[1]["vs"])
        a = np.asarray(batch.action).ravel()
        expected = np.zeros_like(g)
        # Summed over rows, the gradient is sum_s (Q(x_s, a_s) - G_s): the targets enter as constants.
        np.testing.assert_allclose(g[obs, a].sum(), q_all[obs, a].sum() - targets_sum, rtol=1e-5, atol=1e-5)
        expected[obs, a] = g[obs, a]
        np.testing.assert_array_equal(g, expected)  # no gradient on untaken actions or next states
    else:
        v = np.asarray(params["v"])
        vs_sum = float(fn(params, batch, cfg)[1]["vs"])
        np.testing.assert_allclose(np.asarray(grads["v"])[obs].sum(), v[obs].sum() - vs_sum, rtol=1e-5, atol=1e-5)
    # The policy/Q/V targets do not depend on params through stop_gradient leaks: the gradient of the
    # vs (target) sum is zero everywhere.
    g_targets = jax.grad(lambda p: fn(p, batch, cfg)[1]["vs"])(params)
    for leaf in jax.tree.leaves(g_targets):
        np.testing.assert_array_equal(np.asarray(leaf), 0.0)


# ------------------------------------------------------------------------------------------------
# Concatenated episodes = separate episodes; invalid (reset) rows carry zero weight.


@pytest.mark.parametrize("name", list(CONFIGS) + ["appo"])
@pytest.mark.parametrize("continuous", [False, True], ids=["discrete", "gaussian"])
def test_concatenated_episodes_equal_separate_columns(name, continuous):
    if continuous and name == "retrace":
        pytest.skip("retrace is discrete only (tested to raise below)")
    rng = np.random.default_rng(3)
    cfg = learner.LossConfig(loss="appo", lambda_=0.9, discount=0.95) if name == "appo" else CONFIGS[name]
    ep1 = _episode_rows(0, 5, "terminate", rng, continuous)
    ep2 = _episode_rows(10, 4, "truncate", rng, continuous)
    ep3 = _episode_rows(20, 3, "cut", rng, continuous)
    joined = _column([ep1, ep2, ep3])  # 12 rows
    # The same episodes in separate columns, each followed by invalid reset rows up to 12.
    sep = [_column([ep1, _invalid_rows(7, rng, continuous=continuous)]),
           _column([ep2, _invalid_rows(8, rng, continuous=continuous)]),
           _column([_invalid_rows(9, rng, continuous=continuous), ep3])]
    params = _table_params(4, continuous)
    fn = _appo_sums if name == "appo" else _sums
    c1, s1 = fn(params, _rollout([joined], continuous), cfg)
    c2, s2 = fn(params, _rollout(sep, continuous), cfg)
    assert float(c1) == float(c2) == 12.0
    for k in s1:
        np.testing.assert_allclose(float(s2[k]), float(s1[k]), rtol=1e-5, atol=1e-5, err_msg=k)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_truncation_bootstraps_from_final_observation_termination_does_not(name):
    rng = np.random.default_rng(5)
    cfg = CONFIGS[name]
    col = _column([_episode_rows(0, 4, "terminate", rng), _episode_rows(10, 4, "truncate", rng)])
    batch = _rollout([col])
    params = _table_params(6)
    table = "q" if name == "retrace" else "v"
    base = float(_sums(params, batch, cfg)[1]["vs"])
    # State 4 is the final observation of the terminated episode, state 14 of the truncated one.
    after_term = float(_sums({**params, table: params[table].at[4].add(10.0)}, batch, cfg)[1]["vs"])
    after_trunc = float(_sums({**params, table: params[table].at[14].add(10.0)}, batch, cfg)[1]["vs"])
    assert after_term == base
    assert abs(after_trunc - base) > 1.0


def test_retrace_loss_rejects_continuous_actions():
    rng = np.random.default_rng(7)
    batch = _rollout([_episode_rows(0, 4, "cut", rng, continuous=True)], continuous=True)
    with pytest.raises(ValueError, match="discrete"):
        _sums(_table_params(0, True), batch, CONFIGS["retrace"])


def test_loss_config_rejects_bad_combinations():
    with pytest.raises(ValueError, match="appo"):
        learner.LossConfig(corrector="retrace", loss="appo")
    with pytest.raises(ValueError, match="epochs"):
        learner.LossConfig(epochs=2)
    with pytest.raises(ValueError, match="unknown loss"):
        learner.LossConfig(loss="ppo")


# ------------------------------------------------------------------------------------------------
# Ratios: exp(log π - log μ) summed over action dimensions; exactly 1 on fresh on-policy data.


def test_gaussian_log_prob_is_summed_over_dimensions_and_ratio_is_one_on_policy():
    spec = networks.default_spec((5,), 0, action_dim=3)
    apply = networks.make_apply(spec)
    params = networks.init_params(spec, jax.random.PRNGKey(0))
    obs = jax.random.normal(jax.random.PRNGKey(1), (4, 8, 5))
    action, log_mu = jax.vmap(lambda o, k: sample_action(apply, params, o, k, True))(
        obs, jax.random.split(jax.random.PRNGKey(2), 4))
    assert action.shape == (4, 8, 3) and log_mu.shape == (4, 8)
    out, _ = apply(params, obs)
    mean, log_std = np.split(np.asarray(out, np.float64), 2, axis=-1)
    a = np.asarray(action, np.float64)
    by_hand = np.sum(-0.5 * ((a - mean) / np.exp(log_std)) ** 2 - log_std - 0.5 * np.log(2 * np.pi), axis=-1)
    np.testing.assert_allclose(log_mu, by_hand, rtol=1e-5, atol=1e-5)
    batch = Rollout(obs=obs, action=action, log_prob=log_mu, reward=jnp.ones((4, 8)),
                    terminated=jnp.zeros((4, 8), bool), truncated=jnp.zeros((4, 8), bool),
                    valid=jnp.ones((4, 8), bool), bootstrap_obs=obs[-1:], episode_return=jnp.zeros((4, 8)),
                    episode_length=jnp.zeros((4, 8), jnp.int32))
    for loss in ("actor-critic", "appo"):
        cfg = learner.LossConfig(loss=loss)
        opt = optax.sgd(0.0)
        mesh = learner.make_mesh(jax.devices()[:1])
        _, metrics = learner.make_update(apply, opt, cfg, mesh)(learner.init_state(params, opt, mesh, key=learner.learner_key(0)), batch)
        np.testing.assert_allclose(float(metrics["rho_mean"]), 1.0, atol=1e-6)
    count, sums = learner.loss_sums(params, apply, batch._replace(log_prob=log_mu - 0.3), learner.LossConfig())
    np.testing.assert_allclose(float(sums["rho"] / count), np.exp(0.3), rtol=1e-5)


def test_anakin_rollout_on_policy_ratio_is_one_discrete_and_gaussian():
    from accerl_jax.actor import AnakinActor
    from accerl_jax.envs import GymnaxEnv

    for env_id in ("CartPole-v1", "Pendulum-v1"):
        env = GymnaxEnv(env_id, 4)
        spec = networks.default_spec(env.info.obs_shape, env.info.num_actions, action_dim=env.info.action_dim)
        apply = networks.make_apply(spec)
        params = networks.init_params(spec, jax.random.PRNGKey(0))
        actor = AnakinActor(env, apply, 8)
        _, rollout, _ = actor.rollout(params, actor.reset(jax.random.PRNGKey(1)))
        count, sums = learner.loss_sums(params, apply, rollout, learner.LossConfig())
        np.testing.assert_allclose(float(sums["rho"] / count), 1.0, atol=1e-6, err_msg=env_id)


# ------------------------------------------------------------------------------------------------
# Networks and divergence.


def test_q_head_keeps_two_output_apply_and_discrete_params_unchanged():
    spec = networks.default_spec((4,), 2)
    plain = networks.init_params(spec, jax.random.PRNGKey(0))
    q_spec = networks.default_spec((4,), 2, q_head=True)
    with_q = networks.init_params(q_spec, jax.random.PRNGKey(0))
    assert set(with_q["params"]) == set(plain["params"]) | {"q_head"}
    obs = jnp.ones((3, 4))
    out = networks.make_apply(q_spec)(with_q, obs)
    assert len(out) == 2 and out[0].shape == (3, 2) and out[1].shape == (3,)
    logits, value, q = networks.make_apply_with_q(q_spec)(with_q, obs)
    assert q.shape == (3, 2)
    np.testing.assert_array_equal(logits, out[0])
    with pytest.raises(ValueError):
        networks.make_apply_with_q(spec)
    with pytest.raises(ValueError, match="Q head"):
        networks.default_spec((4,), 0, action_dim=2, q_head=True)
    with pytest.raises(ValueError, match="continuous"):
        networks.default_spec((10, 10, 4), 0, action_dim=2)


def test_gaussian_policy_divergence():
    rng = np.random.default_rng(0)
    p = jnp.asarray(rng.normal(size=(16, 2 * D)), jnp.float32)
    q = p.at[:, :D].add(0.5)
    same = gaussian_policy_divergence(p, p)
    assert float(same["kl_learner_actor"]) == 0.0 and float(same["action_agreement"]) == 1.0
    got = gaussian_policy_divergence(p, q)
    ref = networks.policy_distribution(p, True).kl_divergence(networks.policy_distribution(q, True))
    np.testing.assert_allclose(float(got["kl_learner_actor"]), float(jnp.mean(ref)), rtol=1e-5)
    # The discrete one is unchanged.
    assert set(policy_divergence(p, q)) == set(got)


# Multi-device updates of every loss (retrace, APPO with several epochs, IS, ...) on 2 and 4 devices:
# tests/test_devices.py.
