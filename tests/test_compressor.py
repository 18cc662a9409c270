"""Tests for accerl_jax.compressor: a conformance table over every --compressor spec, fidelity of each
stage (mask, fakequant, distill), the distillation loss by hand, and the spec parser's errors."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from accerl_jax import networks
from accerl_jax.compressor import (
    DistillState,
    FakeQuantState,
    MaskState,
    distillation_loss,
    magnitude_mask,
    make_compressor,
)

SPECS = [
    "none",
    "mask:0.5",
    "mask:0.9",
    "fakequant:8",
    "fakequant:4",
    "distill:small",
    "distill:tiny",
    "distill:small+fakequant:8",
    "mask:0.5+fakequant:8",
]
CNN_SPECS = ["none", "mask:0.9", "fakequant:8", "distill:tiny"]
HEADS = ("policy_head", "value_head")
N_OBS = 16


def _stage_names(spec):
    return [part.split(":")[0] for part in spec.split("+")]


def _names(path):
    return [str(getattr(k, "key", getattr(k, "name", k))) for k in path]


def _hidden_kernel(path, leaf):
    names = _names(path)
    return names[-1] == "kernel" and not any(h in names for h in HEADS)


def _flat(params):
    return {"/".join(_names(p)): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}


def _kl(logits_p, logits_q):
    """mean_x KL(softmax(p) || softmax(q))."""
    log_p = jax.nn.log_softmax(logits_p)
    log_q = jax.nn.log_softmax(logits_q)
    return float(jnp.mean(jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)))


def _sharpen_policy(params, factor):
    """Scale the policy head so the policy is far from uniform (init gives logits ~ 0.01)."""
    return jax.tree_util.tree_map_with_path(
        lambda p, x: x * factor if "policy_head" in _names(p) else x, params
    )


class Net:
    def __init__(self, spec, key, obs_fn, sharpen=100.0):
        self.spec = spec
        self.apply = networks.make_apply(spec)
        self.japply = jax.jit(self.apply)
        self.params = _sharpen_policy(networks.init_params(spec, key), sharpen)
        self.obs = obs_fn(jax.random.fold_in(key, 1))


def _mlp_net():
    spec = networks.default_spec((4,), 2)
    return Net(spec, jax.random.PRNGKey(0), lambda k: jax.random.normal(k, (N_OBS, 4)), sharpen=500.0)


@functools.lru_cache(maxsize=None)
def _net(kind):
    if kind == "mlp":
        return _mlp_net()
    if kind == "minatar":
        spec = networks.default_spec((10, 10, 4), 6)
        return Net(
            spec, jax.random.PRNGKey(1),
            lambda k: jax.random.bernoulli(k, 0.3, (4, 10, 10, 4)).astype(jnp.float32), sharpen=100.0,
        )
    if kind == "atari":
        spec = networks.default_spec((4, 84, 84), 6, channels_first=True)
        return Net(
            spec, jax.random.PRNGKey(2),
            lambda k: jax.random.randint(k, (2, 4, 84, 84), 0, 256).astype(jnp.uint8), sharpen=30.0,
        )
    raise AssertionError(kind)


@functools.lru_cache(maxsize=None)
def _compressor(spec, kind):
    """One compressor per (spec, network), shared by the tests so each jitted stage compiles once."""
    net = _net(kind)
    return make_compressor(spec, net.spec, net.apply)


def _check_policy_output(apply, params, obs, num_actions):
    logits, value = apply(params, obs)
    n = obs.shape[0]
    assert logits.shape == (n, num_actions) and logits.dtype == jnp.float32
    assert value.shape == (n,) and value.dtype == jnp.float32
    assert np.all(np.isfinite(logits)) and np.all(np.isfinite(value))
    return logits, value


# ---------------------------------------------------------------------------------------- conformance


def _conformance(spec, kind):
    net = _net(kind)
    c = _compressor(spec, kind)
    actor_params, state = c.init(net.params, jax.random.PRNGKey(5))
    assert isinstance(state, dict)
    assert list(state) == _stage_names(spec)
    actor_apply = jax.jit(c.actor_apply(net.apply))
    na = net.spec.num_actions
    _check_policy_output(actor_apply, actor_params, net.obs, na)

    # compress: same state structure (checkpoints, jit carries), valid actor params.
    new_params = jax.tree.map(lambda x: x * 1.01, net.params)  # the learner moved
    actor_params2, state2 = c.compress(new_params, state, net.obs)
    assert list(state2) == list(state)
    assert jax.tree.structure(state2) == jax.tree.structure(state)
    assert jax.tree.structure(actor_params2) == jax.tree.structure(actor_params)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(state2)):
        assert np.shape(a) == np.shape(b) and np.asarray(a).dtype == np.asarray(b).dtype
    logits2, _ = _check_policy_output(actor_apply, actor_params2, net.obs, na)

    # compress without observations (nothing to distill on) still gives valid actor params.
    actor_params3, state3 = c.compress(new_params, state2, None)
    assert jax.tree.structure(state3) == jax.tree.structure(state)
    _check_policy_output(actor_apply, actor_params3, net.obs, na)

    if "distill" in state:
        assert isinstance(state["distill"], DistillState)
        assert int(state["distill"].steps) == 0
        assert int(state2["distill"].steps) == 4  # distill_steps per compress call
        assert int(state3["distill"].steps) == 4
        assert np.isfinite(float(state2["distill"].loss))
        assert networks.param_count(actor_params2) < networks.param_count(net.params)
    else:
        # Weight compressors keep the learner's architecture and follow the learner's params.
        assert jax.tree.structure(actor_params) == jax.tree.structure(net.params)
        moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(actor_params), jax.tree.leaves(actor_params2))]
        assert any(moved)
    if spec == "none":
        for a, b in zip(jax.tree.leaves(actor_params2), jax.tree.leaves(new_params)):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(logits2, net.japply(new_params, net.obs)[0], rtol=1e-6, atol=1e-6)
    if "fakequant" in state:
        assert isinstance(state["fakequant"], FakeQuantState)
        assert float(state2["fakequant"].max_abs_error) > 0.0
    if "mask" in state:
        assert isinstance(state["mask"], MaskState)
    if "distill" in state and "fakequant" in state:
        # The actor is the quantization of the *current* (just updated) student.
        _check_fakequant(state["distill"].student_params, actor_params, 8)
        _check_fakequant(state2["distill"].student_params, actor_params2, 8)


@pytest.mark.parametrize("spec", SPECS)
def test_conformance_mlp(spec):
    _conformance(spec, "mlp")


@pytest.mark.parametrize("spec", CNN_SPECS)
def test_conformance_minatar_cnn(spec):
    _conformance(spec, "minatar")


@pytest.mark.parametrize("spec", ["distill:tiny"])  # channels_first uint8 frames into a CNN student
def test_conformance_atari_cnn(spec):
    _conformance(spec, "atari")


# ------------------------------------------------------------------------------------------------ mask


def _check_mask(params, masked, masks, sparsity):
    flat_p, flat_m = _flat(params), _flat(masked)
    flat_mask = _flat(masks)
    n_hidden = 0
    for (path, w) in jax.tree_util.tree_flatten_with_path(params)[0]:
        name = "/".join(_names(path))
        w, m = np.asarray(w), flat_m[name]
        if _hidden_kernel(path, w):
            n_hidden += 1
            zero = m == 0
            assert abs(zero.mean() - sparsity) <= 1.0 / w.size + 1e-9, name
            kept = ~zero
            np.testing.assert_array_equal(m[kept], w[kept])  # kept weights are unchanged
            # Largest-magnitude weights are the ones kept.
            assert np.abs(w[kept]).min() >= np.abs(w[zero]).max(), name
            np.testing.assert_array_equal(flat_mask[name], kept.astype(np.float32))
        else:
            np.testing.assert_array_equal(m, flat_p[name])  # biases and heads untouched
    assert n_hidden >= 2


@pytest.mark.parametrize("kind", ["mlp", "minatar"])
@pytest.mark.parametrize("sparsity", [0.5, 0.9])
def test_mask_fidelity(kind, sparsity):
    net = _net(kind)
    c = _compressor(f"mask:{sparsity}", kind)
    actor_params, state = c.init(net.params, jax.random.PRNGKey(0))
    _check_mask(net.params, actor_params, state["mask"].masks, sparsity)
    assert float(state["mask"].sparsity) == pytest.approx(sparsity, abs=1e-2)
    # compress recomputes the mask from the current learner params.
    new_params = jax.tree.map(lambda x: x + 0.05 * jnp.sign(x), net.params)
    actor_params2, state2 = c.compress(new_params, state, net.obs)
    _check_mask(new_params, actor_params2, state2["mask"].masks, sparsity)


def test_magnitude_mask_with_ties_keeps_exactly_k():
    w = jnp.ones((4, 4), jnp.float32)
    m = magnitude_mask(w, 0.5)
    assert int(m.sum()) == 8
    # Already-zero weights beyond the target sparsity: still exactly k kept, and reported sparsity honest.
    w = jnp.concatenate([jnp.zeros((12,)), jnp.arange(1.0, 5.0)]).reshape(4, 4)
    assert int(magnitude_mask(w, 0.5).sum()) == 8


def test_mask_then_fakequant_keeps_zeros():
    net = _net("mlp")
    c = _compressor("mask:0.5+fakequant:8", "mlp")
    actor_params, state = c.init(net.params, jax.random.PRNGKey(0))
    masks = _flat(state["mask"].masks)
    for name, w in _flat(actor_params).items():
        if name.endswith("kernel") and not any(h in name for h in HEADS):
            np.testing.assert_array_equal(w == 0, masks[name] == 0, err_msg=name)


# ------------------------------------------------------------------------------------------- fakequant


def _check_fakequant(params, quantized, bits):
    qmax = 2 ** (bits - 1) - 1
    flat_q = _flat(quantized)
    worst = 0.0
    n_hidden = 0
    for (path, w) in jax.tree_util.tree_flatten_with_path(params)[0]:
        name = "/".join(_names(path))
        w, q = np.asarray(w), flat_q[name]
        assert q.dtype == w.dtype and q.shape == w.shape
        if not _hidden_kernel(path, w):
            np.testing.assert_array_equal(q, w, err_msg=name)  # biases and heads stay float
            continue
        n_hidden += 1
        w2 = w.reshape(-1, w.shape[-1])
        q2 = q.reshape(-1, q.shape[-1])
        for ch in range(w.shape[-1]):  # per output channel
            scale = np.abs(w2[:, ch]).max() / qmax
            err = np.abs(w2[:, ch] - q2[:, ch]).max()
            assert err <= scale / 2 * (1 + 1e-4) + 1e-7, (name, ch, err, scale)
            assert len(np.unique(q2[:, ch])) <= 2**bits - 1, (name, ch)
            steps = q2[:, ch] / scale
            np.testing.assert_allclose(steps, np.round(steps), atol=1e-3, err_msg=name)
            worst = max(worst, err)
    assert n_hidden >= 2
    return worst


@pytest.mark.parametrize("kind", ["mlp", "minatar"])
def test_fakequant_fidelity(kind):
    net = _net(kind)
    errs = {}
    for bits in (8, 4):
        c = _compressor(f"fakequant:{bits}", kind)
        actor_params, state = c.init(net.params, jax.random.PRNGKey(0))
        errs[bits] = _check_fakequant(net.params, actor_params, bits)
        assert float(state["fakequant"].max_abs_error) == pytest.approx(errs[bits], rel=1e-5)
        t_logits, t_value = net.japply(net.params, net.obs)
        s_logits, s_value = net.japply(actor_params, net.obs)
        kl = _kl(t_logits, s_logits)
        assert np.isfinite(kl)
        if bits == 8:
            # The learner's policy is far from uniform (sharpened head), so this is not trivially small.
            assert float(jnp.max(jnp.abs(t_logits))) > 1.0
            assert kl < 1e-3
            np.testing.assert_allclose(s_value, t_value, rtol=0.05, atol=0.05)
    assert errs[4] > errs[8]


# --------------------------------------------------------------------------------------------- distill


def test_distill_student_learns_teacher():
    preset = "small"
    net = _net("mlp")
    teacher_before = jax.tree.map(np.array, net.params)
    obs = jax.random.normal(jax.random.PRNGKey(11), (64, 4))
    c = _compressor(f"distill:{preset}", "mlp")
    actor_params, state = c.init(net.params, jax.random.PRNGKey(0))
    student_apply = jax.jit(c.actor_apply(net.apply))
    student_spec = networks.student_spec(net.spec, preset)
    assert networks.param_count(actor_params) == networks.param_count(
        networks.init_params(student_spec, jax.random.PRNGKey(0))
    )
    assert networks.param_count(actor_params) < networks.param_count(net.params)

    t_logits, t_value = net.japply(net.params, obs)
    assert float(jnp.std(t_logits[:, 0] - t_logits[:, 1])) > 0.5  # a non-trivial teacher policy

    def fit():
        s_logits, s_value = student_apply(actor_params, obs)
        return _kl(t_logits, s_logits), float(jnp.mean((s_value - t_value) ** 2))

    kl0, mse0 = fit()
    assert kl0 > 1e-2
    losses = []
    calls = 200
    for _ in range(calls):
        actor_params, state = c.compress(net.params, state, obs)
        losses.append(float(state["distill"].loss))
    kl1, mse1 = fit()
    assert int(state["distill"].steps) == 4 * calls
    assert kl1 < 0.25 * kl0 or kl1 < 1e-2, (kl0, kl1)
    assert mse1 < 0.5 * mse0, (mse0, mse1)
    assert losses[-1] < 0.25 * losses[0]
    # The teacher (learner params) is read, never written.
    for a, b in zip(jax.tree.leaves(teacher_before), jax.tree.leaves(net.params)):
        np.testing.assert_array_equal(a, b)
    # The actor params handed out are the student's.
    for a, b in zip(jax.tree.leaves(actor_params), jax.tree.leaves(state["distill"].student_params)):
        np.testing.assert_array_equal(a, b)


def test_distill_cnn_student_learns_teacher():
    net = _net("minatar")
    c = _compressor("distill:tiny", "minatar")
    actor_params, state = c.init(net.params, jax.random.PRNGKey(0))
    student_apply = jax.jit(c.actor_apply(net.apply))
    t_logits, _ = net.japply(net.params, net.obs)
    kl0 = _kl(t_logits, student_apply(actor_params, net.obs)[0])
    for _ in range(12):
        actor_params, state = c.compress(net.params, state, net.obs)
    kl1 = _kl(t_logits, student_apply(actor_params, net.obs)[0])
    assert int(state["distill"].steps) == 4 * 12
    assert kl1 < 0.5 * kl0, (kl0, kl1)


def _np_log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def test_distillation_loss_by_hand():
    t_logits = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 4.0]], np.float32)
    s_logits = np.array([[0.5, 0.1, -1.0], [2.0, 0.0, 0.0]], np.float32)
    t_value = np.array([1.0, -2.0], np.float32)
    s_value = np.array([0.5, 0.0], np.float32)
    temp, c_v = 2.0, 0.5
    log_p = _np_log_softmax(t_logits.astype(np.float64) / temp)
    log_q = _np_log_softmax(s_logits.astype(np.float64) / temp)
    kl = (np.exp(log_p) * (log_p - log_q)).sum(-1)  # KL(teacher || student)
    expected = temp**2 * kl.mean() + c_v * ((s_value - t_value) ** 2).mean()
    got = distillation_loss(t_logits, t_value, s_logits, s_value, temp, c_v)
    assert got.shape == () and got.dtype == jnp.float32
    np.testing.assert_allclose(float(got), expected, rtol=1e-5)
    # Not the reverse KL(student || teacher).
    reverse = (np.exp(log_q) * (log_q - log_p)).sum(-1)
    assert abs(temp**2 * reverse.mean() - temp**2 * kl.mean()) > 1e-2
    # Zero when the student matches the teacher (also up to a per-row logit shift).
    zero = distillation_loss(t_logits, t_value, t_logits + 3.0, t_value, temp, c_v)
    assert abs(float(zero)) < 1e-5
    # Gradient w.r.t. the student logits: T² KL'/N = T (q - p) / N.
    grad = jax.grad(lambda s: distillation_loss(t_logits, t_value, s, s_value, temp, c_v))(s_logits)
    np.testing.assert_allclose(grad, temp * (np.exp(log_q) - np.exp(log_p)) / 2, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "spec, needles",
    [
        ("mask:1.5", ["1.5"]),
        ("mask:-0.1", ["-0.1"]),
        ("mask:abc", ["abc"]),
        ("mask:", ["mask:"]),
        ("fakequant:1", ["fakequant", "1"]),
        ("fakequant:9", ["fakequant", "9"]),
        ("fakequant:x", ["x"]),
        ("fakequant:8.5", ["8.5"]),
        ("distill:huge", ["huge"]),
        ("fakequant:8+distill:small", ["distill", "first"]),
        ("mask:0.5+mask:0.9", ["mask"]),
        ("bogus", ["bogus"]),
        ("none+mask:0.5", ["none"]),
        ("distill:small+", ["distill:small+"]),
        ("", ["''"]),
    ],
)
def test_make_compressor_errors(spec, needles):
    net = _net("mlp")
    with pytest.raises(ValueError) as err:
        make_compressor(spec, net.spec, net.apply)
    msg = str(err.value)
    for needle in needles:
        assert needle in msg, (spec, msg)
