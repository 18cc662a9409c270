"""Tests for accerl_jax.learner: the IMPALA loss, its masking, and the data-parallel update.

The multi-device check needs ``XLA_FLAGS=--xla_force_host_platform_device_count=2``, which JAX only
reads at import, so it runs :func:`_two_device_main` of this module in a subprocess and reports JSON.
"""
import json

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402

from accerl_jax import learner, networks  # noqa: E402
from accerl_jax.types import Rollout  # noqa: E402
from two_devices import run_two_device_main

T, B, OBS_DIM, NUM_ACTIONS = 8, 4, 4, 2
RTOL, ATOL = 1e-5, 1e-6
SPEC = networks.default_spec((OBS_DIM,), NUM_ACTIONS)
APPLY = networks.make_apply(SPEC)


def _params(seed=0):
    """Network params with noise added, so the policy is far from uniform."""
    params = networks.init_params(SPEC, jax.random.PRNGKey(seed))
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
    leaves = [x + 0.1 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    return jax.tree.unflatten(treedef, leaves)


def _batch(seed=0, t=T, b=B):
    """A random float-obs Rollout [t, b] (b >= 4) with terminations, truncations and invalid steps.

    Column 0 is all invalid, column 1 has invalid steps at t=0 and right after each episode end (as
    envpool's reset step), columns 2 and 3 are all valid: the two halves of B=4 hold 5 and 16 valid
    steps. Invalid steps only ever follow an episode end, so they cannot leak into valid targets.
    """
    assert t >= 8 and b >= 4
    rng = np.random.default_rng(seed)
    terminated = np.zeros((t, b), bool)
    truncated = np.zeros((t, b), bool)
    valid = np.ones((t, b), bool)
    valid[:, 0] = False
    terminated[1, 1], truncated[4, 1] = True, True
    valid[[0, 2, 5], 1] = False
    terminated[3, 2], truncated[6, 2] = True, True
    truncated[2, 3], terminated[t - 1, 3] = True, True
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return Rollout(
        obs=f32(rng.normal(size=(t, b, OBS_DIM))),
        action=jnp.asarray(rng.integers(0, NUM_ACTIONS, size=(t, b)), jnp.int32),
        log_prob=f32(np.log(rng.uniform(0.1, 0.9, size=(t, b)))),
        reward=f32(rng.normal(size=(t, b))),
        terminated=jnp.asarray(terminated),
        truncated=jnp.asarray(truncated),
        valid=jnp.asarray(valid),
        next_obs=f32(rng.normal(size=(t, b, OBS_DIM))),
        episode_return=f32(np.zeros((t, b))),
        episode_length=jnp.zeros((t, b), jnp.int32),
    )


def _optimizer():
    return learner.make_optimizer(1e-3, 0.5, 100)


@pytest.fixture(scope="module")
def params():
    return _params()


@pytest.fixture(scope="module")
def batch():
    return _batch()


@pytest.fixture(scope="module")
def single():
    """1-device mesh, optimizer and lazily built, shared ``update`` functions per corrector."""
    mesh = learner.make_mesh(jax.devices()[:1])
    opt = _optimizer()
    cache = {}

    def update(corrector):
        if corrector not in cache:
            cache[corrector] = learner.make_update(APPLY, opt, learner.LossConfig(corrector=corrector), mesh)
        return cache[corrector]

    return mesh, opt, update


def _total_loss(params, batch, cfg):
    """The learner's loss on one device: masked sums over the global count."""
    count, sums = learner.loss_sums(params, APPLY, batch, cfg)
    loss = (sums["pg"] + cfg.value_coef * sums["value"] - cfg.entropy_coef * sums["entropy"])
    return loss / jnp.maximum(count, 1.0)


_loss_and_grad = jax.jit(jax.value_and_grad(_total_loss), static_argnums=2)


def _tolist(tree):
    return [np.asarray(x, np.float64).ravel().tolist() for x in jax.tree.leaves(tree)]


def _assert_trees_close(a, b, rtol=RTOL, atol=ATOL):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def _max_abs_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


# --------------------------------------------------------------------------------------------------
# 1 + 2. Two simulated devices (subprocess)
# --------------------------------------------------------------------------------------------------


def _two_device_main():
    """Run in a subprocess with 2 host devices; prints one JSON line of results."""
    out = {"device_count": jax.device_count()}
    cfg = learner.LossConfig()
    # Plain SGD: the param step is the gradient itself (Adam would hide a wrong gradient scale).
    params, batch, opt = _params(), _batch(), optax.sgd(0.1)
    results = {}
    for n in (1, 2):
        mesh = learner.make_mesh(jax.devices()[:n])
        out[f"mesh{n}_devices"] = int(mesh.devices.size)
        state = learner.init_state(params, opt, mesh)
        update = learner.make_update(APPLY, opt, cfg, mesh)
        new_state, metrics = update(state, batch)
        results[n] = (new_state, {k: float(v) for k, v in metrics.items()})
        if n == 2:
            odd = jax.tree.map(lambda x: x[:, :3], batch)
            try:
                update(state, odd)
                out["odd_error"] = None
            except ValueError as e:
                out["odd_error"] = str(e)
    out["params1"], out["params2"] = _tolist(results[1][0].params), _tolist(results[2][0].params)
    out["params0"] = _tolist(params)
    out["step2"] = int(results[2][0].step)
    out["metrics1"], out["metrics2"] = results[1][1], results[2][1]
    sums_fn = jax.jit(learner.loss_sums, static_argnums=(1, 3))
    count, sums = sums_fn(params, APPLY, batch, cfg)
    out["global_value_loss"] = float(sums["value"] / count)
    loss, grads = _loss_and_grad(params, batch, cfg)
    out["global_loss"], out["global_grad_norm"] = float(loss), float(optax.global_norm(grads))
    half_means, half_counts = [], []
    for sl in (slice(0, B // 2), slice(B // 2, B)):
        half = jax.tree.map(lambda x: x[:, sl], batch)
        c, s = sums_fn(params, APPLY, half, cfg)
        half_means.append(float(s["value"] / c))
        half_counts.append(float(c))
    out["half_counts"] = half_counts
    out["mean_of_half_means"] = float(np.mean(half_means))
    print("RESULT " + json.dumps(out))


@pytest.fixture(scope="module")
def two_device():
    return run_two_device_main("test_learner")


def test_two_device_mesh_really_has_two_devices(two_device):
    assert two_device["device_count"] >= 2
    assert two_device["mesh1_devices"] == 1
    assert two_device["mesh2_devices"] == 2
    assert two_device["step2"] == 1


def test_two_device_update_equals_single_device(two_device):
    p1, p2, p0 = two_device["params1"], two_device["params2"], two_device["params0"]
    assert len(p1) == len(p2) == len(p0)
    for a, b in zip(p1, p2):
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL)
    # The update actually moved the params (the comparison is not between two copies of params0).
    assert max(np.max(np.abs(np.subtract(a, b))) for a, b in zip(p1, p0)) > 1e-4
    m1, m2 = two_device["metrics1"], two_device["metrics2"]
    assert set(m1) == set(m2) == {"loss", "pg_loss", "value_loss", "entropy", "rho_mean", "vs_mean", "grad_norm",
                                  "abs_log_rho_mean", "rho_clipped_frac", "c_clipped_frac"}
    for k in m1:
        np.testing.assert_allclose(m2[k], m1[k], rtol=RTOL, atol=ATOL, err_msg=k)
        assert np.isfinite(m1[k]), k


def test_two_device_value_loss_is_global_masked_mean(two_device):
    assert two_device["half_counts"] == [5.0, 16.0]  # the halves of B hold different numbers of valid steps
    glob = two_device["global_value_loss"]
    for m in (two_device["metrics1"], two_device["metrics2"]):
        np.testing.assert_allclose(m["value_loss"], glob, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(m["loss"], two_device["global_loss"], rtol=RTOL, atol=ATOL)
        # The gradient is that of the global loss (summed once over devices, not N times).
        np.testing.assert_allclose(m["grad_norm"], two_device["global_grad_norm"], rtol=RTOL, atol=ATOL)
    # A mean of per-device means would give a clearly different number: the check above is meaningful.
    mom = two_device["mean_of_half_means"]
    assert abs(mom - glob) > 1e-2 * max(abs(glob), 1e-3), (mom, glob)


def test_two_device_indivisible_batch_raises(two_device):
    msg = two_device["odd_error"]
    assert msg is not None, "B=3 on 2 devices did not raise ValueError"
    assert "B=3" in msg and "2" in msg.replace("B=3", ""), msg


# --------------------------------------------------------------------------------------------------
# 3. Invalid steps carry zero weight
# --------------------------------------------------------------------------------------------------


def _perturb_invalid(batch, seed=1):
    rng = np.random.default_rng(seed)
    inv = ~np.asarray(batch.valid)
    inv_obs = inv[..., None]
    return batch._replace(
        obs=jnp.where(inv_obs, 100.0 * rng.normal(size=batch.obs.shape) + 5.0, batch.obs).astype(jnp.float32),
        next_obs=jnp.where(inv_obs, -50.0 * rng.normal(size=batch.obs.shape), batch.next_obs).astype(jnp.float32),
        reward=jnp.where(inv, 1e3 * rng.normal(size=batch.reward.shape), batch.reward).astype(jnp.float32),
        action=jnp.where(inv, (batch.action + 1) % NUM_ACTIONS, batch.action).astype(jnp.int32),
        log_prob=jnp.where(inv, -7.0, batch.log_prob).astype(jnp.float32),
    )


def test_invalid_rows_do_not_change_loss_or_gradients(params, batch):
    cfg = learner.LossConfig()
    perturbed = _perturb_invalid(batch)
    assert not np.array_equal(np.asarray(perturbed.obs), np.asarray(batch.obs))
    loss, grads = _loss_and_grad(params, batch, cfg)
    loss_p, grads_p = _loss_and_grad(params, perturbed, cfg)
    np.testing.assert_allclose(float(loss_p), float(loss), rtol=1e-6, atol=1e-8)
    _assert_trees_close(grads_p, grads, rtol=1e-6, atol=1e-8)
    # Sanity: the same kind of change to a *valid* step does change the loss.
    valid_changed = batch._replace(reward=batch.reward.at[4, 2].add(3.0))
    assert abs(float(_loss_and_grad(params, valid_changed, cfg)[0]) - float(loss)) > 1e-4


def test_invalid_rows_do_not_change_update(params, batch, single):
    mesh, opt, update = single
    s1, m1 = update("vtrace")(learner.init_state(params, opt, mesh), batch)
    s2, m2 = update("vtrace")(learner.init_state(params, opt, mesh), _perturb_invalid(batch))
    _assert_trees_close(s2.params, s1.params, rtol=1e-6, atol=1e-8)
    for k in m1:
        np.testing.assert_allclose(float(m2[k]), float(m1[k]), rtol=1e-6, atol=1e-8, err_msg=k)


def test_all_invalid_batch_gives_zero_loss_and_no_nan(params, batch):
    loss, grads = _loss_and_grad(params, batch._replace(valid=jnp.zeros_like(batch.valid)), learner.LossConfig())
    assert float(loss) == 0.0
    assert all(np.all(np.asarray(g) == 0.0) for g in jax.tree.leaves(grads))


# --------------------------------------------------------------------------------------------------
# 4. No gradient through the bootstrap value or the behaviour log-prob
# --------------------------------------------------------------------------------------------------


def test_no_gradient_through_bootstrap(params, batch):
    cfg = learner.LossConfig()

    def loss_of(obs, next_obs, log_prob):
        return _total_loss(params, batch._replace(obs=obs, next_obs=next_obs, log_prob=log_prob), cfg)

    g_obs, g_next, g_logp = jax.jit(jax.grad(loss_of, argnums=(0, 1, 2)))(batch.obs, batch.next_obs, batch.log_prob)
    assert np.all(np.asarray(g_next) == 0.0), "gradient flows through V(next_obs)"
    assert np.all(np.asarray(g_logp) == 0.0), "gradient flows through the behaviour log-prob / rho"
    # Sanity: the gradient w.r.t. the current obs of valid steps is not zero.
    assert np.max(np.abs(np.asarray(g_obs)[np.asarray(batch.valid)])) > 1e-6
    # ... and next_obs does enter the loss value (as the bootstrap target).
    loss_jit = jax.jit(loss_of)
    loss = float(loss_jit(batch.obs, batch.next_obs, batch.log_prob))
    loss2 = float(loss_jit(batch.obs, batch.next_obs + 1.0, batch.log_prob))
    assert abs(loss2 - loss) > 1e-5


# --------------------------------------------------------------------------------------------------
# 5. V-trace on on-policy data equals no correction
# --------------------------------------------------------------------------------------------------


def test_vtrace_on_policy_equals_none_and_differs_off_policy(params, batch, single):
    mesh, opt, update = single
    logits, _ = APPLY(params, batch.obs)
    log_pi = jnp.take_along_axis(jax.nn.log_softmax(logits), batch.action[..., None], axis=-1)[..., 0]
    on_policy = batch._replace(log_prob=log_pi)
    off_policy = batch._replace(log_prob=log_pi + 0.5)  # ρ = e^-0.5 < 1 everywhere: below every clip
    run = lambda c, b: update(c)(learner.init_state(params, opt, mesh), b)  # noqa: E731

    s_v, m_v = run("vtrace", on_policy)
    s_n, m_n = run("none", on_policy)
    _assert_trees_close(s_v.params, s_n.params)
    for k in m_v:
        np.testing.assert_allclose(float(m_v[k]), float(m_n[k]), rtol=RTOL, atol=ATOL, err_msg=k)
    np.testing.assert_allclose(float(m_v["rho_mean"]), 1.0, rtol=1e-5)

    s_vo, m_vo = run("vtrace", off_policy)
    s_no, m_no = run("none", off_policy)
    np.testing.assert_allclose(float(m_vo["rho_mean"]), np.exp(-0.5), rtol=1e-5)
    # "none" ignores μ entirely: same update as on-policy.
    _assert_trees_close(s_no.params, s_n.params)
    np.testing.assert_allclose(float(m_no["loss"]), float(m_n["loss"]), rtol=RTOL, atol=ATOL)
    # V-trace corrects: targets, losses and the update change.
    assert abs(float(m_vo["vs_mean"]) - float(m_no["vs_mean"])) > 1e-3
    assert abs(float(m_vo["pg_loss"]) - float(m_no["pg_loss"])) > 1e-4
    assert _max_abs_diff(s_vo.params, s_no.params) > 1e-6


# --------------------------------------------------------------------------------------------------
# 6. The Monitor's importance-ratio statistics and learning rate, from inside the update (issue 6)
# --------------------------------------------------------------------------------------------------


def test_ratio_statistics_and_learning_rate_match_hand_computation(params, batch):
    """mean |log ρ|, the fractions with ρ > ρ̄ and ρ > c̄ over valid steps, and the scheduled rate."""
    cfg = learner.LossConfig(clip_rho_threshold=1.5)  # ρ̄ != c̄ = 1, so the two fractions differ
    mesh = learner.make_mesh(jax.devices()[:1])
    schedule = learner.make_schedule(1e-3, 4)
    opt = learner.make_optimizer(1e-3, 0.5, 4)
    update = learner.make_update(APPLY, opt, cfg, mesh, learning_rate=schedule)
    # Behaviour log-probs spread so that some ratios fall below 1, some in (1, 1.5], some above 1.5.
    rng = np.random.default_rng(3)
    batch = batch._replace(log_prob=jnp.asarray(np.log(rng.uniform(0.05, 0.95, size=(T, B))), jnp.float32))
    logits = np.asarray(APPLY(params, batch.obs)[0], np.float64)
    log_pi_all = logits - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    log_pi = np.take_along_axis(log_pi_all, np.asarray(batch.action)[..., None], -1)[..., 0]
    log_rho = log_pi - np.asarray(batch.log_prob, np.float64)
    valid = np.asarray(batch.valid)
    rho = np.exp(log_rho[valid])
    expected = {"abs_log_rho_mean": np.mean(np.abs(log_rho[valid])), "rho_clipped_frac": np.mean(rho > 1.5),
                "c_clipped_frac": np.mean(rho > 1.0)}
    assert 0 < expected["rho_clipped_frac"] < expected["c_clipped_frac"] < 1, expected  # a meaningful fixture
    # Invalid steps are left out: counting them would change every statistic.
    assert abs(np.mean(np.exp(log_rho) > 1.0) - expected["c_clipped_frac"]) > 1e-3
    state, metrics = update(learner.init_state(params, opt, mesh), batch)
    for k, v in expected.items():
        np.testing.assert_allclose(float(metrics[k]), v, rtol=1e-5, atol=1e-6, err_msg=k)
    # The rate each step used: 1e-3 at step 0, then linearly down (1e-3 * (1 - 1/4) at step 1).
    np.testing.assert_allclose(float(metrics["learning_rate"]), 1e-3, rtol=1e-6)
    _, metrics = update(state, batch)
    np.testing.assert_allclose(float(metrics["learning_rate"]), 0.75e-3, rtol=1e-6)
