"""Tests for the network families of ``--network`` (accerl_jax.networks): shapes and dtypes, the MLP on
flattened images, the MinAtar network's patch-matmul convolution against flax's own ``nn.Conv``, each
family through a short training run, and APPO's per-minibatch advantage normalisation
(``--normalize-advantages``); the IMPALA ResNet's layers, hidden_layers/student_spec for every family,
the CLI's refusals (exit 2), and a one-update training run per family on gymnax's Breakout-MinAtar. The
compressors on each family are in tests/test_compressor.py's conformance grid."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from accerl_jax import learner, networks, train
from accerl_jax.config import Config
from accerl_jax.compressor import make_compressor

IMAGE = (10, 10, 4)  # a MinAtar Breakout grid


@pytest.mark.parametrize("network, family, widths", [("auto", "cnn", (32, 64, 64, 512)), ("mlp", "mlp", (64, 64)),
                                                     ("cnn", "cnn", (32, 64, 64, 512)),
                                                     ("minatar", "minatar", (16, 128)),
                                                     ("impala", "impala", (16, 32, 32, 256))])
def test_each_family_on_images(network, family, widths):
    spec = networks.default_spec(IMAGE, 3, network=network)
    assert (spec.family, spec.widths) == (family, widths)
    spec = networks.with_widths(spec, [max(2, w // 8) for w in spec.widths])
    params = networks.init_params(spec, jax.random.PRNGKey(0))
    obs = jax.random.uniform(jax.random.PRNGKey(1), (2, 5) + IMAGE)
    logits, value = networks.make_apply(spec)(params, obs)
    assert logits.shape == (2, 5, 3) and value.shape == (2, 5)
    assert logits.dtype == jnp.float32 and value.dtype == jnp.float32
    assert np.all(np.isfinite(logits)) and np.all(np.isfinite(value))


def test_vectors_keep_the_mlp_and_refuse_conv_families():
    assert networks.default_spec((4,), 2) == networks.default_spec((4,), 2, network="mlp")
    for network in ("cnn", "minatar", "impala"):
        with pytest.raises(ValueError, match="takes image observations"):
            networks.default_spec((4,), 2, network=network)
    with pytest.raises(ValueError, match="unknown network 'resnet'"):
        networks.default_spec(IMAGE, 2, network="resnet")
    with pytest.raises(ValueError, match="at least 3x3"):
        networks.default_spec((2, 2, 4), 2, network="minatar")


def test_mlp_on_images_reads_the_flattened_image():
    """The MLP on images equals the same MLP on the image flattened by hand (uint8 scaled by 1/255)."""
    image = networks.NetworkSpec("mlp", (8,), 3, IMAGE)
    flat = networks.NetworkSpec("mlp", (8,), 3, (int(np.prod(IMAGE)),))
    params = networks.init_params(image, jax.random.PRNGKey(0))
    obs = jax.random.randint(jax.random.PRNGKey(1), (6,) + IMAGE, 0, 256).astype(jnp.uint8)
    got = networks.make_apply(image)(params, obs)
    want = networks.make_apply(flat)(params, obs.reshape(6, -1).astype(jnp.float32) / 255.0)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_minatar_patch_matmul_is_the_convolution():
    """conv_0 (a dense layer over 3x3 patches) computes flax's unpadded 3x3 stride-1 ``nn.Conv`` with the
    same kernel reshaped to ``[3, 3, C, out]``."""
    spec = networks.NetworkSpec("minatar", (5, 7), 3, IMAGE)
    params = networks.init_params(spec, jax.random.PRNGKey(2))
    kernel, bias = params["params"]["conv_0"]["kernel"], params["params"]["conv_0"]["bias"]
    assert kernel.shape == (9 * IMAGE[-1], 5)
    x = jax.random.normal(jax.random.PRNGKey(3), (4,) + IMAGE)
    conv = nn.Conv(5, (3, 3), padding="VALID")
    want = conv.apply({"params": {"kernel": kernel.reshape(3, 3, IMAGE[-1], 5), "bias": bias}}, x)
    got = networks._patches(x, 3) @ kernel + bias[None, None, None]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_minatar_hidden_layers_match_the_parameters():
    spec = networks.NetworkSpec("minatar", (5, 7), 3, IMAGE, q_head=True)
    params = networks.init_params(spec, jax.random.PRNGKey(0))["params"]
    layers = networks.hidden_layers(spec)
    assert [layer.producers for layer in layers] == [("conv_0",), ("dense_0",)]
    assert [layer.consumers for layer in layers] == [("dense_0",), ("policy_head", "value_head", "q_head")]
    for layer in layers:
        assert params[layer.producers[0]]["kernel"].shape[-1] == spec.widths[layer.width]


@pytest.mark.parametrize("network", ["mlp", "minatar"])
def test_a_short_appo_run_per_family(tmp_path, network):
    rc = train.main(["--env", "gymnax:Breakout-MinAtar", "--network", network, "--hidden-sizes", "8", "8",
                     "--total-steps", "256", "--num-envs", "8", "--rollout-length", "16", "--minibatches", "2",
                     "--epochs", "2", "--normalize-advantages", "--no-progress", "--logdir", str(tmp_path / network)])
    assert rc == 0


def test_normalized_advantages_by_hand():
    adv = jax.random.normal(jax.random.PRNGKey(0), (6, 4)) * 3.0 + 2.0
    mask = (jax.random.uniform(jax.random.PRNGKey(1), (6, 4)) > 0.3).astype(jnp.float32)
    got = learner.normalized_advantages(adv, mask)
    valid = np.asarray(adv)[np.asarray(mask) > 0]
    want = np.where(np.asarray(mask) > 0, (np.asarray(adv) - valid.mean()) / (valid.std() + 1e-8), 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    g = np.asarray(got)[np.asarray(mask) > 0]
    assert abs(g.mean()) < 1e-5 and abs(g.std() - 1.0) < 1e-4
    none = learner.normalized_advantages(adv, jnp.zeros_like(mask))  # no valid sample: zeros, no 1e8 blow-up
    np.testing.assert_array_equal(none, 0.0)


GRID = (10, 10, 4)  # a MinAtar observation [H, W, C]
FRAMES = (4, 12, 12)  # channels-first uint8 frames, as envpool's (small)
TINY = {"mlp": (8, 8), "cnn": (4, 4, 4, 8), "minatar": (4, 8), "impala": (4, 4, 8)}


def _tiny(spec):
    """``spec`` with :data:`TINY` widths (as ``--hidden-sizes``: impala's count of stacks may differ)."""
    return dataclasses.replace(spec, widths=TINY[spec.family])


def _obs(shape, key=0, batch=(3, 2)):
    """Random observations ``[*batch, *shape]``: uint8 pixels for channels-first frames, 0/1 floats else."""
    k = jax.random.PRNGKey(key)
    if shape == FRAMES:
        return jax.random.randint(k, batch + shape, 0, 256).astype(jnp.uint8)
    return jax.random.bernoulli(k, 0.3, batch + shape).astype(jnp.float32)


def test_auto_is_mlp_for_vectors_and_the_nature_cnn_for_images():
    assert networks.default_spec((4,), 2) == networks.default_spec((4,), 2, network="auto")
    assert networks.default_spec((4,), 2).family == "mlp" and networks.default_spec((4,), 2).widths == (64, 64)
    image = networks.default_spec(GRID, 6, network="auto")
    assert (image.family, image.widths) == ("cnn", (32, 64, 64, 512))
    assert networks.default_spec(GRID, 6, network="minatar").widths == (16, 128)
    assert networks.default_spec(GRID, 6, network="impala").widths == (16, 32, 32, 256)


@pytest.mark.parametrize("shape", [GRID, FRAMES])
@pytest.mark.parametrize("family", networks.FAMILIES)
def test_each_family_forward_shapes_and_dtypes(family, shape):
    spec = networks.default_spec(shape, 5, channels_first=shape == FRAMES, network=family, q_head=True)
    spec = _tiny(spec)
    params = networks.init_params(spec, jax.random.PRNGKey(0))
    obs = _obs(shape)
    logits, value = jax.jit(networks.make_apply(spec))(params, obs)
    assert logits.shape == (3, 2, 5) and logits.dtype == jnp.float32
    assert value.shape == (3, 2) and value.dtype == jnp.float32
    _, _, q = networks.make_apply_with_q(spec)(params, obs)
    assert q.shape == (3, 2, 5) and q.dtype == jnp.float32
    assert np.all(np.isfinite(logits)) and np.all(np.isfinite(value)) and np.all(np.isfinite(q))
    # The observation matters: different observations give different outputs.
    other = networks.make_apply(spec)(params, _obs(shape, key=1))[0]
    assert not np.allclose(logits, other)


def test_mlp_on_images_is_the_mlp_of_the_flattened_scaled_observation():
    spec = networks.default_spec(FRAMES, 4, channels_first=True, network="mlp")
    assert spec.family == "mlp" and spec.widths == (64, 64)
    flat = networks.NetworkSpec("mlp", spec.widths, 4, (int(np.prod(FRAMES)),))
    params = networks.init_params(spec, jax.random.PRNGKey(0))
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, networks.init_params(flat, jax.random.PRNGKey(0)))
    obs = _obs(FRAMES)
    got = networks.make_apply(spec)(params, obs)
    want = networks.make_apply(flat)(params, obs.reshape(3, 2, -1).astype(jnp.float32) / 255.0)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # uint8 is scaled: the raw pixel values would give other outputs.
    raw = networks.make_apply(flat)(params, obs.reshape(3, 2, -1).astype(jnp.float32))[0]
    assert not np.allclose(got[0], raw, atol=1e-3)


def test_impala_is_fifteen_convs_three_pools_and_a_dense_layer():
    spec = networks.default_spec((4, 84, 84), 6, channels_first=True, network="impala")
    p = networks.init_params(spec, jax.random.PRNGKey(0))["params"]
    convs = sorted(k for k in p if "conv" in k)
    assert len(convs) == 15
    assert [p[f"stack_{s}_conv"]["kernel"].shape for s in range(3)] == [(3, 3, 4, 16), (3, 3, 16, 32), (3, 3, 32, 32)]
    assert p["dense_0"]["kernel"].shape == (11 * 11 * 32, 256)  # 84 -> 42 -> 21 -> 11 (SAME pools, stride 2)


@pytest.mark.parametrize("family", networks.FAMILIES)
def test_hidden_layers_name_every_hidden_kernel_once(family):
    spec = _tiny(networks.default_spec(GRID, 6, network=family, q_head=True))
    params = networks.init_params(spec, jax.random.PRNGKey(0))["params"]
    layers = networks.hidden_layers(spec)
    producers = [m for layer in layers for m in layer.producers]
    hidden = {k for k in params if not k.endswith("_head")}
    assert sorted(producers) == sorted(hidden)  # each hidden module writes exactly one unit set
    for layer in layers:
        width = spec.widths[layer.width]
        assert all(params[m]["kernel"].shape[-1] == width for m in layer.producers)
        assert layer.consumers and all(c in params for c in layer.consumers)


def test_impala_streams_share_one_channel_set_when_pruned():
    spec = dataclasses.replace(networks.default_spec(GRID, 6, network="impala"), widths=(8, 8, 16))
    stream = networks.hidden_layers(spec)[0]
    assert stream.producers == ("stack_0_conv", "stack_0_res_0_conv_1", "stack_0_res_1_conv_1")
    params = networks.init_params(spec, jax.random.PRNGKey(0))
    _, state = make_compressor("prune:0.5", spec, networks.make_apply(spec)).init(params, jax.random.PRNGKey(1))
    kept = state["prune"].kept
    for m in stream.producers[1:]:
        np.testing.assert_array_equal(kept[m], kept[stream.producers[0]])


def _torso_by_hand(params, obs, act, prefix="dense"):
    """The MLP torso of ``params`` on ``obs`` in numpy: each hidden layer ``act(x W + b)``."""
    x = np.asarray(obs, np.float64)
    i = 0
    while f"{prefix}_{i}" in params["params"]:
        layer = params["params"][f"{prefix}_{i}"]
        x = act(x @ np.asarray(layer["kernel"], np.float64) + np.asarray(layer["bias"], np.float64))
        i += 1
    return x


@pytest.mark.parametrize("action_dim", [0, 3])
@pytest.mark.parametrize("activation, act", [("relu", lambda x: np.maximum(x, 0.0)), ("tanh", np.tanh)])
def test_mlp_activation_is_the_hidden_layers_nonlinearity(activation, act, action_dim):
    spec = dataclasses.replace(networks.default_spec((5,), 4, action_dim=action_dim), activation=activation)
    params = networks.init_params(spec, jax.random.PRNGKey(1))
    obs = 3.0 * jax.random.normal(jax.random.PRNGKey(2), (7, 5))
    policy_out, value = networks.make_apply(spec)(params, obs)
    head, vhead = params["params"]["policy_head"], params["params"]["value_head"]
    want_pi = _torso_by_hand(params, obs, act) @ np.asarray(head["kernel"], np.float64) + np.asarray(head["bias"])
    want_v = (_torso_by_hand(params, obs, act, "value_dense") @ np.asarray(vhead["kernel"], np.float64)
              + np.asarray(vhead["bias"]))[:, 0]
    np.testing.assert_allclose(np.asarray(policy_out)[:, :want_pi.shape[1]], want_pi, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(value, want_v, rtol=1e-4, atol=1e-5)
    other = dataclasses.replace(spec, activation="tanh" if activation == "relu" else "relu")
    assert not np.allclose(networks.make_apply(other)(params, obs)[1], value, atol=1e-3)  # the choice matters


def test_activation_survives_students_and_pruning_and_is_refused_on_conv_nets():
    spec = dataclasses.replace(networks.default_spec((5,), 4), activation="tanh")
    assert networks.student_spec(spec, "small").activation == "tanh"
    assert networks.with_widths(spec, (32, 32)).activation == "tanh"
    # The pruned actor is the narrower tanh network: its outputs are the hand-computed tanh MLP's.
    params = networks.init_params(spec, jax.random.PRNGKey(1))
    obs = jax.random.normal(jax.random.PRNGKey(2), (6, 5))
    pruner = make_compressor("prune:0.5", spec, networks.make_apply(spec))
    pruned, _ = pruner.init(params, jax.random.PRNGKey(3), obs)
    assert pruned["params"]["dense_0"]["kernel"].shape == (5, 32)
    head = pruned["params"]["policy_head"]
    want = _torso_by_hand(pruned, obs, np.tanh) @ np.asarray(head["kernel"], np.float64) + np.asarray(head["bias"])
    np.testing.assert_allclose(pruner.actor_apply(networks.make_apply(spec))(pruned, obs)[0], want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="activation 'tanh' applies to the 'mlp' family only"):
        networks.build(dataclasses.replace(networks.default_spec(GRID, 6, network="cnn"), activation="tanh"))
    with pytest.raises(ValueError, match="unknown activation 'gelu'; expected one of relu, tanh"):
        networks.build(dataclasses.replace(spec, activation="gelu"))
    # The flag reaches the run's network; a checkpoint from before the flag ran ReLU, the default: it resumes,
    # and another activation is a difference.
    from accerl_jax.envs import make_env
    from accerl_jax.run import plan

    info = make_env("gymnax:CartPole-v1", 1).info
    assert plan.make_spec(Config(activation="tanh"), info).activation == "tanh"
    assert plan.make_spec(Config(), info).activation == "relu"

    saved = plan.config_record(Config(activation="tanh"))
    assert plan.config_differences(saved, plan.config_record(Config())) == [
        "--activation 'tanh' (checkpoint) vs 'relu' (now)"]
    older = {k: v for k, v in plan.config_record(Config()).items() if k != "activation"}
    assert plan.config_differences(older, plan.config_record(Config())) == []


@pytest.mark.parametrize("family", networks.FAMILIES)
def test_student_is_a_narrower_network_of_the_same_family(family):
    spec = networks.default_spec(GRID, 6, network=family)
    student = networks.student_spec(spec, "half")
    assert student.family == family and len(student.widths) == len(spec.widths)
    assert all(s < w for s, w in zip(student.widths, spec.widths))
    def count(s):  # shapes only: nothing compiled
        return networks.param_count(jax.eval_shape(networks.build(s).init, jax.random.PRNGKey(0),
                                                   jnp.zeros((1,) + s.obs_shape)))
    assert count(student) < count(spec)


@pytest.mark.parametrize("family", ["cnn", "minatar", "impala"])
def test_the_mlp_student_of_an_image_network_flattens_its_frames(family):
    spec = networks.default_spec(GRID, 6, network=family)
    student = networks.student_spec(spec, "mlp")
    assert (student.family, student.widths) == ("mlp", networks.MLP_STUDENT_WIDTHS)
    assert student.obs_shape == spec.obs_shape and student.num_actions == spec.num_actions
    logits, value = networks.build(student).apply(networks.init_params(student, jax.random.PRNGKey(0)),
                                                  jnp.zeros((2,) + spec.obs_shape))
    assert logits.shape == (2, 6) and value.shape == (2,)


def test_an_mlp_has_no_mlp_student():
    spec = networks.default_spec((4,), 2)
    with pytest.raises(ValueError, match="MLP already; use one of half, small, tiny"):
        networks.student_spec(spec, "mlp")


@pytest.mark.parametrize("family, widths", [("cnn", (4, 4)), ("minatar", (4, 4, 4)), ("impala", (8,)), ("mlp", ())])
def test_check_widths_names_the_family_and_what_it_takes(family, widths):
    meaning = networks.WIDTHS_MEANING[family]
    with pytest.raises(ValueError, match=f"do not fit the {family} network: expected {meaning}"):
        networks.check_widths(family, widths)


def test_conv_families_refuse_vectors_and_too_small_images():
    for family in ("cnn", "minatar", "impala"):
        with pytest.raises(ValueError, match=f"network '{family}' takes image observations"):
            networks.default_spec((4,), 2, network=family)
    with pytest.raises(ValueError, match=r"2x2; the MinAtar network's 3x3 convolution need at least 3x3"):
        networks.default_spec((2, 2, 1), 2, network="minatar")
    networks.default_spec((3, 3, 1), 2, network="minatar")  # the smallest it takes
    networks.default_spec((1, 1, 1), 2, network="impala")  # SAME convs and pools take any size


@pytest.mark.parametrize("argv, needles", [
    (["--network", "resnet"], ["bad --network 'resnet'", "'auto', 'mlp', 'cnn', 'minatar', 'impala'"]),
    (["--activation", "gelu"], ["bad --activation 'gelu'", "'relu' or 'tanh'"]),
    (["--env", "gymnax:Breakout-MinAtar", "--activation", "tanh"],
     ["bad --activation tanh for gymnax:Breakout-MinAtar (the cnn network)", "use ReLU"]),
    (["--network", "cnn"], ["bad --network 'cnn' for gymnax:CartPole-v1", "takes image observations"]),
    (["--network", "impala"], ["bad --network 'impala' for gymnax:CartPole-v1", "takes image observations"]),
    (["--env", "gymnax:Breakout-MinAtar", "--network", "minatar", "--hidden-sizes", "16"],
     ["bad --hidden-sizes 16 for gymnax:Breakout-MinAtar (the minatar network)",
      "expected 2 numbers, the conv channel count then the dense size, e.g. 16 128"]),
    (["--env", "gymnax:Breakout-MinAtar", "--network", "impala", "--hidden-sizes", "16"],
     ["bad --hidden-sizes 16 for gymnax:Breakout-MinAtar (the impala network)",
      "2 or more numbers"]),
])
def test_cli_refuses_networks_that_do_not_fit_with_exit_2(argv, needles, tmp_path, capsys):
    logdir = tmp_path / "run"
    assert train.main([*argv, "--total-steps", "64", "--logdir", str(logdir), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    for needle in needles:
        assert needle in err, (needle, err)
    assert not logdir.exists()


def test_a_resumed_run_may_not_change_its_network():
    from accerl_jax.run import plan

    saved = plan.config_record(Config(env="gymnax:Breakout-MinAtar", network="minatar"))
    now = plan.config_record(Config(env="gymnax:Breakout-MinAtar", network="impala"))
    assert plan.config_differences(saved, now) == ["--network 'minatar' (checkpoint) vs 'impala' (now)"]
    older = {k: v for k, v in saved.items() if k != "network"}  # a checkpoint from before the flag: auto
    assert plan.config_differences(older, plan.config_record(Config(env="gymnax:Breakout-MinAtar"))) == []


# The conv families' runs compile unrolled conv gradient steps (XLA:CPU): a minute or two each on a shared CPU.
@pytest.mark.parametrize("family", ["mlp", "minatar", pytest.param("cnn", marks=pytest.mark.slow),
                                    pytest.param("impala", marks=pytest.mark.slow)])
def test_one_update_trains_each_family_on_breakout_minatar(family, tmp_path):
    from accerl_jax import run_training

    cfg = train.parse_config(["--env", "gymnax:Breakout-MinAtar", "--network", family,
                              "--hidden-sizes", *map(str, TINY[family]), "--total-steps", "32", "--num-envs", "4",
                              "--rollout-length", "8", "--checkpoint-every", "0", "--logdir", str(tmp_path / "run"),
                              "--no-progress"])
    summary = run_training(cfg)
    assert summary["updates"] == 1 and summary["total_env_steps"] == 32
    net = summary["learner_network"]
    assert net["family"] == family and list(net["widths"]) == list(TINY[family])
    assert dataclasses.asdict(networks.default_spec(GRID, 3, network=family))["obs_shape"] == tuple(net["obs_shape"])


def test_xla_treats_impala_as_a_conv_net_and_minatar_as_a_matmul_net():
    """IMPALA's convs get the conv nets' XLA:CPU settings (no YNNPACK, unrolled gradient loops, the sequential
    loop with one seed); the MinAtar net's patch-matmul conv is a matmul and keeps the MLP's (its docstring has
    the measurement)."""
    from accerl_jax.platform import xla
    from accerl_jax.run.plan import choose_loop

    cfg = Config(env="gymnax:Breakout-MinAtar")
    for family, conv in (("cnn", True), ("impala", True), ("minatar", False), ("mlp", False)):
        assert xla.is_conv(family) == conv
        assert xla.options_for(family, "cpu") == (xla.NO_YNN if conv else None)
        assert xla.options_for(family, "gpu") is None
        assert xla.gradient_loop_unroll(family, 6, "cpu") == (6 if conv else 1)
        assert choose_loop(cfg, family=family, backend="cpu") == ("sequential" if conv else "anakin")
