"""Tests for accerl_jax.corrector (V-trace with episode cuts, the --corrector switch)."""
import functools

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import rlax  # noqa: E402

from accerl_jax import corrector  # noqa: E402

T, B = 16, 3
TOL = 1e-5


def _random_batch(seed, t=T, b=B, done=False):
    """Random time-major [t, b] float32 inputs; discounts in [0.5, 0.99] with some exact zeros."""
    rng = np.random.default_rng(seed)
    shape = (t, b)
    v_tm1 = rng.normal(size=shape)
    v_t = rng.normal(size=shape)
    r_t = rng.normal(size=shape)
    discount_t = rng.uniform(0.5, 0.99, size=shape) * (rng.uniform(size=shape) > 0.2)
    discount_t[3, 0] = 0.0  # make sure zeros are present, also at the last row
    discount_t[t - 1, 1] = 0.0
    rho_tm1 = np.exp(rng.normal(scale=0.8, size=shape))  # both sides of every clip threshold
    done_t = (rng.uniform(size=shape) < 0.2) if done else np.zeros(shape, bool)
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return (f32(v_tm1), f32(v_t), f32(r_t), f32(discount_t), f32(rho_tm1), jnp.asarray(done_t))


def _rlax_batched(v_tm1, v_t, r_t, discount_t, rho_tm1, *, lambda_, clip_rho, clip_pg_rho):
    fn = functools.partial(
        rlax.vtrace_td_error_and_advantage,
        lambda_=lambda_,
        clip_rho_threshold=clip_rho,
        clip_pg_rho_threshold=clip_pg_rho,
    )
    out = jax.vmap(fn, in_axes=1, out_axes=1)(v_tm1, v_t, r_t, discount_t, rho_tm1)
    return out.errors + v_tm1, out.pg_advantage


# ----------------------------------------------------------------------------------------------
# 1. No dones: agreement with rlax.


@pytest.mark.parametrize("use_jit", [False, True], ids=["nojit", "jit"])
@pytest.mark.parametrize("lambda_", [1.0, 0.9, 0.5])
@pytest.mark.parametrize("clip_rho,clip_pg_rho", [(1.0, 1.0), (2.0, 0.5), (0.5, 2.0)])
def test_vtrace_matches_rlax_without_dones(use_jit, lambda_, clip_rho, clip_pg_rho):
    inputs = _random_batch(seed=int(lambda_ * 10 + clip_rho * 100))
    fn = functools.partial(
        corrector.vtrace,
        lambda_=lambda_,
        clip_rho_threshold=clip_rho,
        clip_pg_rho_threshold=clip_pg_rho,
    )
    if use_jit:
        fn = jax.jit(fn)
    out = fn(*inputs)
    vs_ref, adv_ref = _rlax_batched(
        *inputs[:5], lambda_=lambda_, clip_rho=clip_rho, clip_pg_rho=clip_pg_rho
    )
    assert out.vs.shape == (T, B) and out.pg_advantage.shape == (T, B)
    assert out.vs.dtype == jnp.float32
    np.testing.assert_allclose(out.vs, vs_ref, atol=TOL, rtol=TOL)
    np.testing.assert_allclose(out.pg_advantage, adv_ref, atol=TOL, rtol=TOL)


def test_vtrace_single_matches_rlax_and_vtrace_columns():
    inputs = _random_batch(seed=7, done=True)
    out = corrector.vtrace(*inputs, lambda_=0.9)
    for b in range(B):
        col = corrector.vtrace_single(*(x[:, b] for x in inputs), lambda_=0.9)
        np.testing.assert_allclose(out.vs[:, b], col.vs, atol=1e-6)
        np.testing.assert_allclose(out.pg_advantage[:, b], col.pg_advantage, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# 2. Episode boundaries.


def _episode(rng, length, end):
    """One episode piece as rank-1 float32 arrays.

    end: "terminate" (done, discount 0), "truncate" (done, discount gamma > 0, v_t is the value of
    the true final observation) or "cut" (the rollout ends mid-episode, no done).
    """
    gamma = 0.97
    values = rng.normal(size=length + 1)  # V(x_0..x_length); x_length = final/next observation
    v_tm1, v_t = values[:-1], values[1:]
    r_t = rng.normal(size=length)
    discount_t = np.full(length, gamma)
    done_t = np.zeros(length)
    if end == "terminate":
        discount_t[-1] = 0.0
        done_t[-1] = 1.0
    elif end == "truncate":
        done_t[-1] = 1.0
    else:
        assert end == "cut"
    rho_tm1 = np.exp(rng.normal(scale=0.8, size=length))
    return [jnp.asarray(x, jnp.float32) for x in (v_tm1, v_t, r_t, discount_t, rho_tm1, done_t)]


def _concat(episodes):
    return [jnp.concatenate(parts) for parts in zip(*episodes)]


@pytest.mark.parametrize("lambda_", [1.0, 0.9])
@pytest.mark.parametrize(
    "ends",
    # "cut" (no done) is only meaningful as the last piece.
    [
        ("terminate", "truncate", "cut"),
        ("truncate", "terminate"),
        ("terminate", "truncate", "truncate"),
    ],
)
def test_concatenated_episodes_equal_separate_episodes(lambda_, ends):
    rng = np.random.default_rng(11)
    lengths = [5, 4, 6][: len(ends)]
    episodes = [_episode(rng, n, e) for n, e in zip(lengths, ends)]
    kw = dict(lambda_=lambda_, clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0)
    whole = corrector.vtrace_single(*_concat(episodes), **kw)
    start = 0
    for ep, n in zip(episodes, lengths):
        alone = corrector.vtrace_single(*ep, **kw)
        np.testing.assert_allclose(whole.vs[start : start + n], alone.vs, atol=1e-6, rtol=0)
        np.testing.assert_allclose(
            whole.pg_advantage[start : start + n], alone.pg_advantage, atol=1e-6, rtol=0
        )
        start += n


@pytest.mark.parametrize("lambda_", [1.0, 0.9])
def test_truncation_bootstraps_from_true_final_observation(lambda_):
    """At a truncation the target uses gamma * v_t (the final obs), not the next episode's start."""
    rng = np.random.default_rng(3)
    ep1 = _episode(rng, 4, "truncate")
    ep2 = _episode(rng, 3, "cut")
    whole = corrector.vtrace_single(*_concat([ep1, ep2]), lambda_=lambda_)
    v_tm1, v_t, r_t, discount_t, rho_tm1, _ = ep1
    k = 3
    rho = min(1.0, float(rho_tm1[k]))
    expected = float(v_tm1[k]) + rho * float(r_t[k] + discount_t[k] * v_t[k] - v_tm1[k])
    np.testing.assert_allclose(whole.vs[k], expected, atol=1e-6)
    np.testing.assert_allclose(
        whole.pg_advantage[k], rho * float(r_t[k] + discount_t[k] * v_t[k] - v_tm1[k]), atol=1e-6
    )


@pytest.mark.parametrize("lambda_", [1.0, 0.9])
def test_rows_after_done_do_not_affect_rows_up_to_it(lambda_):
    rng = np.random.default_rng(5)
    episodes = [
        _episode(rng, 5, "terminate"), _episode(rng, 4, "truncate"), _episode(rng, 6, "cut")
    ]
    base = _concat(episodes)
    kw = dict(lambda_=lambda_, clip_rho_threshold=2.0, clip_pg_rho_threshold=0.5)
    ref = corrector.vtrace_single(*base, **kw)
    for k in (4, 8):  # the two dones
        assert float(base[5][k]) == 1.0
        perturbed = []
        for i, x in enumerate(base):
            noise = jnp.asarray(rng.normal(size=x.shape[0] - k - 1) * 5.0, jnp.float32)
            if i == 3:  # discounts stay in [0, 1]
                noise = jnp.abs(jnp.tanh(noise))
            elif i == 4:  # ratios stay positive
                noise = jnp.exp(noise)
            elif i == 5:  # dones stay binary
                noise = (noise > 0).astype(jnp.float32)
            perturbed.append(x.at[k + 1 :].set(noise))
        out = corrector.vtrace_single(*perturbed, **kw)
        np.testing.assert_allclose(out.vs[: k + 1], ref.vs[: k + 1], atol=1e-6, rtol=0)
        np.testing.assert_allclose(
            out.pg_advantage[: k + 1], ref.pg_advantage[: k + 1], atol=1e-6, rtol=0
        )
        # Sanity: the perturbation did change something after the done.
        assert not np.allclose(out.vs[k + 1 :], ref.vs[k + 1 :])


@pytest.mark.parametrize("lambda_", [1.0, 0.9, 0.5])
def test_random_dones_match_rlax_per_segment(lambda_):
    """Oracle: cutting the trajectory at each done and running rlax on each piece."""
    inputs = _random_batch(seed=21, t=24, b=2, done=True)
    kw = dict(lambda_=lambda_, clip_rho_threshold=2.0, clip_pg_rho_threshold=0.5)
    out = corrector.vtrace(*inputs, **kw)
    for b in range(2):
        cols = [x[:, b] for x in inputs]
        ends = [i + 1 for i in np.flatnonzero(np.asarray(cols[5]))]
        bounds = [0] + [e for e in ends if e < 24] + [24]
        for s, e in zip(bounds[:-1], bounds[1:]):
            seg = rlax.vtrace_td_error_and_advantage(*(x[s:e] for x in cols[:5]), **kw)
            vs_ref = seg.errors + cols[0][s:e]
            np.testing.assert_allclose(out.vs[s:e, b], vs_ref, atol=TOL, rtol=TOL)
            np.testing.assert_allclose(
                out.pg_advantage[s:e, b], seg.pg_advantage, atol=TOL, rtol=TOL
            )


def test_bool_and_float_done_agree():
    inputs = _random_batch(seed=9, done=True)
    a = corrector.vtrace(*inputs, lambda_=0.9)
    b = corrector.vtrace(*inputs[:5], inputs[5].astype(jnp.float32), lambda_=0.9)
    np.testing.assert_array_equal(a.vs, b.vs)
    np.testing.assert_array_equal(a.pg_advantage, b.pg_advantage)


# ----------------------------------------------------------------------------------------------
# 3. On-policy, lambda = 1: Monte-Carlo return.


def test_on_policy_lambda_one_is_monte_carlo_return():
    rng = np.random.default_rng(13)
    n, gamma = 7, 0.9
    v_tm1, v_t, r_t, discount_t, _, done_t = _episode(rng, n, "terminate")
    discount_t = jnp.where(jnp.arange(n) == n - 1, 0.0, gamma).astype(jnp.float32)
    rho = jnp.ones((n,), jnp.float32)
    out = corrector.vtrace_single(v_tm1, v_t, r_t, discount_t, rho, done_t, lambda_=1.0)
    r = np.asarray(r_t, np.float64)
    mc = np.array([sum(gamma ** (k - s) * r[k] for k in range(s, n)) for s in range(n)])
    np.testing.assert_allclose(out.vs, mc, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantage, mc - np.asarray(v_tm1), atol=1e-5)
    # Same with the batched function and the "none" corrector.
    out_none = corrector.correct(
        "none", *(x[:, None] for x in (v_tm1, v_t, r_t, discount_t)),
        jnp.full((n, 1), 0.7, jnp.float32), done_t[:, None],
    )
    np.testing.assert_allclose(out_none.vs[:, 0], mc, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# 4. Stopped gradients.


@pytest.mark.parametrize("lambda_", [1.0, 0.9])
def test_outputs_have_zero_gradient(lambda_):
    inputs = _random_batch(seed=17, done=True)

    def total(v_tm1, v_t, r_t):
        out = corrector.vtrace(v_tm1, v_t, r_t, *inputs[3:], lambda_=lambda_)
        return jnp.sum(out.vs), jnp.sum(out.pg_advantage)

    for idx in range(2):
        grads = jax.grad(lambda *a: total(*a)[idx], argnums=(0, 1, 2))(*inputs[:3])
        for g in grads:
            np.testing.assert_array_equal(g, np.zeros((T, B), np.float32))
    # correct() too, including w.r.t. log_rho.
    grad_log_rho = jax.grad(
        lambda lr: jnp.sum(corrector.correct("vtrace", *inputs[:4], lr, inputs[5]).pg_advantage)
    )(jnp.log(inputs[4]))
    np.testing.assert_array_equal(grad_log_rho, np.zeros((T, B), np.float32))


# ----------------------------------------------------------------------------------------------
# 5. correct().


@pytest.mark.parametrize("lambda_", [1.0, 0.9])
def test_correct_none_ignores_log_rho(lambda_):
    v_tm1, v_t, r_t, discount_t, rho_tm1, done_t = _random_batch(seed=19, done=True)
    kw = dict(lambda_=lambda_, clip_rho_threshold=2.0, clip_pg_rho_threshold=0.5)
    ref = corrector.vtrace(v_tm1, v_t, r_t, discount_t, jnp.ones_like(rho_tm1), done_t, **kw)
    for log_rho in (jnp.log(rho_tm1), jnp.zeros_like(rho_tm1), jnp.full_like(rho_tm1, -3.0)):
        out = corrector.correct("none", v_tm1, v_t, r_t, discount_t, log_rho, done_t, **kw)
        np.testing.assert_allclose(out.vs, ref.vs, atol=1e-6)
        np.testing.assert_allclose(out.pg_advantage, ref.pg_advantage, atol=1e-6)


@pytest.mark.parametrize("lambda_", [1.0, 0.9])
def test_correct_vtrace_uses_exp_log_rho(lambda_):
    v_tm1, v_t, r_t, discount_t, rho_tm1, done_t = _random_batch(seed=23, done=True)
    kw = dict(lambda_=lambda_, clip_rho_threshold=2.0, clip_pg_rho_threshold=0.5)
    ref = corrector.vtrace(v_tm1, v_t, r_t, discount_t, rho_tm1, done_t, **kw)
    out = corrector.correct("vtrace", v_tm1, v_t, r_t, discount_t, jnp.log(rho_tm1), done_t, **kw)
    np.testing.assert_allclose(out.vs, ref.vs, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(out.pg_advantage, ref.pg_advantage, atol=1e-5, rtol=1e-5)
    none = corrector.correct("none", v_tm1, v_t, r_t, discount_t, jnp.log(rho_tm1), done_t, **kw)
    assert not np.allclose(out.vs, none.vs, atol=1e-3)


def test_correct_unknown_name_raises():
    inputs = _random_batch(seed=29)
    with pytest.raises(ValueError, match="bogus") as err:
        corrector.correct("bogus", *inputs)
    assert "vtrace" in str(err.value)
    assert set(corrector.CORRECTORS) == {"vtrace", "none"}


# ----------------------------------------------------------------------------------------------
# 6. Shape guards.


def test_vtrace_rejects_mismatched_shapes():
    inputs = list(_random_batch(seed=31))
    for i in range(6):
        bad = list(inputs)
        bad[i] = jnp.zeros((T, B + 1), bad[i].dtype)
        with pytest.raises(AssertionError):
            corrector.vtrace(*bad)
    bad = list(inputs)
    bad[2] = jnp.zeros((T + 1, B), jnp.float32)
    with pytest.raises(AssertionError):
        corrector.vtrace(*bad)


def test_vtrace_rejects_wrong_rank():
    inputs = _random_batch(seed=37)
    with pytest.raises(AssertionError):
        corrector.vtrace(*(x[:, 0] for x in inputs))  # rank 1
    with pytest.raises(AssertionError):
        corrector.vtrace(*(x[..., None] for x in inputs))  # rank 3
    bad = list(inputs)
    bad[1] = inputs[1][:, 0]
    with pytest.raises(AssertionError):
        corrector.vtrace(*bad)


def test_vtrace_single_rejects_wrong_rank_and_shapes():
    inputs = _random_batch(seed=41)
    with pytest.raises(AssertionError):
        corrector.vtrace_single(*inputs)  # rank 2
    cols = [x[:, 0] for x in inputs]
    cols[4] = cols[4][:-1]
    with pytest.raises(AssertionError):
        corrector.vtrace_single(*cols)


def test_correct_rejects_mismatched_shapes():
    inputs = list(_random_batch(seed=43))
    inputs[4] = jnp.zeros((T, B + 1), jnp.float32)
    for name in corrector.CORRECTORS:
        with pytest.raises(AssertionError):
            corrector.correct(name, *inputs)
