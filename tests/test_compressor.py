"""Tests for accerl_jax.compressor: a conformance table over every --compressor spec and advertised chain,
fidelity of each stage (mask, prune, fakequant, int8, bf16, distill), masks through optimizers, the
distillation loss by hand, checkpoint round-trips, and the spec parser's errors."""
import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from accerl_jax import networks
from accerl_jax.compressor import (
    Bf16State,
    DistillState,
    FakeQuantState,
    Int8State,
    MaskState,
    PruneState,
    distillation_loss,
    gradual_sparsity,
    magnitude_mask,
    make_compressor,
    mask_updates,
)

SPECS = [
    "none",
    "mask:0.5",
    "mask:0.9",
    "mask:0.9,global",
    "mask:0.9,ramp=10",
    "prune:0.5",
    "prune:0.75",
    "prune:0.5+distill",
    "fakequant:8",
    "fakequant:4",
    "int8",
    "int8:all",
    "bf16",
    "distill:small",
    "distill:tiny",
    # advertised chains
    "distill:small+fakequant:8",
    "distill:small+int8",
    "distill:small+bf16",
    "prune:0.5+int8",
    "prune:0.5+distill+int8",
    "mask:0.5+fakequant:8",
    "mask:0.9+fakequant:8",
    "mask:0.9+int8",
]
CNN_SPECS = ["none", "mask:0.9", "prune:0.5", "fakequant:8", "int8", "bf16", "distill:tiny", "distill:tiny+int8",
             "distill:mlp"]
ARCH_CHANGING = ("distill", "prune", "int8")  # stages whose actor params differ in structure from the learner's
HEADS = ("policy_head", "value_head")
N_OBS = 16


def _stage_names(spec):
    """State keys of a chain: one per stage, except that 'prune:<f>+distill' is one 'distill' stage."""
    names = [part.split(":")[0] for part in spec.split("+")]
    return [n for i, n in enumerate(names) if not (n == "prune" and names[i + 1: i + 2] == ["distill"])]


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
    if kind in ("minatar_net", "impala"):  # --network minatar / impala on a MinAtar grid
        spec = networks.default_spec((10, 10, 4), 6, network=kind.removesuffix("_net"))
        if kind == "impala":  # narrower stacks: the same layers, compiled faster
            spec = networks.with_widths(spec, (8, 8, 8, 64))
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
    actor_params, state = c.init(net.params, jax.random.PRNGKey(5), net.obs)
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
        assert int(state2["distill"].version) == 1
        assert np.isfinite(float(state2["distill"].loss))
        assert networks.param_count(actor_params2) < networks.param_count(net.params)
    elif "prune" in state:
        assert isinstance(state["prune"], PruneState)
        assert networks.param_count(actor_params2) < networks.param_count(net.params)
    elif not any(k in state for k in ARCH_CHANGING):
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
    if "int8" in state:
        assert isinstance(state["int8"], Int8State)
        kernels = [x for x in jax.tree.leaves(actor_params2) if x.dtype == jnp.int8]
        assert kernels  # real int8 weights
        assert networks.param_bytes(actor_params2) < 2 * networks.param_count(actor_params2)  # ~1 byte a weight
    if "bf16" in state:
        assert isinstance(state["bf16"], Bf16State)
        assert any(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(actor_params2))
    if any(k in state for k in ("int8", "bf16", "fakequant", "mask")) and "distill" not in state:
        # Weight-only compression (no student): the actor's policy stays close to the learner's.
        ref = net.japply(new_params, net.obs)[0]
        if "prune" not in state and spec not in ("fakequant:4",) and "0.9" not in spec:
            assert _kl(ref, logits2) < 0.05, (spec, _kl(ref, logits2))
    if "distill" in state and "fakequant" in state:
        # The actor is the quantization of the *current* (just updated) student.
        _check_fakequant(state["distill"].student_params, actor_params, 8)
        _check_fakequant(state2["distill"].student_params, actor_params2, 8)


@pytest.mark.parametrize("spec", SPECS)
def test_conformance_mlp(spec):
    _conformance(spec, "mlp")


@pytest.mark.parametrize("spec", SPECS)
def test_state_checkpoint_round_trip(spec, tmp_path):
    """The compressor state (masks, kept indices, int8 ranges, student + optimizer) survives orbax."""
    import orbax.checkpoint as ocp

    net = _net("mlp")
    c = _compressor(spec, "mlp")
    _, state = c.init(net.params, jax.random.PRNGKey(5), net.obs)
    _, state = c.compress(jax.tree.map(lambda x: x * 1.01, net.params), state, net.obs)
    path = os.path.join(str(tmp_path), "state")
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(path, state)
    ckpt.wait_until_finished()
    restored = ckpt.restore(path, state)
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        assert np.asarray(a).dtype == np.asarray(b).dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("spec", CNN_SPECS)
def test_conformance_minatar_cnn(spec):
    _conformance(spec, "minatar")


@pytest.mark.parametrize("spec", ["distill:tiny"])  # channels_first uint8 frames into a CNN student
def test_conformance_atari_cnn(spec):
    _conformance(spec, "atari")


# ------------------------------------------------------------- conformance grid: spec x network family
# Every stage kind and every network-changing chain (auto's default candidates among them) on tiny
# networks of every policy family the trainer builds, with degenerate inputs. The Q-head networks are
# the plain ones plus one head (same layer names), so they stand for both; the plain MLP and CNN also
# run the tables above (which check fidelity too). The grid checks that no compressor assumes a family.

GRID_FAMILIES = {
    "mlp_q": networks.NetworkSpec("mlp", (8, 8), 3, (4,), q_head=True),
    "mlp_gaussian": networks.NetworkSpec("mlp", (8, 8), 3, (3,), action_dim=2, activation="tanh"),  # the mujoco preset's
    "cnn_q": networks.NetworkSpec("cnn", (4, 4, 4, 8), 3, (7, 7, 2), q_head=True),
    # --network mlp on images (flattened), the MinAtar net, the IMPALA ResNet (residual streams: pruning keeps
    # one channel set per stream across its writers), channels-first like envpool's frames.
    "mlp_image": networks.NetworkSpec("mlp", (8, 8), 3, (5, 5, 2)),
    "minatar_q": networks.NetworkSpec("minatar", (8, 8), 3, (5, 5, 2), q_head=True),
    "impala_q": networks.NetworkSpec("impala", (8, 8, 8), 3, (2, 6, 6), channels_first=True, q_head=True),
}
GRID_SPECS = ["none", "mask:0.5,global", "prune:0.5", "prune:0.5+distill", "fakequant:8", "int8:all", "bf16",
              "distill:small", "distill:small+int8", "prune:0.5+int8"]


@functools.lru_cache(maxsize=None)
def _grid_net(family):
    spec = GRID_FAMILIES[family]
    return spec, networks.init_params(spec, jax.random.PRNGKey(3)), networks.make_apply(spec)


def _zero_first_unit(params, spec):
    """Zero the first output unit (kernel column / conv channel and bias) of every hidden layer."""
    p = {k: dict(v) if isinstance(v, dict) else v for k, v in params["params"].items()}
    for layer in networks.hidden_layers(spec):
        for m in layer.producers:
            p[m]["kernel"] = p[m]["kernel"].at[..., 0].set(0.0)
            p[m]["bias"] = p[m]["bias"].at[0].set(0.0)
    return {"params": p}


def _check_grid_output(apply, actor_params, obs, spec):
    out_dim = 2 * spec.action_dim if spec.action_dim else spec.num_actions
    policy_out, value = apply(actor_params, obs)
    assert policy_out.shape == (obs.shape[0], out_dim) and policy_out.dtype == jnp.float32
    assert value.shape == (obs.shape[0],) and value.dtype == jnp.float32
    assert np.all(np.isfinite(policy_out)) and np.all(np.isfinite(value))
    return policy_out


@pytest.mark.parametrize("family", list(GRID_FAMILIES))
@pytest.mark.parametrize("spec", GRID_SPECS)
def test_conformance_grid(spec, family):
    from accerl_jax.run import plan

    net_spec, params, apply = _grid_net(family)
    obs = jax.random.normal(jax.random.PRNGKey(4), (5,) + net_spec.obs_shape)
    c = make_compressor(spec, net_spec, apply, distill_steps=1)
    plan.check_compressor(c, net_spec, spec)  # the up-front dry run accepts it
    actor_apply = jax.jit(c.actor_apply(apply))
    actor_params, state = c.init(params, jax.random.PRNGKey(5), obs)
    _check_grid_output(actor_apply, actor_params, obs, net_spec)
    actor_params, state = c.compress(jax.tree.map(lambda x: 1.01 * x, params), state, obs)
    _check_grid_output(actor_apply, actor_params, obs, net_spec)
    # Parameters outside the hidden layers (the Gaussian's log_std) keep float32 and their values.
    if net_spec.action_dim and "distill" not in state:
        log_std = actor_params["params"]["log_std"]
        assert log_std.dtype == jnp.float32
        np.testing.assert_array_equal(log_std, 1.01 * params["params"]["log_std"])
    if "bf16" in state:
        assert any(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(actor_params))
    # Degenerate inputs: all-zero weights, a dead unit/channel in every hidden layer, an all-zero
    # calibration batch (int8's static ranges are then 0); the actor still gives finite outputs.
    zero_params = jax.tree.map(jnp.zeros_like, params)
    for p, calib in ((zero_params, obs), (_zero_first_unit(params, net_spec), obs), (params, jnp.zeros_like(obs))):
        degenerate_params, _ = c.init(p, jax.random.PRNGKey(5), calib)
        _check_grid_output(actor_apply, degenerate_params, obs, net_spec)
    if spec == "none":  # all-zero weights give the uniform policy and value 0: the check can fail
        out = _check_grid_output(actor_apply, c.init(zero_params, jax.random.PRNGKey(5), obs)[0], obs, net_spec)
        np.testing.assert_array_equal(out, 0.0)


@pytest.mark.parametrize("family", ["mlp_q", "mlp_gaussian", "cnn_q", "minatar_q", "impala_q"])
def test_prune_of_one_unit_layers_keeps_one_unit(family, fraction=0.75):
    """A fraction that rounds a layer to zero units keeps one (``max(1, ...)``), and the network runs."""
    from accerl_jax.compressor import pruned_widths

    net_spec = networks.with_widths(GRID_FAMILIES[family], (1,) * len(GRID_FAMILIES[family].widths))
    assert pruned_widths(net_spec, fraction) == net_spec.widths
    params = networks.init_params(net_spec, jax.random.PRNGKey(0))
    apply = networks.make_apply(net_spec)
    obs = jax.random.normal(jax.random.PRNGKey(1), (3,) + net_spec.obs_shape)
    c = make_compressor(f"prune:{fraction}", net_spec, apply)
    actor_params, state = c.init(params, jax.random.PRNGKey(2))
    assert all(idx.shape == (1,) for idx in jax.tree.leaves(state["prune"].kept))
    np.testing.assert_allclose(_check_grid_output(jax.jit(c.actor_apply(apply)), actor_params, obs, net_spec),
                               apply(params, obs)[0], rtol=1e-6, atol=1e-6)  # one unit of one: unchanged


def test_compressor_that_assumes_one_family_is_refused_before_anything_is_written(tmp_path):
    """A stage written for CNNs only (it reads ``conv_0``) is refused by the plan's dry run on an MLP: a
    ConfigError naming the stage and the family, raised before the run folder is created."""
    from accerl_jax.run import plan, build as run
    from accerl_jax.compressor import Compressor, register_compressor, unregister_compressor
    from accerl_jax.config import Config, ConfigError

    def conv_only(network, teacher_apply, arg):
        first = jax.jit(lambda p: jax.tree.map(lambda w: w, p["params"]["conv_0"]))
        return Compressor(init=lambda params, key, obs=None: (params, first(params)),
                          compress=lambda params, state, obs: (params, first(params)),
                          actor_apply=lambda apply: apply)

    register_compressor("convonly", conv_only)
    try:
        cnn_spec, _, cnn_apply = _grid_net("cnn_q")
        plan.check_compressor(make_compressor("convonly", cnn_spec, cnn_apply), cnn_spec, "convonly")  # fits
        logdir = str(tmp_path / "run")
        cfg = Config(env="gymnax:Pendulum-v1", compressor="convonly", num_envs=2, rollout_length=4,
                     total_steps=64, logdir=logdir, progress=False)
        with pytest.raises(ConfigError, match=r"bad --compressor 'convonly' for the MLP Gaussian network.*conv_0"):
            run.setup(cfg)
        assert not os.path.exists(logdir)
    finally:
        unregister_compressor("convonly")


def test_images_too_small_for_the_cnn_are_refused():
    with pytest.raises(ValueError, match=r"6x6; the CNN's three 3x3 convolutions need at least 7x7"):
        networks.default_spec((6, 6, 2), 3)
    with pytest.raises(ValueError, match=r"5x9"):
        networks.default_spec((4, 5, 9), 3, channels_first=True)
    assert networks.default_spec((7, 7, 2), 3).family == "cnn"


def test_bf16_keeps_gaussian_log_std_float32():
    net_spec, params, apply = _grid_net("mlp_gaussian")
    params = jax.tree_util.tree_map_with_path(  # a log_std bf16 would round: 0.1234567 is not a bf16 number
        lambda p, x: jnp.full_like(x, 0.1234567) if "log_std" in _names(p) else x, params)
    actor_params, _ = make_compressor("bf16", net_spec, apply).init(params, jax.random.PRNGKey(0))
    assert actor_params["params"]["log_std"].dtype == jnp.float32
    np.testing.assert_array_equal(actor_params["params"]["log_std"], params["params"]["log_std"])
    assert actor_params["params"]["dense_0"]["kernel"].dtype == jnp.bfloat16
    assert actor_params["params"]["policy_head"]["kernel"].dtype == jnp.float32


# ------------------------------------------------------------------------------------------------ mask
# (more: global scope, the gradual schedule and masks through optimizers, at the end of the file)


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


@pytest.mark.parametrize("spec", ["distill:tiny", "distill:mlp"])  # a conv student, and an MLP on the frames
def test_distill_cnn_student_learns_teacher(spec):
    net = _net("minatar")
    c = _compressor(spec, "minatar")
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
        ("fakequant:8+distill:small", ["fakequant:8+distill:small", "cannot follow", "quantizer"]),
        ("int8+prune:0.5", ["int8+prune:0.5", "cannot follow"]),
        ("int8+mask:0.9", ["int8+mask:0.9", "cannot follow"]),
        ("bf16+int8", ["bf16+int8", "two quantizers"]),
        ("int8+fakequant:8", ["two quantizers"]),
        ("mask:0.9+prune:0.5", ["cannot follow"]),
        ("distill:small+prune:0.5", ["cannot follow"]),
        ("distill", ["distill", "only follows prune"]),
        ("mask:0.9+distill", ["cannot follow", "bare 'distill' fine-tune"]),
        ("prune:1.0", ["1.0"]),
        ("prune:x", ["x"]),
        ("int8:x", ["int8:x"]),
        ("bf16:2", ["bf16"]),
        ("mask:0.9,local", ["local", "global"]),
        ("mask:0.9,ramp=-1", ["-1"]),
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


# ------------------------------------------------------------------------- mask: scope, schedule, optimizers


def test_mask_zero_sparsity_is_identity():
    net = _net("mlp")
    c = make_compressor("mask:0", net.spec, net.apply)
    actor_params, state = c.init(net.params, jax.random.PRNGKey(0))
    for a, b in zip(jax.tree.leaves(actor_params), jax.tree.leaves(net.params)):
        np.testing.assert_array_equal(a, b)
    assert float(state["mask"].sparsity) == 0.0


def test_mask_global_uses_one_threshold():
    net = _net("mlp")
    # A layer with 3x larger weights keeps more of them under one global threshold.
    params = jax.tree_util.tree_map_with_path(lambda p, x: x * 3.0 if "dense_1" in _names(p) else x, net.params)
    c = _compressor("mask:0.9,global", "mlp")
    actor_params, state = c.init(params, jax.random.PRNGKey(0))
    kept, pruned, total = [], [], 0
    for (path, w), m in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(state["mask"].masks)):
        w, m = np.abs(np.asarray(w)), np.asarray(m)
        if _hidden_kernel(path, w):
            kept.append(w[m == 1])
            pruned.append(w[m == 0])
            total += w.size
        else:
            assert m.min() == 1.0
    n_kept = sum(k.size for k in kept)
    assert n_kept == round(0.1 * total)  # exact total count
    assert np.concatenate(kept).min() >= np.concatenate(pruned).max()  # one threshold across layers
    per_layer = [k.size / (k.size + p.size) for k, p in zip(kept, pruned)]
    assert max(per_layer) > 0.2 and min(per_layer) < 0.1, per_layer  # pruned unevenly, unlike per layer


def test_mask_gradual_schedule_follows_zhu_gupta():
    ramp, final = 10, 0.9
    expected = [final * (1 - (1 - min(t / ramp, 1.0)) ** 3) for t in range(14)]
    np.testing.assert_allclose([float(gradual_sparsity(final, t, ramp)) for t in range(14)], expected, rtol=1e-6)
    net = _net("mlp")
    c = _compressor(f"mask:{final},ramp={ramp}", "mlp")
    _, state = c.init(net.params, jax.random.PRNGKey(0))
    achieved = [float(state["mask"].sparsity)]
    for _ in range(12):
        _, state = c.compress(net.params, state, None)
        achieved.append(float(state["mask"].sparsity))
    np.testing.assert_allclose(achieved, expected[:13], atol=2e-3)
    assert int(state["mask"].step) == 13


@pytest.mark.parametrize("opt_name", ["momentum", "adam"])
def test_masks_stay_zero_through_optimizer(opt_name):
    """Masking the update after the optimizer keeps pruned weights at exactly 0 over many steps, although
    the optimizer's momentum for them is non-zero (the gradient itself is *not* masked)."""
    import optax

    net = _net("mlp")
    _, state = _compressor("mask:0.9", "mlp").init(net.params, jax.random.PRNGKey(0))
    masks = state["mask"].masks
    base = optax.sgd(1e-2, momentum=0.9) if opt_name == "momentum" else optax.adam(1e-2)
    opt = optax.chain(base, mask_updates(masks))
    params = jax.tree.map(lambda w, m: w * m, net.params, masks)
    opt_state = opt.init(params)
    obs = jax.random.normal(jax.random.PRNGKey(3), (64, 4))

    @jax.jit
    def step(params, opt_state, i):
        def loss(p):
            logits, value = net.apply(p, obs)
            return jnp.mean((value - jnp.sin(i)) ** 2) + jnp.mean(logits**2)

        grads = jax.grad(loss)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, grads

    start = params
    for i in range(300):
        params, opt_state, grads = step(params, opt_state, jnp.float32(i))
    moved = 0
    for (path, w), m, g, w0 in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(masks),
                                   jax.tree.leaves(grads), jax.tree.leaves(start)):
        w, m = np.asarray(w), np.asarray(m)
        if _hidden_kernel(path, w):
            assert np.all(w[m == 0] == 0.0), path  # exactly zero
            assert np.any(np.asarray(g)[m == 0] != 0.0)  # ... although their gradient is not
            moved += int(np.sum(w[m == 1] != np.asarray(w0)[m == 1]))
    assert moved > 0  # the kept weights did train
    # Without the mask transform the pruned weights regrow: the test can fail.
    plain = base
    p2, s2 = jax.tree.map(lambda w, m: w * m, net.params, masks), None
    s2 = plain.init(p2)
    g = jax.grad(lambda p: jnp.mean(net.apply(p, obs)[1] ** 2) + jnp.mean(net.apply(p, obs)[0] ** 2))(p2)
    u, _ = plain.update(g, s2, p2)
    regrown = [np.any(np.asarray(w)[np.asarray(m) == 0] != 0) for w, m in zip(jax.tree.leaves(optax.apply_updates(p2, u)), jax.tree.leaves(masks))]
    assert any(regrown)


# ----------------------------------------------------------------------------------------------- prune


@pytest.mark.parametrize("kind", ["mlp", "minatar", "atari", "minatar_net", "impala"])
def test_prune_zero_is_identity(kind):
    net = _net(kind)
    c = make_compressor("prune:0", net.spec, net.apply)
    actor_params, _ = c.init(net.params, jax.random.PRNGKey(0))
    assert jax.tree.structure(actor_params) == jax.tree.structure(net.params)
    for a, b in zip(jax.tree.leaves(actor_params), jax.tree.leaves(net.params)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(jax.jit(c.actor_apply(net.apply))(actor_params, net.obs)[0],
                                  net.japply(net.params, net.obs)[0])


def _zero_units(params, spec, fraction, key):
    """Zero the incoming weights and bias of a ``fraction`` of the units of every hidden layer."""
    p = {k: dict(v) for k, v in params["params"].items()}
    for layer in networks.hidden_layers(spec):
        n = p[layer.producers[0]]["kernel"].shape[-1]
        key, sub = jax.random.split(key)
        dead = jax.random.permutation(sub, n)[: int(round(fraction * n))]
        for m in layer.producers:  # every writer of a residual stream: the unit is dead in the stream
            p[m]["kernel"] = p[m]["kernel"].at[..., dead].set(0.0)
            p[m]["bias"] = p[m]["bias"].at[dead].set(0.0)
    return {"params": p}


@pytest.mark.parametrize("kind", ["mlp", "minatar", "atari", "minatar_net", "impala"])
def test_prune_removes_zero_units_without_changing_the_function(kind):
    net = _net(kind)
    params = _zero_units(net.params, net.spec, 0.5, jax.random.PRNGKey(7))
    c = _compressor("prune:0.5", kind)
    actor_params, state = c.init(params, jax.random.PRNGKey(0))
    apply = jax.jit(c.actor_apply(net.apply))
    assert networks.param_count(actor_params) < 0.4 * networks.param_count(params)
    logits, value = apply(actor_params, net.obs)
    ref_logits, ref_value = net.japply(params, net.obs)
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(value, ref_value, rtol=1e-5, atol=1e-4)
    # The removed units are exactly the zeroed ones.
    for layer, idx in state["prune"].kept.items():
        kernel = np.asarray(params["params"][layer]["kernel"])
        alive = np.nonzero(np.abs(kernel.reshape(-1, kernel.shape[-1])).sum(0) > 0)[0]
        np.testing.assert_array_equal(np.asarray(idx), alive)
    # Pruning units that were *not* zero does change the function: the test can fail.
    dense_actor, _ = c.init(net.params, jax.random.PRNGKey(0))
    assert not np.allclose(apply(dense_actor, net.obs)[0], net.japply(net.params, net.obs)[0], atol=1e-4)


def test_prune_keeps_highest_l1_units_and_shrinks_arrays():
    net = _net("minatar")
    c = _compressor("prune:0.75", "minatar")
    actor_params, state = c.init(net.params, jax.random.PRNGKey(0))
    shapes = jax.tree.map(np.shape, actor_params)["params"]
    assert shapes["conv_0"]["kernel"] == (3, 3, 4, 8)
    assert shapes["conv_1"]["kernel"] == (3, 3, 8, 16)
    assert shapes["dense_0"]["kernel"] == (4 * 4 * 16, 128)
    assert shapes["policy_head"]["kernel"] == (128, 6)
    # conv_1 is ranked after its inputs from the pruned conv_0 channels were removed.
    k = np.asarray(net.params["params"]["conv_1"]["kernel"])[:, :, np.asarray(state["prune"].kept["conv_0"]), :]
    b = np.asarray(net.params["params"]["conv_1"]["bias"])
    l1 = np.abs(k.reshape(-1, k.shape[-1])).sum(0) + np.abs(b)
    kept = np.asarray(state["prune"].kept["conv_1"])
    assert l1[kept].min() >= np.delete(l1, kept).max()


# ------------------------------------------------------------------------------------------------ int8


def _np_int8_reference(params, quantized, calib_obs, obs):
    """Static-range int8 MLP policy by hand (numpy float32) on ``obs``: weights per output channel at
    absmax/127.5 (checked against the int8 weights qwix stored, which are then used: within float error
    of half a step, float rounding may go either way); one activation scale per layer
    input, absmax/127.5 of that input in the *float* network on ``calib_obs``; int32 accumulation;
    heads in float."""
    p = jax.tree.map(lambda x: np.asarray(x, np.float32), params["params"])
    bound = np.float32(127.5)

    def layer(x, name, x_absmax=None):
        w, b = p[name]["kernel"], p[name]["bias"]
        if x_absmax is None:  # float
            return x @ w + b
        ws = np.abs(w).max(axis=0, keepdims=True) / bound
        stored = quantized["params"][name]["kernel"].array
        qw = np.asarray(stored.qvalue).astype(np.int32)
        steps = w / ws
        exact = np.clip(np.round(steps), -128, 127)
        # Within float error of half a step (the channel's largest weight at 127.5, or any weight at
        # k + 0.5: one of ~65k lands there for some initialisations) rounding may go either way.
        clear = (np.abs(steps) < 127.4) & (np.abs(np.abs(steps) % 1.0 - 0.5) > 1e-4)
        np.testing.assert_array_equal(qw[clear], exact[clear])
        assert np.abs(qw - exact).max() <= 1
        np.testing.assert_allclose(np.asarray(stored.scale), ws, rtol=1e-6)
        xs = np.float32(x_absmax) / bound
        qx = np.clip(np.round(x / xs), -128, 127).astype(np.int32)
        acc = qx @ qw  # int32 accumulation
        assert acc.dtype == np.int32
        return acc.astype(np.float32) * (xs * ws[0]) + b

    c = np.asarray(calib_obs, np.float32)
    h0 = np.maximum(layer(c, "dense_0"), 0)  # float pass on the calibration batch: activation ranges
    x = np.asarray(obs, np.float32)
    q0 = np.maximum(layer(x, "dense_0", np.abs(c).max()), 0)
    q1 = np.maximum(layer(q0, "dense_1", np.abs(h0).max()), 0)
    return layer(q1, "policy_head")


def test_int8_matches_hand_written_static_quantization():
    net = _net("mlp")
    c = _compressor("int8", "mlp")
    actor_params, state = c.init(net.params, jax.random.PRNGKey(0), net.obs)
    obs = 0.8 * jax.random.normal(jax.random.PRNGKey(21), net.obs.shape)  # other states, inside the range
    logits = jax.jit(c.actor_apply(net.apply))(actor_params, obs)[0]
    ref = _np_int8_reference(net.params, actor_params, net.obs, obs)
    np.testing.assert_allclose(logits, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    float_logits = net.japply(net.params, obs)[0]
    assert np.abs(float_logits - ref).max() > 1e-2  # the reference is really quantized
    assert int(state["int8"].calibrations) == 1
    assert float(state["int8"].act_absmax["dense_0"]) == pytest.approx(float(jnp.max(jnp.abs(net.obs))))


@pytest.mark.parametrize("kind", ["mlp", "minatar"])
def test_int8_accumulates_in_int32(kind):
    net = _net(kind)
    c = _compressor("int8", kind)
    actor_params, _ = c.init(net.params, jax.random.PRNGKey(0), net.obs)
    jaxpr = jax.make_jaxpr(c.actor_apply(net.apply))(actor_params, net.obs)
    ops = [e for e in jaxpr.jaxpr.eqns if e.primitive.name in ("dot_general", "conv_general_dilated")]
    int_ops = [e for e in ops if all(v.aval.dtype == jnp.int8 for v in e.invars)]
    assert int_ops and all(e.outvars[0].aval.dtype == jnp.int32 for e in int_ops)
    float_ops = [e for e in ops if e not in int_ops]
    assert len(float_ops) == 2  # the policy and value heads stay float by default
    assert all(e.outvars[0].aval.dtype == jnp.float32 for e in float_ops)
    # int8:all quantizes the heads too.
    c_all = _compressor("int8:all", kind)
    params_all, _ = c_all.init(net.params, jax.random.PRNGKey(0), net.obs)
    eqns = jax.make_jaxpr(c_all.actor_apply(net.apply))(params_all, net.obs).jaxpr.eqns
    assert all(e.outvars[0].aval.dtype == jnp.int32 for e in eqns if e.primitive.name in ("dot_general", "conv_general_dilated"))


def test_int8_tiny_channel_does_not_collapse():
    """Per-output-channel scales: a channel whose weights are 1e-6 of the others keeps its resolution."""
    net = _net("mlp")
    p = {k: dict(v) for k, v in net.params["params"].items()}
    p["dense_1"]["kernel"] = p["dense_1"]["kernel"].at[:, 3].multiply(1e-6)
    p["dense_1"]["bias"] = p["dense_1"]["bias"].at[3].set(0.0)
    params = {"params": p}
    c = _compressor("int8", "mlp")
    actor_params, _ = c.init(params, jax.random.PRNGKey(0), net.obs)
    q = actor_params["params"]["dense_1"]["kernel"].array
    col = np.asarray(q.qvalue)[:, 3]
    assert np.abs(col).max() == 127 and np.count_nonzero(col) > 0.5 * col.size
    w = np.asarray(p["dense_1"]["kernel"][:, 3])
    deq = col * np.asarray(q.scale)[0, 3]
    assert np.abs(deq - w).max() <= np.abs(w).max() / 127.5 / 2 * 1.001
    # A per-tensor scale would have rounded the whole channel to 0.
    assert np.all(np.round(w / (np.abs(np.asarray(p["dense_1"]["kernel"])).max() / 127.5)) == 0)


@pytest.mark.parametrize("kind", ["mlp", "minatar"])
def test_int8_error_bound(kind):
    net = _net(kind)
    c = _compressor("int8", kind)
    actor_params, _ = c.init(net.params, jax.random.PRNGKey(0), net.obs)
    logits, value = jax.jit(c.actor_apply(net.apply))(actor_params, net.obs)
    ref_logits, ref_value = net.japply(net.params, net.obs)
    assert float(jnp.max(jnp.abs(ref_logits))) > 1.0  # a sharp policy: the bound is not trivial
    # Weight and activation rounding each add at most half a step (1/255 of the range) per layer.
    rel = float(jnp.max(jnp.abs(logits - ref_logits)) / jnp.max(jnp.abs(ref_logits)))
    assert rel < 0.05, rel
    assert _kl(ref_logits, logits) < 5e-3
    np.testing.assert_allclose(value, ref_value, atol=0.05 * float(jnp.max(jnp.abs(ref_value))) + 1e-3)


def test_int8_requires_calibration_observations():
    net = _net("mlp")
    with pytest.raises(ValueError, match="calibrat"):
        _compressor("int8", "mlp").init(net.params, jax.random.PRNGKey(0))


# ------------------------------------------------------------------------------------------------ bf16


def test_bf16_computes_in_bfloat16_with_float_heads():
    net = _net("minatar")
    c = _compressor("bf16", "minatar")
    actor_params, _ = c.init(net.params, jax.random.PRNGKey(0))
    for path, w in jax.tree_util.tree_flatten_with_path(actor_params)[0]:
        in_head = any(h in _names(path) for h in HEADS)
        assert w.dtype == (jnp.float32 if in_head else jnp.bfloat16), path
    eqns = jax.make_jaxpr(c.actor_apply(net.apply))(actor_params, net.obs).jaxpr.eqns
    outs = [e.outvars[0].aval.dtype for e in eqns if e.primitive.name in ("dot_general", "conv_general_dilated")]
    assert outs.count(jnp.bfloat16) == 4 and outs.count(jnp.float32) == 2
    logits, _ = jax.jit(c.actor_apply(net.apply))(actor_params, net.obs)
    assert _kl(net.japply(net.params, net.obs)[0], logits) < 0.02


# --------------------------------------------------------------------------------------------- distill


def test_distillation_loss_temperature_scaling_by_hand():
    """T² scaling: loss(T) = T² · KL(softmax(t/T) ‖ softmax(s/T)), checked on a pair computed by hand."""
    t = np.array([[np.log(3.0), 0.0]], np.float32)  # softmax = (3/4, 1/4)
    s = np.array([[0.0, 0.0]], np.float32)  # softmax = (1/2, 1/2)
    kl_t1 = 0.75 * np.log(0.75 / 0.5) + 0.25 * np.log(0.25 / 0.5)
    zero_v = np.zeros((1,), np.float32)
    np.testing.assert_allclose(float(distillation_loss(t, zero_v, s, zero_v, 1.0, 0.5)), kl_t1, rtol=1e-5)
    # T = 2: teacher softmax(t/2) = (sqrt3, 1)/(sqrt3 + 1); the student stays uniform.
    p = np.array([np.sqrt(3.0), 1.0]) / (np.sqrt(3.0) + 1.0)
    kl_t2 = float(np.sum(p * np.log(p / 0.5)))
    np.testing.assert_allclose(float(distillation_loss(t, zero_v, s, zero_v, 2.0, 0.5)), 4.0 * kl_t2, rtol=1e-5)
    # Direction: KL(teacher ‖ student), not KL(student ‖ teacher) = 0.5 log(0.5/0.75) + 0.5 log(0.5/0.25).
    reverse = 0.5 * np.log(0.5 / 0.75) + 0.5 * np.log(0.5 / 0.25)
    assert abs(kl_t1 - reverse) > 0.01
    # Value MSE term: c_v · mean (V_s - V_t)².
    np.testing.assert_allclose(
        float(distillation_loss(t, np.array([1.0], np.float32), t, np.array([3.0], np.float32), 1.0, 0.5)), 2.0, rtol=1e-6)


def test_gaussian_distillation_kl_matches_distrax_and_students_learn():
    """Continuous policies distil with the exact KL(teacher ‖ student) of diagonal Gaussians."""
    import distrax

    from accerl_jax.compressor import distill

    rng = np.random.default_rng(0)
    t_out = rng.normal(size=(32, 6)).astype(np.float32)  # D = 3: mean then log-std
    s_out = rng.normal(size=(32, 6)).astype(np.float32)
    zero_v = np.zeros((32,), np.float32)

    def normal(out):
        return distrax.MultivariateNormalDiag(out[:, :3], np.exp(out[:, 3:]))

    expected = np.mean(normal(t_out).kl_divergence(normal(s_out)))
    reverse = np.mean(normal(s_out).kl_divergence(normal(t_out)))
    got = float(distillation_loss(t_out, zero_v, s_out, zero_v, 1.0, 0.5, continuous=True))
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert abs(expected - reverse) > 0.01  # the direction is checked, not only the value
    assert float(distillation_loss(t_out, zero_v, t_out, zero_v, 1.0, 0.5, continuous=True)) == pytest.approx(0, abs=1e-6)

    spec = networks.default_spec((3,), 0, action_dim=2)
    teacher = networks.init_params(spec, jax.random.PRNGKey(1))
    # A teacher with a non-trivial log-std, so that the student must learn it too.
    teacher = jax.tree_util.tree_map_with_path(
        lambda path, x: x - 0.7 if "log_std" in jax.tree_util.keystr(path) else x, teacher)
    teacher_apply = networks.make_apply(spec)
    c = distill(teacher_apply, networks.student_spec(spec, "small"), steps=25, learning_rate=3e-3)
    with pytest.raises(ValueError, match="temperature 1"):
        distill(teacher_apply, networks.student_spec(spec, "small"), temperature=2.0)
    obs = jax.random.normal(jax.random.PRNGKey(2), (128, 3))
    actor_params, state = c.init(teacher, jax.random.PRNGKey(0))
    apply = jax.jit(c.actor_apply(teacher_apply))
    t_pi = teacher_apply(teacher, obs)[0]

    def kl(params):
        return float(distillation_loss(t_pi, zero_v[:1], apply(params, obs)[0], zero_v[:1], 1.0, 0.0, continuous=True))

    kl0 = kl(actor_params)
    for _ in range(8):
        actor_params, state = c.compress(teacher, state, obs)
    assert kl(actor_params) < 0.2 * kl0, (kl0, kl(actor_params))


def test_prune_then_distill_starts_from_pruned_net_and_improves():
    net = _net("mlp")
    obs = jax.random.normal(jax.random.PRNGKey(11), (64, 4))
    c = _compressor("prune:0.5+distill", "mlp")
    actor_params, state = c.init(net.params, jax.random.PRNGKey(0))
    pruned, _ = _compressor("prune:0.5", "mlp").init(net.params, jax.random.PRNGKey(0))
    for a, b in zip(jax.tree.leaves(actor_params), jax.tree.leaves(pruned)):
        np.testing.assert_array_equal(a, b)  # the fine-tune starts at the structurally pruned net
    apply = jax.jit(c.actor_apply(net.apply))
    ref = net.japply(net.params, obs)[0]
    kl0 = _kl(ref, apply(actor_params, obs)[0])
    for _ in range(25):
        actor_params, state = c.compress(net.params, state, obs)
    kl1 = _kl(ref, apply(actor_params, obs)[0])
    assert kl1 < 0.5 * kl0, (kl0, kl1)


def test_async_distillation_publishes_versions_and_learns():
    from accerl_jax.compressor import distill

    net = _net("mlp")
    obs = jax.random.normal(jax.random.PRNGKey(11), (64, 4))
    student = networks.student_spec(net.spec, "small")
    c = distill(net.apply, student, steps=20, asynchronous=True)
    actor_params, state = c.init(net.params, jax.random.PRNGKey(0))
    apply = jax.jit(c.actor_apply(net.apply))
    ref = net.japply(net.params, obs)[0]
    kl0 = _kl(ref, apply(actor_params, obs)[0])
    versions = [int(state.version)]
    deadline = time.time() + 60
    while versions[-1] < 5 and time.time() < deadline:
        actor_params, state = c.compress(net.params, state, obs)  # returns at once with the last published
        versions.append(int(state.version))
        time.sleep(0.01)
    assert versions[-1] >= 5
    assert all(b >= a for a, b in zip(versions, versions[1:]))  # versions only go up
    assert int(state.steps) == 20 * int(state.version)
    kl1 = _kl(ref, apply(actor_params, obs)[0])
    assert kl1 < 0.5 * kl0, (kl0, kl1)
    # Without observations nothing is submitted: once the snapshots submitted above are done (under load
    # the worker may still be on one), the published student stays as it is.
    _, s_a = c.compress(net.params, state, None)
    deadline = time.time() + 60
    while time.time() < deadline:
        time.sleep(0.3)
        _, s_b = c.compress(net.params, state, None)
        if int(s_b.version) == int(s_a.version):
            break
        s_a = s_b
    time.sleep(0.5)
    _, s_c = c.compress(net.params, state, None)
    assert int(s_a.version) == int(s_b.version) == int(s_c.version)


@pytest.mark.parametrize("spec", ["distill:small", "distill:small+int8"])
def test_distill_takes_the_teachers_outputs_instead_of_a_forward_pass(spec):
    """``compress(..., teacher=(logits, values))`` distils on the given outputs: given the teacher's own,
    it makes the student a forward pass of ``params`` would; the ``params`` are then not read; given
    other outputs, another student. Only chains with a distill stage declare ``takes_teacher``."""
    net = _net("mlp")
    c = _compressor(spec, "mlp")
    assert c.takes_teacher and not _compressor("int8", "mlp").takes_teacher
    assert not _compressor("none", "mlp").takes_teacher
    obs = net.obs
    _, state = c.init(net.params, jax.random.PRNGKey(0), obs)
    other = jax.tree.map(lambda x: -x, net.params)
    fresh, fresh_state = c.compress(net.params, state, obs)
    given, given_state = c.compress(other, state, obs, teacher=net.japply(net.params, obs))
    _assert_trees_close = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves((fresh, fresh_state)), jax.tree.leaves((given, given_state)), strict=True):
        _assert_trees_close(np.asarray(a, np.float32), np.asarray(b, np.float32))
    assert int(given_state["distill"].version) == 1 and int(given_state["distill"].steps) == 4
    _, wrong_state = c.compress(net.params, state, obs, teacher=net.japply(other, obs))
    assert float(wrong_state["distill"].loss) != pytest.approx(float(fresh_state["distill"].loss), rel=1e-3)


def test_children_loss_by_hand():
    """:func:`children_loss` against numpy: the masked KL and value terms, and the sibling term centred on
    each root's mean over its valid children (a value error common to a root's children costs nothing there)."""
    from accerl_jax.compressor.distill import children_loss

    rng = np.random.default_rng(0)
    t_logits, s_logits = rng.normal(size=(2, 3, 3, 4)).astype(np.float32)
    t_value, s_value = rng.normal(size=(2, 3, 3)).astype(np.float32)
    valid = np.array([[True, True, False], [True, False, True], [False, False, False]])
    temp, c_v, c_sib = 1.5, 0.5, 10.0
    log_p, log_q = _np_log_softmax(t_logits / temp), _np_log_softmax(s_logits / temp)
    kl = (np.exp(log_p) * (log_p - log_q)).sum(-1)
    w = valid.astype(np.float64)
    term = (w * (temp**2 * kl + c_v * (s_value - t_value) ** 2)).sum() / w.sum()
    sib = 0.0
    for i in range(3):
        if valid[i].any():
            d = s_value[i, valid[i]] - t_value[i, valid[i]]
            sib += ((d - d.mean()) ** 2).sum()
    got = children_loss(t_logits, t_value, s_logits, s_value, valid, temp, c_v, c_sib)
    np.testing.assert_allclose(float(got), term + c_sib * sib / w.sum(), rtol=1e-5)
    shifted = children_loss(t_logits, t_value, t_logits, t_value + np.array([[1.0], [-2.0], [3.0]], np.float32),
                            valid, temp, 0.0, c_sib)
    assert abs(float(shifted)) < 1e-5
    assert float(children_loss(t_logits, t_value, s_logits, s_value, np.zeros_like(valid), temp, c_v, c_sib)) == 0.0


def test_distill_on_search_children_fits_the_siblings_value_differences():
    """``distill:small`` with ``children`` (``--distill-children``) declares ``takes_children`` and, given
    the children of the roots, fits the teacher's value differences between siblings better than the same
    steps on the roots alone (measured: the centred error 0.0077 against 0.0356); without ``children`` it
    ignores them (the same student as no children given)."""
    from accerl_jax.compressor.distill import distill

    net = _net("mlp")
    student = networks.student_spec(net.spec, "small")
    obs = jax.random.normal(jax.random.PRNGKey(7), (64,) + net.spec.obs_shape)
    kids = jax.random.normal(jax.random.PRNGKey(8), (64, 3) + net.spec.obs_shape) * 2.0
    valid = jnp.ones((64, 3), bool).at[0, 1].set(False)
    _, t_value = net.japply(net.params, kids.reshape((-1,) + net.spec.obs_shape))
    t_value = t_value.reshape(64, 3)

    def centred_error(c, **kw):
        _, state = c.init(net.params, jax.random.PRNGKey(0))
        for _ in range(25):
            _, state = c.compress(net.params, state, obs, **kw)
        _, s_value = networks.make_apply(student)(state.student_params, kids.reshape((-1,) + net.spec.obs_shape))
        d = s_value.reshape(64, 3) - t_value
        return float(jnp.mean((d - d.mean(1, keepdims=True)) ** 2)), state

    with_kids = distill(net.apply, student, steps=8, children=64)
    roots_only = distill(net.apply, student, steps=8)
    assert with_kids.takes_children and not roots_only.takes_children
    assert make_compressor("distill:small+int8", net.spec, net.apply, distill_children=4).takes_children
    fitted, _ = centred_error(with_kids, children=(kids, valid))
    plain, plain_state = centred_error(roots_only)
    ignored, ignored_state = centred_error(roots_only, children=(kids, valid))
    print(f"centred sibling error {fitted:.4f} with children, {plain:.4f} without")
    assert fitted < 0.7 * plain, (fitted, plain)
    assert ignored == plain
    for a, b in zip(jax.tree.leaves(plain_state), jax.tree.leaves(ignored_state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("kind", ["mlp", "minatar"])  # fused into one call, and the conv student's loop
def test_distill_minibatches_learn_every_mth_row_per_step(kind):
    """``minibatches=M`` (``--distill-minibatches``): gradient step ``i`` learns the rows ``i mod M``,
    ``i mod M + M``, ... of the first ``(N // M) * M`` observations and, where ``K >= M``, of the roots'
    children (all ``K`` where ``K < M``): the same student as one full-batch step per minibatch in turn.
    Fewer observations than ``M`` are all learnt at every step; ``M < 1``, or ``M > 1`` without a distill
    stage, is refused naming the value."""
    from accerl_jax.compressor.distill import distill

    net = _net(kind)
    student = networks.student_spec(net.spec, "small" if kind == "mlp" else "tiny")
    shape = net.spec.obs_shape
    obs = jax.random.normal(jax.random.PRNGKey(7), (10,) + shape)  # 10 rows, M = 4: the last 2 sit out
    for k in (8, 3):  # K >= M: the children are minibatched too; K < M: every step learns them all
        kids = jax.random.normal(jax.random.PRNGKey(8), (k, 3) + shape)
        valid = jnp.ones((k, 3), bool).at[0, 1].set(False)
        batched = distill(net.apply, student, steps=6, minibatches=4, children=64)
        one = distill(net.apply, student, steps=1, children=64)
        _, got = batched.init(net.params, jax.random.PRNGKey(0))
        _, want = one.init(net.params, jax.random.PRNGKey(0))
        got = batched.compress(net.params, got, obs, children=(kids, valid))[1]
        for i in range(6):
            rows = slice(i % 4, 8, 4)
            c_rows = rows if k >= 4 else slice(None)  # K = 3 < M: all 3 roots' children at every step
            want = one.compress(net.params, want, obs[rows], children=(kids[c_rows], valid[c_rows]))[1]
        assert int(got.steps) == int(want.steps) == 6
        for a, b in zip(jax.tree.leaves(got.student_params), jax.tree.leaves(want.student_params), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-6)
    full = distill(net.apply, student, steps=6, children=64)  # full-batch steps make another student
    full_state = full.compress(net.params, full.init(net.params, jax.random.PRNGKey(0))[1], obs,
                               children=(kids, valid))[1]
    assert not all(np.allclose(np.asarray(a), np.asarray(b)) for a, b in
                   zip(jax.tree.leaves(full_state.student_params), jax.tree.leaves(got.student_params)))
    with pytest.raises(ValueError, match="minibatches >= 1, got 0"):
        distill(net.apply, student, minibatches=0)
    few, plain = distill(net.apply, student, minibatches=16), distill(net.apply, student)
    got = few.compress(net.params, few.init(net.params, jax.random.PRNGKey(0))[1], obs)[1]
    want = plain.compress(net.params, plain.init(net.params, jax.random.PRNGKey(0))[1], obs)[1]
    for a, b in zip(jax.tree.leaves(got.student_params), jax.tree.leaves(want.student_params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-6)
    with pytest.raises(ValueError, match="bad --distill-minibatches 4 with --compressor 'int8'"):
        make_compressor("int8", net.spec, net.apply, distill_minibatches=4)


def test_async_distillation_takes_the_teachers_outputs():
    """The background thread distils on the outputs handed in with the snapshot, as the synchronous mode."""
    from accerl_jax.compressor import distill

    net = _net("mlp")
    student = networks.student_spec(net.spec, "small")
    sync, asynchronous = (distill(net.apply, student, steps=3, asynchronous=a) for a in (False, True))
    _, s0 = sync.init(net.params, jax.random.PRNGKey(0))
    asynchronous.init(net.params, jax.random.PRNGKey(0))
    teacher = net.japply(net.params, net.obs)
    _, want = sync.compress(net.params, s0, net.obs)
    asynchronous.compress(jax.tree.map(lambda x: -x, net.params), s0, net.obs, teacher=teacher)
    deadline = time.time() + 60
    while time.time() < deadline:
        _, got = asynchronous.compress(net.params, s0, None)
        if int(got.version) == 1:
            break
        time.sleep(0.05)
    assert int(got.version) == 1 and int(got.steps) == 3
    for a, b in zip(jax.tree.leaves(want.student_params), jax.tree.leaves(got.student_params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
