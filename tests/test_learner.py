"""Tests for accerl_jax.learner: the IMPALA loss, its masking, and the data-parallel update.

The multi-device check needs ``XLA_FLAGS=--xla_force_host_platform_device_count=2``, which JAX only
reads at import, so it runs :func:`_two_device_main` of this module in a subprocess and reports JSON.
"""
import dataclasses
import json

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402

from accerl_jax import learner, networks  # noqa: E402
from accerl_jax.types import Rollout, pack_bootstrap_obs  # noqa: E402
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
    return _batch_and_next_obs(seed, t, b)[0]


def _batch_and_next_obs(seed=0, t=T, b=B):
    """:func:`_batch` and its true next observations ``next_obs [t, b, OBS_DIM]``: the next row's obs
    inside an episode, random where an episode ended and at the last row."""
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
    obs = rng.normal(size=(t, b, OBS_DIM)).astype(np.float32)
    next_obs = _next_obs_of(obs, terminated | truncated, rng)
    batch = Rollout(
        obs=f32(obs),
        action=jnp.asarray(rng.integers(0, NUM_ACTIONS, size=(t, b)), jnp.int32),
        log_prob=f32(np.log(rng.uniform(0.1, 0.9, size=(t, b)))),
        reward=f32(rng.normal(size=(t, b))),
        terminated=jnp.asarray(terminated),
        truncated=jnp.asarray(truncated),
        valid=jnp.asarray(valid),
        bootstrap_obs=f32(pack_bootstrap_obs(obs, next_obs, truncated, t - 1)),
        episode_return=f32(np.zeros((t, b))),
        episode_length=jnp.zeros((t, b), jnp.int32),
    )
    return batch, f32(next_obs)


def _next_obs_of(obs, done, rng):
    """True next observations for ``obs [t, b, ...]``: the next row's, random at ``done`` and the last row."""
    next_obs = np.concatenate([obs[1:], obs[-1:]])
    ends = done.copy()
    ends[-1] = True
    next_obs[ends] = rng.normal(size=next_obs[ends].shape)
    return next_obs.astype(obs.dtype)


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
        state = learner.init_state(params, opt, mesh, key=learner.learner_key(0))
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
    # APPO with --normalize-advantages: each minibatch normalised over the global minibatch, on 1 and 2 devices.
    for norm in (False, True):
        appo = learner.LossConfig(loss="appo", epochs=2, minibatches=2, normalize_advantages=norm)
        for n in (1, 2):
            mesh = learner.make_mesh(jax.devices()[:n])
            state = learner.init_state(params, opt, mesh, key=learner.learner_key(0))
            new_state, _ = learner.make_update(APPLY, opt, appo, mesh)(state, batch)
            out[f"appo_norm{int(norm)}_params{n}"] = _tolist(new_state.params)
    # --minibatch-unit transitions: single transitions drawn from the global batch, on 1 and 2 devices.
    appo = learner.LossConfig(loss="appo", epochs=2, minibatches=2, minibatch_unit="transitions")
    for n in (1, 2):
        mesh = learner.make_mesh(jax.devices()[:n])
        state = learner.init_state(params, opt, mesh, key=learner.learner_key(0))
        out[f"appo_transitions_params{n}"] = _tolist(learner.make_update(APPLY, opt, appo, mesh)(state, batch)[0].params)
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
                                  "abs_log_rho_mean", "rho_clipped_frac", "c_clipped_frac", "rho_beyond_frac",
                                  "rho_clipped_mass"}
    for k in m1:
        np.testing.assert_allclose(m2[k], m1[k], rtol=RTOL, atol=ATOL, err_msg=k)
        assert np.isfinite(m1[k]), k


def _assert_one_device_equals_two_and_differs(results, name, other):
    """``<name>_params1`` (1 device) equals ``<name>_params2`` (2 devices), and differs from
    ``<other>_params1`` (another APPO option set's update) by more than 1e-4 somewhere."""
    for a, b in zip(results[f"{name}_params1"], results[f"{name}_params2"], strict=True):
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL)
    diff = max(np.max(np.abs(np.subtract(a, b))) for a, b in zip(results[f"{name}_params1"], results[f"{other}_params1"]))
    assert diff > 1e-4


def test_two_device_normalized_advantages_equal_single_device_and_change_the_update(two_device):
    """--normalize-advantages normalises each minibatch as one over the devices: 1 and 2 devices agree,
    and the update differs from APPO's without it."""
    _assert_one_device_equals_two_and_differs(two_device, "appo_norm1", "appo_norm0")
    _assert_one_device_equals_two_and_differs(two_device, "appo_norm0", "appo_norm1")


def test_two_device_transition_minibatches_equal_single_device_and_change_the_update(two_device):
    _assert_one_device_equals_two_and_differs(two_device, "appo_transitions", "appo_norm0")


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
    # The next observations of invalid steps: the next row's obs (perturbed above), or the last row's in
    # bootstrap_obs (invalid steps are never truncated, so no other slot holds one).
    inv_last = inv[-1][:, None]
    boot = batch.bootstrap_obs
    return batch._replace(
        obs=jnp.where(inv_obs, 100.0 * rng.normal(size=batch.obs.shape) + 5.0, batch.obs).astype(jnp.float32),
        bootstrap_obs=boot.at[-1].set(jnp.where(inv_last, -50.0 * rng.normal(size=boot.shape[1:]), boot[-1])
                                      ).astype(jnp.float32),
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
    s1, m1 = update("vtrace")(learner.init_state(params, opt, mesh, key=learner.learner_key(0)), batch)
    s2, m2 = update("vtrace")(learner.init_state(params, opt, mesh, key=learner.learner_key(0)), _perturb_invalid(batch))
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

    def loss_of(obs, bootstrap_obs, log_prob):
        return _total_loss(params, batch._replace(obs=obs, bootstrap_obs=bootstrap_obs, log_prob=log_prob), cfg)

    g_obs, g_next, g_logp = jax.jit(jax.grad(loss_of, argnums=(0, 1, 2)))(batch.obs, batch.bootstrap_obs,
                                                                           batch.log_prob)
    assert np.all(np.asarray(g_next) == 0.0), "gradient flows through V(bootstrap_obs)"
    assert np.all(np.asarray(g_logp) == 0.0), "gradient flows through the behaviour log-prob / rho"
    # Sanity: the gradient w.r.t. the current obs of valid steps is not zero.
    assert np.max(np.abs(np.asarray(g_obs)[np.asarray(batch.valid)])) > 1e-6
    # ... and bootstrap_obs does enter the loss value (as the bootstrap target).
    loss_jit = jax.jit(loss_of)
    loss = float(loss_jit(batch.obs, batch.bootstrap_obs, batch.log_prob))
    loss2 = float(loss_jit(batch.obs, batch.bootstrap_obs + 1.0, batch.log_prob))
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
    run = lambda c, b: update(c)(learner.init_state(params, opt, mesh, key=learner.learner_key(0)), b)  # noqa: E731

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
# 6. The Monitor's importance-ratio statistics and learning rate, from inside the update
# --------------------------------------------------------------------------------------------------


def test_ratio_sums_count_clipping_beyond_float_noise_and_the_weight_it_removes():
    """At ρ̄ = 1: ρ = 1.05 is clipped but not beyond ρ̄ · 1.1; the clipped mass is Σ max(ρ - 1, 0) / Σ ρ."""
    rho = np.array([[0.5, 1.05, 1.2, 2.0, 3.0]], np.float32)
    mask = np.array([[1, 1, 1, 1, 0]], np.float32)  # the last step is invalid
    sums = learner.ratio_sums(jnp.log(rho), mask, learner.LossConfig(clip_rho_threshold=1.0))
    assert float(sums["rho_clipped"]) == 3 and float(sums["rho_beyond"]) == 2
    np.testing.assert_allclose(float(sums["rho_excess"]) / float(sums["rho_total"]), 1.25 / 4.75, rtol=1e-6)


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
                "c_clipped_frac": np.mean(rho > 1.0), "rho_beyond_frac": np.mean(rho > 1.5 * 1.1),
                "rho_clipped_mass": np.sum(np.maximum(rho - 1.5, 0)) / np.sum(rho)}
    assert 0 < expected["rho_beyond_frac"] <= expected["rho_clipped_frac"]  # a meaningful fixture
    assert 0 < expected["rho_clipped_frac"] < expected["c_clipped_frac"] < 1, expected  # a meaningful fixture
    # Invalid steps are left out: counting them would change every statistic.
    assert abs(np.mean(np.exp(log_rho) > 1.0) - expected["c_clipped_frac"]) > 1e-3
    state, metrics = update(learner.init_state(params, opt, mesh, key=learner.learner_key(0)), batch)
    for k, v in expected.items():
        np.testing.assert_allclose(float(metrics[k]), v, rtol=1e-5, atol=1e-6, err_msg=k)
    # The rate each step used: 1e-3 at step 0, then linearly down (1e-3 * (1 - 1/4) at step 1).
    np.testing.assert_allclose(float(metrics["learning_rate"]), 1e-3, rtol=1e-6)
    _, metrics = update(state, batch)
    np.testing.assert_allclose(float(metrics["learning_rate"]), 0.75e-3, rtol=1e-6)


# --------------------------------------------------------------------------------------------------
# 7. One forward pass over obs (plus bootstrap_obs) equals the two-forward learner over obs and next_obs
# --------------------------------------------------------------------------------------------------
# The oracle: the learner as it was, applying the network to every row's true next observation.


def _ref_loss_sums(params, apply, batch, next_obs, cfg):
    """Two-forward reference of :func:`learner.loss_sums`: V (or logits and Q) of ``next_obs [T, B]``."""
    if cfg.corrector == "retrace":
        return _ref_retrace_loss_sums(params, apply, batch, next_obs, cfg)
    out, v_tm1 = apply(params, batch.obs)[:2]
    v_t = jax.lax.stop_gradient(apply(params, next_obs)[1])
    pi = networks.policy_distribution(out, learner.is_continuous(batch))
    log_pi = pi.log_prob(batch.action)
    mask = batch.valid.astype(jnp.float32)
    log_rho = jax.lax.stop_gradient(log_pi) - batch.log_prob
    targets = learner._value_targets(cfg, v_tm1, v_t, batch, log_rho)
    sums = {
        "pg": jnp.sum(mask * -targets.pg_advantage * log_pi),
        "value": jnp.sum(mask * 0.5 * (targets.vs - v_tm1) ** 2),
        "entropy": jnp.sum(mask * pi.entropy()),
        "rho": jnp.sum(mask * jnp.exp(log_rho)),
        "vs": jnp.sum(mask * targets.vs),
        **learner.ratio_sums(log_rho, mask, cfg),
    }
    return jnp.sum(mask), sums


def _ref_retrace_loss_sums(params, apply, batch, next_obs, cfg):
    from accerl_jax import corrector

    logits, v_tm1, q_tm1 = apply(params, batch.obs)
    logits_t, _, q_t = jax.lax.stop_gradient(apply(params, next_obs))
    pi = networks.policy_distribution(logits, False)
    log_pi = pi.log_prob(batch.action)
    mask = batch.valid.astype(jnp.float32)
    discount_t = cfg.discount * (1.0 - batch.terminated.astype(jnp.float32))
    done_t = batch.terminated | batch.truncated
    a_t = jnp.concatenate([batch.action[1:], batch.action[-1:]])
    log_mu_t = jnp.concatenate([batch.log_prob[1:], jnp.zeros_like(batch.log_prob[-1:])])
    targets = corrector.retrace(jax.lax.stop_gradient(q_tm1), q_t, batch.action, a_t, batch.reward, discount_t,
                                jax.nn.softmax(logits_t), jnp.exp(log_mu_t), done_t, lambda_=cfg.lambda_)
    q_a = jnp.take_along_axis(q_tm1, batch.action[..., None], axis=-1)[..., 0]
    v_pi = jax.lax.stop_gradient(jnp.sum(jax.nn.softmax(logits) * q_tm1, axis=-1))
    log_rho = jax.lax.stop_gradient(log_pi) - batch.log_prob
    rho = jnp.exp(log_rho)
    advantage = jax.lax.stop_gradient(jnp.minimum(cfg.clip_pg_rho_threshold, rho) * (targets - v_pi))
    sums = {
        "pg": jnp.sum(mask * -advantage * log_pi),
        "value": jnp.sum(mask * 0.5 * ((targets - q_a) ** 2 + (v_pi - v_tm1) ** 2)),
        "entropy": jnp.sum(mask * pi.entropy()),
        "rho": jnp.sum(mask * rho),
        "vs": jnp.sum(mask * targets),
        **learner.ratio_sums(log_rho, mask, cfg),
    }
    return jnp.sum(mask), sums


def _ref_appo_targets(params, apply, batch, next_obs, cfg):
    out, v_tm1 = apply(params, batch.obs)[:2]
    v_t = apply(params, next_obs)[1]
    log_pi = networks.policy_distribution(out, learner.is_continuous(batch)).log_prob(batch.action)
    log_rho = log_pi - batch.log_prob
    targets = learner._value_targets(cfg, v_tm1, v_t, batch, log_rho)
    return jax.lax.stop_gradient(learner.AppoTargets(log_pi, targets.vs, targets.pg_advantage, jnp.exp(log_rho),
                                                     log_rho, v_tm1))


ONE_FWD_T, ONE_FWD_OBS, ONE_FWD_D = 8, 3, 2
ONE_FWD_CONFIGS = {
    "vtrace": learner.LossConfig(corrector="vtrace", lambda_=0.9, discount=0.95, clip_rho_threshold=1.2),
    "is": learner.LossConfig(corrector="is", lambda_=0.9, discount=0.95, clip_rho_threshold=2.0),
    "none": learner.LossConfig(corrector="none", lambda_=0.8, discount=0.95),
    "retrace": learner.LossConfig(corrector="retrace", lambda_=0.9, discount=0.95),
    "appo": learner.LossConfig(loss="appo", lambda_=0.9, discount=0.95),
}


def _ends_batch(layout, continuous, seed=0):
    """A [8, B] rollout with episode ends everywhere the rules distinguish, and its true ``next_obs``.

    Columns: truncations at the first row, twice inside and at the last row; terminations and truncations
    alternating (first and last rows terminated); every row truncated (``layout="any"`` only: it needs
    K = T - 1); no end; envpool-like (invalid first row and a reset row after each end); every row
    terminated. ``layout``: ``"any"`` packs with K = T - 1, ``"tight"`` with the columns' own maximum
    (K = 3), ``"delayed"`` with K = 0, where (as envpool) a truncated step's next observation is the
    next row's obs.
    """
    t = ONE_FWD_T
    ends = {  # column -> (terminated rows, truncated rows, invalid rows)
        "first_inside_last": ((), (0, 3, 5, 7), ()),
        "alternating": ((0, 4, 7), (2, 6), ()),
        "all_truncated": ((), tuple(range(t)), ()),
        "none": ((), (), ()),
        "envpool": ((4,), (1,), (0, 2, 5)),
        "all_terminated": (tuple(range(t)), (), ()),
    }
    if layout == "tight":
        del ends["all_truncated"]
    b = len(ends)
    terminated, truncated, valid = np.zeros((t, b), bool), np.zeros((t, b), bool), np.ones((t, b), bool)
    for i, (term, trunc, inv) in enumerate(ends.values()):
        terminated[list(term), i], truncated[list(trunc), i], valid[list(inv), i] = True, True, False
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(t, b, ONE_FWD_OBS)).astype(np.float32)
    next_obs = _next_obs_of(obs, terminated | truncated, rng)
    if layout == "delayed":
        inside = truncated.copy()
        inside[-1] = False
        next_obs[:-1][inside[:-1]] = obs[1:][inside[:-1]]
    slots = {"any": t - 1, "tight": 3, "delayed": 0}[layout]
    action = (rng.normal(size=(t, b, ONE_FWD_D)) if continuous else rng.integers(0, NUM_ACTIONS, size=(t, b)))
    batch = Rollout(
        obs=jnp.asarray(obs),
        action=jnp.asarray(action, jnp.float32 if continuous else jnp.int32),
        log_prob=jnp.asarray(np.log(rng.uniform(0.1, 0.9, size=(t, b))) - (2.0 if continuous else 0.0), jnp.float32),
        reward=jnp.asarray(rng.normal(size=(t, b)), jnp.float32),
        terminated=jnp.asarray(terminated), truncated=jnp.asarray(truncated), valid=jnp.asarray(valid),
        bootstrap_obs=jnp.asarray(pack_bootstrap_obs(obs, next_obs, truncated, slots)),
        episode_return=jnp.zeros((t, b), jnp.float32), episode_length=jnp.zeros((t, b), jnp.int32),
    )
    assert batch.bootstrap_obs.shape[0] == slots + 1
    return batch, jnp.asarray(next_obs)


def _one_fwd_net(name, continuous):
    spec = networks.with_widths(networks.default_spec((ONE_FWD_OBS,), 0 if continuous else NUM_ACTIONS,
                                                      action_dim=ONE_FWD_D if continuous else 0,
                                                      q_head=name == "retrace"), (32, 32))
    apply = networks.make_apply_with_q(spec) if name == "retrace" else networks.make_apply(spec)
    params = networks.init_params(spec, jax.random.PRNGKey(3))
    # Noise on every weight: a policy far from uniform and values far from zero.
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(4), len(leaves))
    params = jax.tree.unflatten(treedef, [x + 0.3 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])
    return apply, params


def _weighted(cfg, count_sums):
    count, sums = count_sums
    return (sums["pg"] + cfg.value_coef * sums["value"] - cfg.entropy_coef * sums["entropy"]) / jnp.maximum(count, 1.0)


@pytest.mark.parametrize("continuous", [False, True], ids=["discrete", "gaussian"])
@pytest.mark.parametrize("name", list(ONE_FWD_CONFIGS))
def test_one_forward_equals_two_forward_targets_losses_and_gradients(name, continuous):
    if continuous and name == "retrace":
        pytest.skip("retrace is discrete only")
    cfg = ONE_FWD_CONFIGS[name]
    apply, params = _one_fwd_net(name, continuous)
    # Every layout (K = T - 1, 3, 0) where the network outputs differ (values, logits and Q, Gaussian);
    # the tight one elsewhere (the layouts' compiles are most of this test's time).
    every = (name, continuous) in (("vtrace", False), ("retrace", False), ("appo", True))
    for layout in ("any", "tight", "delayed") if every else ("tight",):
        batch, next_obs = _ends_batch(layout, continuous)
        (_, (c_new, s_new, t_new)), g_new = _loss_parts_and_grad(cfg, apply, params, batch, None)
        (_, (c_ref, s_ref, t_ref)), g_ref = _loss_parts_and_grad(cfg, apply, params, batch, next_obs)
        assert float(c_new) == float(c_ref) > 0
        for k in s_ref:
            np.testing.assert_allclose(float(s_new[k]), float(s_ref[k]), rtol=1e-5, atol=1e-5, err_msg=f"{layout} {k}")
        _assert_trees_close(t_new, t_ref, rtol=1e-5, atol=1e-5)
        if name == "appo":
            assert float(jnp.max(jnp.abs(t_ref.advantage))) > 0.1  # the targets are not trivially zero
        _assert_trees_close(g_new, g_ref, rtol=1e-4, atol=1e-6)
        assert _max_abs_diff(g_ref, jax.tree.map(jnp.zeros_like, g_ref)) > 1e-3


def _loss_parts_and_grad(cfg, apply, params, batch, next_obs):
    """One compiled call: ``((loss, (count, sums, appo_targets or ())), grad)`` at ``params``; the
    learner's if ``next_obs`` is None, else the two-forward oracle's on ``next_obs``. For APPO the targets
    are θ_old = ``params``'s (constants) and the loss is the clipped surrogate at the same params."""

    def parts(p):
        if cfg.loss == "appo":
            old = (learner.appo_targets(params, apply, batch, cfg) if next_obs is None
                   else _ref_appo_targets(params, apply, batch, next_obs, cfg))
            return (*learner.appo_loss_sums(p, apply, batch, old, cfg), old)
        if next_obs is None:
            return (*learner.loss_sums(p, apply, batch, cfg), ())
        return (*_ref_loss_sums(p, apply, batch, next_obs, cfg), ())

    def loss(p):
        out = parts(p)
        return _weighted(cfg, out[:2]), out

    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)


def test_one_forward_really_uses_each_final_observation():
    """The fixture is meaningful: moving any one truncated step's final observation, or the last row's
    next observation, changes the targets; moving a terminated step's changes nothing."""
    cfg = ONE_FWD_CONFIGS["vtrace"]
    apply, params = _one_fwd_net("vtrace", False)
    batch, next_obs = _ends_batch("any", False)
    vs = jax.jit(lambda n: _ref_loss_sums(params, apply, batch, n, cfg)[1]["vs"])
    new_vs = jax.jit(lambda b: learner.loss_sums(params, apply, b, cfg)[1]["vs"])
    base = float(vs(next_obs))
    trunc, term, valid = (np.asarray(x) for x in (batch.truncated, batch.terminated, batch.valid))
    for s, i in zip(*np.nonzero(trunc | term)):
        moved = next_obs.at[s, i].add(3.0)
        b2 = batch._replace(bootstrap_obs=jnp.asarray(pack_bootstrap_obs(np.asarray(batch.obs), np.asarray(moved),
                                                                         trunc, ONE_FWD_T - 1)))
        changed = abs(float(vs(moved)) - base) > 1e-4
        assert changed == bool(trunc[s, i] and valid[s, i]), (s, i)
        np.testing.assert_allclose(float(new_vs(b2)), float(vs(moved)), rtol=1e-5, atol=1e-5)


def test_pack_bootstrap_obs_numpy_and_jax_agree_and_numpy_checks_the_slots():
    batch, next_obs = _ends_batch("tight", False)
    obs, nxt, trunc = np.asarray(batch.obs), np.asarray(next_obs), np.asarray(batch.truncated)
    for k in (3, 5):
        packed = pack_bootstrap_obs(obs, nxt, trunc, k)
        assert isinstance(packed, np.ndarray) and packed.shape == (k + 1,) + obs.shape[1:]
        traced = jax.jit(lambda o, n, tr, k=k: pack_bootstrap_obs(o, n, tr, k))(obs, nxt, trunc)
        np.testing.assert_array_equal(np.asarray(traced), packed)
    np.testing.assert_array_equal(packed[-1], nxt[-1])
    np.testing.assert_array_equal(packed[:3, 0], nxt[[0, 3, 5], 0])  # column 0: rows 0, 3, 5 (7 is the last)
    np.testing.assert_array_equal(packed[3:5, 0], 0.0)  # unused slots
    with pytest.raises(ValueError, match="3 truncated steps"):
        pack_bootstrap_obs(obs, nxt, trunc, 2)
    with pytest.raises(ValueError, match="differs from the next row"):
        pack_bootstrap_obs(obs, nxt, trunc, 0)
    delayed, d_next = _ends_batch("delayed", False)
    assert pack_bootstrap_obs(np.asarray(delayed.obs), np.asarray(d_next), np.asarray(delayed.truncated), 0).shape[0] == 1


def _replay_transitions(env, apply, params, carry, t):
    """The stacked :class:`Transition` ``[t, B]`` of the AnakinActor's scan from ``carry`` (its steps,
    replayed with the same keys), which its Rollout keeps only in packed form."""
    from accerl_jax.actor import sample_action

    def step(c, _):
        key, sub = jax.random.split(c.key)
        action, _ = sample_action(apply, params, c.obs, sub)
        env_state, tr = env.step(c.env_state, action)
        return c._replace(env_state=env_state, obs=tr.obs, key=key), tr

    return jax.jit(lambda c: jax.lax.scan(step, c, None, length=t)[1])(carry)


def test_gymnax_time_limit_bounds_the_slots_and_the_actor_packs_exactly():
    """A gymnax CartPole cut at 3 steps: rows 0..T-2 of a column truncate at most ``bootstrap_slots(T)``
    times, and the AnakinActor's packed rollout gives the two-forward learner's sums on the transitions
    it came from."""
    import dataclasses

    from accerl_jax.actor import AnakinActor
    from accerl_jax.envs import GymnaxEnv

    t, b = 16, 8
    env = GymnaxEnv("CartPole-v1", b)
    env._params = env._params.replace(max_steps_in_episode=3)
    env.info = dataclasses.replace(env.info, max_episode_steps=3)
    slots = env.info.bootstrap_slots(t)
    assert slots == 5
    cfg = ONE_FWD_CONFIGS["vtrace"]
    spec = networks.with_widths(networks.default_spec(env.info.obs_shape, env.info.num_actions), (32, 32))
    apply, params = networks.make_apply(spec), networks.init_params(spec, jax.random.PRNGKey(0))
    actor = AnakinActor(env, apply, t)
    sums = jax.jit(lambda ro: learner.loss_sums(params, apply, ro, cfg)[1])
    ref_sums = jax.jit(lambda ro, n: _ref_loss_sums(params, apply, ro, n, cfg)[1])
    carry = actor.reset(jax.random.PRNGKey(1))
    for _ in range(3):
        trs = _replay_transitions(env, apply, params, carry, t)
        carry, ro, _ = actor.rollout(params, carry)
        trunc = np.asarray(trs.truncated)
        np.testing.assert_array_equal(np.asarray(ro.truncated), trunc)
        np.testing.assert_array_equal(np.asarray(ro.obs[1:]), np.asarray(trs.obs[:-1]))  # the same steps
        assert 4 <= trunc[:-1].sum(0).max() <= slots  # near the bound: the check is meaningful
        packed = pack_bootstrap_obs(np.asarray(ro.obs), np.asarray(trs.next_obs), trunc, slots)  # checks <= K
        np.testing.assert_array_equal(np.asarray(ro.bootstrap_obs), packed)
        new, ref = sums(ro), ref_sums(ro, trs.next_obs)
        for k in ref:
            np.testing.assert_allclose(float(new[k]), float(ref[k]), rtol=1e-5, atol=1e-5, err_msg=k)


# ------------------------------------------------------------------- APPO minibatches follow the seed


def test_minibatch_columns_follow_the_key_and_not_the_device_count():
    """One permutation of the global batch per epoch, from the run's key: two seeds draw different
    minibatches, the same key the same; N devices take equal parts of the 1-device minibatches."""
    k0, k1 = learner.learner_key(0), learner.learner_key(1)
    one = np.asarray(learner.minibatch_columns(k0, 0, 16, 2, 2))  # [epochs x minibatches, 8]
    assert one.shape == (4, 8)
    for epoch in one.reshape(2, 16):
        assert sorted(epoch) == list(range(16))  # each epoch is a permutation of all columns
    np.testing.assert_array_equal(one, learner.minibatch_columns(k0, 0, 16, 2, 2))
    assert not np.array_equal(one, learner.minibatch_columns(k1, 0, 16, 2, 2))  # another seed
    assert not np.array_equal(one, learner.minibatch_columns(k0, 4, 16, 2, 2))  # another update
    parts = [np.asarray(learner.minibatch_columns(k0, 0, 16, 2, 2, num_devices=4, device=d)) for d in range(4)]
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), one)
    # One minibatch: the device's own columns, in order, every epoch (nothing drawn).
    np.testing.assert_array_equal(learner.minibatch_columns(k0, 0, 4, 3, 1), np.tile(np.arange(4), (3, 1)))


def test_appo_update_depends_on_the_learner_key(params):
    """The same batch, two seeds' keys: different minibatch orders give different parameters; the key is
    carried unchanged in the state (a checkpoint saves it)."""
    mesh, opt = learner.make_mesh(jax.devices()[:1]), optax.sgd(0.1)
    cfg = learner.LossConfig(loss="appo", corrector="is", epochs=2, minibatches=2)
    update, batch = learner.make_update(APPLY, opt, cfg, mesh), _batch(b=8)
    s0, _ = update(learner.init_state(params, opt, mesh, key=learner.learner_key(0)), batch)
    s0_again, _ = update(learner.init_state(params, opt, mesh, key=learner.learner_key(0)), batch)
    s1, _ = update(learner.init_state(params, opt, mesh, key=learner.learner_key(1)), batch)
    np.testing.assert_array_equal(s0.key, learner.learner_key(0))
    assert _max_abs_diff(s0.params, s0_again.params) == 0.0
    assert _max_abs_diff(s0.params, s1.params) > 1e-6


@pytest.mark.parametrize("name, continuous", [("vtrace", False), ("appo", True)])
def test_update_outputs_are_the_forward_pass_at_the_parameters_it_started_from(name, continuous):
    """``make_update(outputs=True)``: the same state and metrics as without, plus the network's outputs at
    ``batch.obs`` under the parameters before the update (APPO: θ_old, before its 2 epochs' steps), the
    teacher's outputs a distillation compressor reuses."""
    cfg = ONE_FWD_CONFIGS[name]
    if name == "appo":
        cfg = learner.LossConfig(loss="appo", lambda_=0.9, discount=0.95, epochs=2)
    apply, params = _one_fwd_net(name, continuous)
    batch, _ = _ends_batch("tight", continuous)
    mesh, opt = learner.make_mesh(jax.devices()[:1]), optax.adam(1e-2)
    state = learner.init_state(params, opt, mesh, key=learner.learner_key(0))
    plain, metrics = learner.make_update(apply, opt, cfg, mesh)(state, batch)
    new, new_metrics, out = learner.make_update(apply, opt, cfg, mesh, outputs=True)(state, batch)
    _assert_trees_close(new, plain, rtol=0, atol=0)
    assert new_metrics.keys() == metrics.keys()
    for k in metrics:
        assert float(new_metrics[k]) == float(metrics[k]), k
    policy_out, value = apply(params, batch.obs)[:2]
    assert isinstance(out, learner.LearnerOutputs) and out.policy_out.shape == policy_out.shape
    np.testing.assert_allclose(out.policy_out, policy_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.value, value, rtol=1e-5, atol=1e-6)
    # Not the updated parameters' outputs.
    assert float(jnp.max(jnp.abs(apply(new.params, batch.obs)[0] - out.policy_out))) > 1e-4


def _scans(jaxpr):
    """Every ``scan`` equation in a jaxpr, nested ones included: ``[(length, unroll)]``."""
    from jax.extend import core as jex_core

    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            found.append((eqn.params["length"], eqn.params["unroll"]))
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple) else (value,):
                if isinstance(sub, jex_core.ClosedJaxpr):
                    found += _scans(sub.jaxpr)
                elif isinstance(sub, jex_core.Jaxpr):
                    found += _scans(sub)
    return found


def test_appo_gradient_steps_are_unrolled_for_conv_nets_on_cpu_and_give_the_same_update(params):
    """XLA:CPU runs conv-net gradient steps much slower inside a loop: with ``family="cnn"`` APPO's
    ``epochs x minibatches`` steps are one unrolled scan on CPU (``xla.gradient_loop_unroll``), a plain
    scan otherwise; the update is the same either way."""
    from accerl_jax.platform import xla

    assert xla.gradient_loop_unroll("cnn", 6, "cpu") == 6
    assert xla.gradient_loop_unroll("mlp", 6, "cpu") == xla.gradient_loop_unroll("cnn", 6, "gpu") == 1
    mesh, opt = learner.make_mesh(jax.devices()[:1]), optax.adam(1e-2)
    cfg = learner.LossConfig(loss="appo", epochs=3, minibatches=2)
    batch, state = _batch(b=8), learner.init_state(params, opt, mesh, key=learner.learner_key(0))
    results = {}
    for family in ("mlp", "cnn"):
        update = learner.make_update(APPLY, opt, cfg, mesh, family=family)
        steps = [s for s in _scans(jax.make_jaxpr(update)(state, batch).jaxpr) if s[0] == cfg.optimizer_steps]
        assert steps == [(6, 6 if family == "cnn" else 1)], (family, steps)
        results[family] = update(state, batch)
    _assert_trees_close(results["cnn"], results["mlp"])


def test_clipped_value_loss_is_ppos_and_off_by_default():
    """``clip_value``: APPO's value sum is PureJaxRL's / CleanRL's clipped one, ½ Σ max((v_s - V)²,
    (v_s - V_old - clip(V - V_old, -ε, ε))²), computed here by hand at parameters moved away from θ_old;
    at θ_old itself, and without the flag, it is the plain ½ Σ (v_s - V)²; the flag changes the value sum
    only where some V moved more than ε."""
    apply, params = _one_fwd_net("appo", False)
    batch, next_obs = _ends_batch("tight", False)
    plain_cfg = learner.LossConfig(loss="appo", lambda_=0.9, discount=0.95, ppo_clip=0.05)
    clip_cfg = dataclasses.replace(plain_cfg, clip_value=True)
    old = _ref_appo_targets(params, apply, batch, next_obs, plain_cfg)
    moved = jax.tree.map(lambda x: x * 1.05, params)  # values moved from θ_old's, some by more than ε
    v_new = apply(moved, batch.obs)[1]
    mask = np.asarray(batch.valid, np.float32)
    vs, v_old, v = (np.asarray(x, np.float64) for x in (old.vs, old.value, v_new))
    want_clipped = 0.5 * np.sum(mask * np.maximum((vs - v) ** 2, (vs - v_old - np.clip(v - v_old, -0.05, 0.05)) ** 2))
    want_plain = 0.5 * np.sum(mask * (vs - v) ** 2)
    got_clipped = float(learner.appo_loss_sums(moved, apply, batch, old, clip_cfg)[1]["value"])
    got_plain = float(learner.appo_loss_sums(moved, apply, batch, old, plain_cfg)[1]["value"])
    np.testing.assert_allclose(got_clipped, want_clipped, rtol=1e-5)
    np.testing.assert_allclose(got_plain, want_plain, rtol=1e-5)
    assert np.max(np.abs(v - v_old)) > 0.05 and got_clipped > got_plain  # the clip took effect
    at_old = [float(learner.appo_loss_sums(params, apply, batch, old, c)[1]["value"]) for c in (clip_cfg, plain_cfg)]
    np.testing.assert_allclose(at_old[0], at_old[1], rtol=1e-6)
    assert not learner.LossConfig().clip_value
