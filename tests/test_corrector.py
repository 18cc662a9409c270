"""Tests for accerl_jax.corrector (V-trace with episode cuts, the --corrector switch)."""
import functools

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import rlax  # noqa: E402
from rlax._src import multistep as rlax_multistep  # noqa: E402

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
    assert set(corrector.CORRECTORS) == {"vtrace", "retrace", "is", "none"}


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
    for name in corrector.VALUE_CORRECTORS:
        with pytest.raises(AssertionError):
            corrector.correct(name, *inputs)


# ----------------------------------------------------------------------------------------------
# 7. Agreement with rlax on 200 random cases per function (λ and clips drawn per case).

N_CASES = 200


def _cases(seed, t=12, b=2, consistent=False):
    """``N_CASES`` random ``[t, b]`` batches stacked on a leading case axis, with per-case λ and clips.

    consistent: v_t[s] = v_tm1[s+1] (one value sequence per column), as rlax's ``values`` arguments need.
    """
    rng = np.random.default_rng(seed)
    shape = (N_CASES, t, b)
    values = rng.normal(size=(N_CASES, t + 1, b))
    v_tm1, v_t = (values[:, :-1], values[:, 1:]) if consistent else (rng.normal(size=shape), rng.normal(size=shape))
    r_t = rng.normal(size=shape)
    discount_t = rng.uniform(0.5, 1.0, size=shape) * (rng.uniform(size=shape) > 0.15)
    rho_tm1 = np.exp(rng.normal(scale=1.0, size=shape))
    lam = rng.uniform(0.0, 1.0, size=N_CASES)
    lam[:20] = 1.0
    clip = rng.uniform(0.5, 3.0, size=N_CASES)
    clip_pg = rng.uniform(0.5, 3.0, size=N_CASES)
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return [f32(x) for x in (v_tm1, v_t, r_t, discount_t, rho_tm1, lam, clip, clip_pg)]


def test_vtrace_agrees_with_rlax_on_200_random_cases():
    v_tm1, v_t, r_t, discount_t, rho, lam, clip, clip_pg = _cases(101)
    no_done = jnp.zeros(v_tm1.shape[1:], bool)

    def ours(v_tm1, v_t, r_t, discount_t, rho, lam, clip, clip_pg):
        out = corrector.vtrace(v_tm1, v_t, r_t, discount_t, rho, no_done, lambda_=lam,
                               clip_rho_threshold=clip, clip_pg_rho_threshold=clip_pg)
        return out.vs, out.pg_advantage

    def ref(v_tm1, v_t, r_t, discount_t, rho, lam, clip, clip_pg):
        fn = lambda *xs: rlax.vtrace_td_error_and_advantage(  # noqa: E731
            *xs, lambda_=lam, clip_rho_threshold=clip, clip_pg_rho_threshold=clip_pg)
        out = jax.vmap(fn, in_axes=1, out_axes=1)(v_tm1, v_t, r_t, discount_t, rho)
        return out.errors + v_tm1, out.pg_advantage

    args = (v_tm1, v_t, r_t, discount_t, rho, lam, clip, clip_pg)
    got, want = jax.jit(jax.vmap(ours))(*args), jax.jit(jax.vmap(ref))(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)


def test_lambda_return_agrees_with_rlax_on_200_random_cases():
    """ρ = 1 ("none", any log ρ): V-trace is the λ-return, rlax.lambda_returns."""
    v_tm1, v_t, r_t, discount_t, rho, lam, _, _ = _cases(103, consistent=True)
    no_done = jnp.zeros(v_tm1.shape[1:], bool)

    def ours(v_tm1, v_t, r_t, discount_t, log_rho, lam):
        return corrector.correct("none", v_tm1, v_t, r_t, discount_t, log_rho, no_done, lambda_=lam).vs

    def ref(v_t, r_t, discount_t, lam):
        fn = lambda r, d, v: rlax.lambda_returns(r, d, v, lambda_=lam)  # noqa: E731
        return jax.vmap(fn, in_axes=1, out_axes=1)(r_t, discount_t, v_t)

    got = jax.jit(jax.vmap(ours))(v_tm1, v_t, r_t, discount_t, jnp.log(rho), lam)
    want = jax.jit(jax.vmap(ref))(v_t, r_t, discount_t, lam)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_importance_sampling_agrees_with_rlax_on_200_random_cases():
    """rlax.importance_corrected_td_errors with the ratios clipped at ρ̄ (the truncation)."""
    v_tm1, v_t, r_t, discount_t, rho, lam, clip, _ = _cases(107, consistent=True)
    no_done = jnp.zeros(v_tm1.shape[1:], bool)

    def ours(v_tm1, v_t, r_t, discount_t, rho, lam, clip):
        return corrector.importance_sampling(v_tm1, v_t, r_t, discount_t, rho, no_done, lambda_=lam,
                                             clip_rho_threshold=clip).vs

    def ref(v_tm1, v_t, r_t, discount_t, rho, lam, clip):
        values = jnp.concatenate([v_tm1, v_t[-1:]])
        # rlax defines it but does not export it at the top level.
        fn = lambda r, d, p, v: rlax_multistep.importance_corrected_td_errors(r, d, p, lam, v)  # noqa: E731
        errors = jax.vmap(fn, in_axes=1, out_axes=1)(r_t, discount_t, jnp.minimum(clip, rho), values)
        return errors + v_tm1

    args = (v_tm1, v_t, r_t, discount_t, rho, lam, clip)
    np.testing.assert_allclose(jax.jit(jax.vmap(ours))(*args), jax.jit(jax.vmap(ref))(*args), atol=1e-4, rtol=1e-4)


def _retrace_cases(seed, t=10, b=2, a=3):
    rng = np.random.default_rng(seed)
    n = N_CASES
    q_tm1 = rng.normal(size=(n, t, b, a))
    q_t = rng.normal(size=(n, t, b, a))
    a_tm1 = rng.integers(0, a, size=(n, t, b))
    a_t = rng.integers(0, a, size=(n, t, b))
    r_t = rng.normal(size=(n, t, b))
    discount_t = rng.uniform(0.5, 1.0, size=(n, t, b)) * (rng.uniform(size=(n, t, b)) > 0.15)
    logits = rng.normal(size=(n, t, b, a))
    pi_t = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    mu_t = rng.uniform(0.05, 1.0, size=(n, t, b))
    lam = rng.uniform(0.0, 1.0, size=n)
    lam[:20] = 1.0
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    i32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
    return (f32(q_tm1), f32(q_t), i32(a_tm1), i32(a_t), f32(r_t), f32(discount_t), f32(pi_t), f32(mu_t), f32(lam))


def test_retrace_agrees_with_rlax_on_200_random_cases():
    cases = _retrace_cases(109)
    no_done = jnp.zeros(cases[2].shape[1:], bool)

    def ours(q_tm1, q_t, a_tm1, a_t, r_t, discount_t, pi_t, mu_t, lam):
        return corrector.retrace(q_tm1, q_t, a_tm1, a_t, r_t, discount_t, pi_t, mu_t, no_done, lambda_=lam)

    def ref(q_tm1, q_t, a_tm1, a_t, r_t, discount_t, pi_t, mu_t, lam):
        fn = lambda *xs: rlax.retrace(*xs, lambda_=lam, eps=0.0)  # noqa: E731
        err = jax.vmap(fn, in_axes=1, out_axes=1)(q_tm1, q_t, a_tm1, a_t, r_t, discount_t, pi_t, mu_t)
        return err + jnp.take_along_axis(q_tm1, a_tm1[..., None], axis=-1)[..., 0]

    got, want = jax.jit(jax.vmap(ours))(*cases), jax.jit(jax.vmap(ref))(*cases)
    assert got.shape == cases[2].shape
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------------------------
# 8. Episode boundaries for IS and Retrace; properties.


@pytest.mark.parametrize("lambda_", [1.0, 0.8])
def test_importance_sampling_concatenated_episodes_equal_separate(lambda_):
    rng = np.random.default_rng(211)
    ends = ("terminate", "truncate", "cut")
    lengths = [5, 4, 6]
    episodes = [_episode(rng, n, e) for n, e in zip(lengths, ends)]
    kw = dict(lambda_=lambda_, clip_rho_threshold=2.0, clip_pg_rho_threshold=0.5)
    whole = corrector.importance_sampling_single(*_concat(episodes), **kw)
    start = 0
    for ep, n in zip(episodes, lengths):
        alone = corrector.importance_sampling_single(*ep, **kw)
        np.testing.assert_allclose(whole.vs[start:start + n], alone.vs, atol=1e-6, rtol=0)
        np.testing.assert_allclose(whole.pg_advantage[start:start + n], alone.pg_advantage, atol=1e-6, rtol=0)
        start += n
    # Truncation bootstraps from γ V(final obs); termination does not (discount 0).
    v_tm1, v_t, r_t, discount_t, rho, _ = episodes[1]
    k = lengths[1] - 1
    expected = float(v_tm1[k]) + min(2.0, float(rho[k])) * float(r_t[k] + discount_t[k] * v_t[k] - v_tm1[k])
    np.testing.assert_allclose(whole.vs[lengths[0] + k], expected, atol=1e-6)
    v_tm1, v_t, r_t, _, rho, _ = episodes[0]
    k = lengths[0] - 1
    expected = float(v_tm1[k]) + min(2.0, float(rho[k])) * float(r_t[k] - v_tm1[k])
    np.testing.assert_allclose(whole.vs[k], expected, atol=1e-6)


def test_importance_sampling_equals_vtrace_at_unit_clip_and_differs_above():
    inputs = _random_batch(seed=223, done=True)
    v = corrector.vtrace(*inputs, lambda_=0.9)
    i = corrector.importance_sampling(*inputs, lambda_=0.9)
    np.testing.assert_allclose(i.vs, v.vs, atol=1e-5)
    np.testing.assert_allclose(i.pg_advantage, v.pg_advantage, atol=1e-5)
    v2 = corrector.vtrace(*inputs, lambda_=0.9, clip_rho_threshold=2.0)
    i2 = corrector.importance_sampling(*inputs, lambda_=0.9, clip_rho_threshold=2.0)
    assert np.max(np.abs(np.asarray(i2.vs - v2.vs))) > 1e-3


def _retrace_episode(rng, length, end, a=3, gamma=0.95):
    """One Retrace episode piece; q_t rows are Q of the next observation (the final one at the end)."""
    qs = rng.normal(size=(length + 1, a))
    actions = rng.integers(0, a, size=length + 1)
    logits = rng.normal(size=(length + 1, a))
    pis = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    mus = rng.uniform(0.05, 1.0, size=length + 1)
    discount = np.full(length, gamma)
    done = np.zeros(length)
    if end in ("terminate", "truncate"):
        done[-1] = 1.0
    if end == "terminate":
        discount[-1] = 0.0
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return [f32(qs[:-1]), f32(qs[1:]), jnp.asarray(actions[:-1], jnp.int32), jnp.asarray(actions[1:], jnp.int32),
            f32(rng.normal(size=length)), f32(discount), f32(pis[1:]), f32(mus[1:]), f32(done)]


@pytest.mark.parametrize("lambda_", [1.0, 0.7])
@pytest.mark.parametrize("ends", [("terminate", "truncate", "cut"), ("truncate", "terminate")])
def test_retrace_concatenated_episodes_equal_separate(lambda_, ends):
    rng = np.random.default_rng(227)
    lengths = [5, 4, 6][: len(ends)]
    episodes = [_retrace_episode(rng, n, e) for n, e in zip(lengths, ends)]
    whole = corrector.retrace_single(*_concat(episodes), lambda_=lambda_)
    start = 0
    for ep, n, end in zip(episodes, lengths, ends):
        alone = corrector.retrace_single(*ep, lambda_=lambda_)
        np.testing.assert_allclose(whole[start:start + n], alone, atol=1e-6, rtol=0)
        q_t, r_t, discount_t, pi_t = ep[1], ep[4], ep[5], ep[6]
        last = float(r_t[-1] + discount_t[-1] * jnp.sum(pi_t[-1] * q_t[-1]))
        if end == "terminate":
            last = float(r_t[-1])
        np.testing.assert_allclose(whole[start + n - 1], last, atol=1e-6)
        start += n


def test_retrace_on_policy_lambda_one_is_expected_sarsa_mc():
    """π = μ deterministic-in-effect (c = 1), λ = 1, termination at the end: the MC return."""
    rng = np.random.default_rng(229)
    n, a, gamma = 6, 3, 0.9
    q_tm1, q_t, a_tm1, a_t, r_t, _, _, _, done = _retrace_episode(rng, n, "terminate", a=a)
    pi_t = jax.nn.one_hot(a_t, a, dtype=jnp.float32)  # π puts all mass on the action μ took
    mu_t = jnp.ones((n,), jnp.float32)
    discount_t = jnp.where(jnp.arange(n) == n - 1, 0.0, gamma).astype(jnp.float32)
    out = corrector.retrace_single(q_tm1, q_t, a_tm1, a_t, r_t, discount_t, pi_t, mu_t, done, lambda_=1.0)
    r = np.asarray(r_t, np.float64)
    mc = np.array([sum(gamma ** (k - s) * r[k] for k in range(s, n)) for s in range(n)])
    np.testing.assert_allclose(out, mc, atol=1e-5)


def test_retrace_and_is_outputs_have_zero_gradient():
    q_tm1, q_t, a_tm1, a_t, r_t, discount_t, pi_t, mu_t, _ = (x[0] for x in _retrace_cases(233))
    done = jnp.zeros(a_tm1.shape, bool)
    g = jax.grad(lambda q0, q1: jnp.sum(corrector.retrace(q0, q1, a_tm1, a_t, r_t, discount_t, pi_t, mu_t, done)),
                 argnums=(0, 1))(q_tm1, q_t)
    for x in g:
        np.testing.assert_array_equal(x, np.zeros_like(x))
    inputs = _random_batch(seed=239, done=True)
    g = jax.grad(lambda v0, v1: jnp.sum(corrector.importance_sampling(v0, v1, *inputs[2:]).vs),
                 argnums=(0, 1))(*inputs[:2])
    for x in g:
        np.testing.assert_array_equal(x, np.zeros_like(x))


def test_retrace_rejects_bad_shapes_and_correct_rejects_retrace():
    cases = [x[0] for x in _retrace_cases(241)]
    done = jnp.zeros(cases[2].shape, bool)
    bad = list(cases[:8])
    bad[6] = bad[6][..., :2]  # pi_t with the wrong number of actions
    with pytest.raises(AssertionError):
        corrector.retrace(*bad, done)
    with pytest.raises(AssertionError):
        corrector.retrace(*(x[:, 0] for x in cases[:8]), done[:, 0])  # rank too low for the batched form
    with pytest.raises(ValueError, match="Q-values"):
        corrector.correct("retrace", *_random_batch(seed=1))
