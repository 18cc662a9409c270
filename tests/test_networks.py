"""Tests for the network families of ``--network`` (accerl_jax.networks): shapes and dtypes, the MLP on
flattened images, the MinAtar network's patch-matmul convolution against flax's own ``nn.Conv``, each
family through a short training run, and APPO's per-minibatch advantage normalisation
(``--normalize-advantages``)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from accerl_jax import learner, networks, train

IMAGE = (10, 10, 4)  # a MinAtar Breakout grid


@pytest.mark.parametrize("network, family, widths", [("auto", "cnn", (32, 64, 64, 512)), ("mlp", "mlp", (64, 64)),
                                                     ("cnn", "cnn", (32, 64, 64, 512)),
                                                     ("minatar", "minatar", (16, 128))])
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
    for network in ("cnn", "minatar"):
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
    got = networks._patches(x, 3) @ kernel + bias
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_minatar_hidden_layers_match_the_parameters():
    spec = networks.NetworkSpec("minatar", (5, 7), 3, IMAGE, q_head=True)
    params = networks.init_params(spec, jax.random.PRNGKey(0))["params"]
    layers = networks.hidden_layers(spec)
    assert [[name for name, _ in torso] for torso in layers] == [["conv_0", "dense_0"]]
    for (name, consumers), width in zip(layers[0], spec.widths):
        assert params[name]["kernel"].shape[-1] == width
        for c in consumers:
            assert c in params


@pytest.mark.parametrize("network", ["mlp", "minatar"])
def test_a_short_run_per_family(tmp_path, network):
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
