"""Actor-critic networks (flax linen) and the student presets that distillation shrinks them to.

* ``mlp``: MLP torsos (default 64, 64; ReLU, or tanh with ``activation="tanh"``) for the policy (logits) and the value,
  for vector observations (gymnax classic control, envpool ``CartPole-v1``).
  On image observations (``--network mlp``) the observation is flattened first (uint8 scaled by 1/255).
* ``cnn``: the Nature-DQN torso (Mnih et al. 2015: conv 32x8x8/4, 64x4x4/2, 64x3x3/1, dense 512)
  for stacked Atari frames ``[4, 84, 84]`` uint8 (envpool) or MinAtar grids ``[10, 10, C]``.
* ``minatar``: the MinAtar paper's network (Young & Tian 2019): one 16-channel 3x3 conv, dense 128.
* ``impala``: IMPALA's 15-layer ResNet torso (Espeholt et al. 2018): 3 stacks of channels 16, 32, 32, dense 256.

``--network auto`` (:func:`default_spec` with ``network="auto"``; :data:`NETWORKS` names the choices) picks ``mlp`` for vector observations and
``cnn`` for images.

A :class:`NetworkSpec` names a network by family and widths, so that compressors can build smaller
students (:func:`student_spec`) without special network classes.

Two optional extensions, both off by default so discrete networks are unchanged:

* ``q_head=True`` adds a Q head ``[..., A]`` (Retrace actor-critic). ``apply(params, obs)`` still returns
  ``(logits, value)``; :func:`make_apply_with_q` returns ``(logits, value, q)`` from the same params.
* ``action_dim=D > 0`` builds :class:`MLPGaussianActorCritic`, a diagonal Gaussian policy for continuous
  actions; its policy output ``apply(params, obs)[0]`` is ``[..., 2D]``: the mean then the log-std
  (read it with :func:`policy_distribution`).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from accerl_jax.config import ACTIVATIONS, NETWORKS  # --activation's and --network's choices (config sits below)
from accerl_jax.platform import xla
from accerl_jax.types import ApplyFn

# The distillation student presets (``distill:<preset>``): a width multiplier (the learner's own family, every
# width scaled), or None for ``mlp``: an MLP of MLP_STUDENT_WIDTHS on the flattened image, a student of another
# family for an image network (:func:`student_spec`).
STUDENT_PRESETS = {"half": 0.5, "small": 0.25, "tiny": 0.125, "mlp": None}
# ``distill:mlp``'s hidden widths (separate policy and value torsos, as every MLP here).
MLP_STUDENT_WIDTHS = (128, 128)
# Smallest image side the CNN accepts: three unpadded 3x3 stride-1 convolutions leave 1 pixel of 7.
MIN_CNN_SIDE = 7
# Smallest image side the MinAtar network accepts: its one unpadded 3x3 convolution leaves 1 pixel of 3.
MIN_MINATAR_SIDE = 3
# The network families :func:`build` makes (``--network``), and each one's default widths for images
# (``mlp``'s are also those of vector observations).
FAMILIES = ("mlp", "cnn", "minatar", "impala")
DEFAULT_WIDTHS = {"mlp": (64, 64), "cnn": (32, 64, 64, 512), "minatar": (16, 128), "impala": (16, 32, 32, 256)}
# What ``widths`` mean per family, in words (error messages and --help).
WIDTHS_MEANING = {
    "mlp": "one or more hidden sizes",
    "cnn": "4 numbers, three conv channel counts then the dense size",
    "minatar": "2 numbers, the conv channel count then the dense size",
    "impala": "2 or more numbers, each residual stack's channel count then the dense size",
}


@dataclasses.dataclass(frozen=True)
class NetworkSpec:
    """What network to build.

    Attributes:
      family: one of :data:`FAMILIES`: ``"mlp"``, ``"cnn"``, ``"minatar"`` or ``"impala"``.
      widths: MLP hidden sizes; for ``cnn`` the three conv channel counts then the dense size; for
        ``minatar`` the conv channel count then the dense size; for ``impala`` each residual stack's
        channel count then the dense size (:data:`WIDTHS_MEANING`).
      num_actions: number of discrete actions ``A``.
      obs_shape: shape of one observation (without batch dims).
      channels_first: image observations only; True for envpool's ``[C, H, W]`` frames.
      action_dim: ``D`` > 0 for a continuous action vector (diagonal Gaussian policy, ``mlp`` only);
        0 for discrete actions.
      q_head: add a Q head ``[..., A]`` (discrete only), for the Retrace actor-critic.
      activation: the ``mlp`` family's hidden nonlinearity, one of :data:`ACTIVATIONS` (``"relu"``,
        ``"tanh"``); the conv families use ReLU.
    """

    family: str
    widths: tuple[int, ...]
    num_actions: int
    obs_shape: tuple[int, ...]
    channels_first: bool = False
    action_dim: int = 0
    q_head: bool = False
    activation: str = "relu"


def _scaled(obs):
    """``obs`` as float32: uint8 pixels scaled by 1/255, other dtypes cast."""
    scale = 1.0 / 255.0 if obs.dtype == jnp.uint8 else 1.0
    return obs.astype(jnp.float32) * scale


def _images(obs, channels_first: bool):
    """Image observations ``[..., *obs_shape]`` -> ``(float32 NHWC [N, H, W, C], batch_shape)``."""
    x = _scaled(obs)
    batch_shape = x.shape[:-3]
    x = x.reshape((-1,) + x.shape[-3:])
    if channels_first:
        x = jnp.transpose(x, (0, 2, 3, 1))
    return x, batch_shape


ACTIVATION_FNS = {"relu": nn.relu, "tanh": nn.tanh}  # the flax function of each ACTIVATIONS name


def check_activation(family: str, activation: str) -> None:
    """Check that a ``family`` network takes the hidden nonlinearity ``activation`` (the ``mlp`` family any of
    :data:`ACTIVATIONS`, the conv families ReLU only).

    Raises:
      ValueError: ``activation`` not in :data:`ACTIVATIONS`, or other than ``"relu"`` on a conv family.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; expected one of {', '.join(ACTIVATIONS)}")
    if activation != "relu" and family != "mlp":
        raise ValueError(f"activation {activation!r} applies to the 'mlp' family only; the {family!r} network uses ReLU")


def _mlp_torsos(obs, widths: Sequence[int], obs_rank: int = 1, activation: str = "relu"):
    """The separate policy and value torsos (``dense_i`` / ``value_dense_i``) of the MLP networks, each
    hidden layer followed by ``activation`` (``"relu"`` or ``"tanh"``).

    ``obs_rank`` > 1 (image observations): the last ``obs_rank`` axes are flattened into one, uint8
    scaled by 1/255. Called inside a module's ``nn.compact`` method, so the layers belong to that module.
    """
    if obs_rank > 1:
        x = _scaled(obs)
        x = x.reshape(x.shape[: x.ndim - obs_rank] + (-1,))
    else:
        x = obs.astype(jnp.float32)
    init = nn.initializers.orthogonal(np.sqrt(2))
    act = ACTIVATION_FNS[activation]
    pi, v = x, x
    for i, w in enumerate(widths):
        pi = act(nn.Dense(w, kernel_init=init, name=f"dense_{i}")(pi))
        v = act(nn.Dense(w, kernel_init=init, name=f"value_dense_{i}")(v))
    return pi, v


class MLPActorCritic(nn.Module):
    """MLP policy and value. ``obs [..., D]`` (or ``[..., *obs_shape]`` with ``obs_rank`` > 1, flattened)
    -> ``(logits [..., A], value [...])``.

    The policy and the value have separate torsos of the same widths (as cleanrl's and purejaxrl's
    classic-control agents): the value regression, whose targets reach ~100 on CartPole, then does not
    swamp the policy's features. An actor that only needs logits runs the policy torso alone (XLA
    drops the unused value torso inside ``jit``).
    """

    widths: Sequence[int]
    num_actions: int
    q_head: bool = False  # a Q head on the value torso (Retrace actor-critic)
    return_q: bool = False  # also return Q: (logits, value, q)
    obs_rank: int = 1  # axes of one observation; > 1: flattened (image observations)
    activation: str = "relu"  # the hidden layers' nonlinearity: "relu" or "tanh"

    @nn.compact
    def __call__(self, obs):
        pi, v = _mlp_torsos(obs, self.widths, self.obs_rank, self.activation)
        logits = nn.Dense(self.num_actions, kernel_init=nn.initializers.orthogonal(0.01), name="policy_head")(pi)
        value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0), name="value_head")(v)
        return _with_q(self, logits, value[..., 0], v)


class _ConvActorCritic(nn.Module):
    """The fields every image network shares: its ``widths`` (the family's own meaning,
    :data:`WIDTHS_MEANING`), ``A = num_actions``, ``[..., C, H, W]`` input when ``channels_first``, and the
    optional Q head on the shared torso."""

    widths: Sequence[int]
    num_actions: int
    channels_first: bool = False
    q_head: bool = False  # a Q head on the shared torso (Retrace actor-critic)
    return_q: bool = False  # also return Q: (logits, value, q)


class CNNActorCritic(_ConvActorCritic):
    """Nature-DQN torso + heads. ``obs [..., *obs_shape]`` uint8/float -> ``(logits [..., A], value [...])``.

    uint8 pixels are scaled by 1/255.
    """

    @nn.compact
    def __call__(self, obs):
        x, batch_shape = _images(obs, self.channels_first)
        c1, c2, c3, d = self.widths
        small = min(x.shape[1], x.shape[2]) < 36  # MinAtar-sized grids: no large strides
        convs = ((c1, 3, 1), (c2, 3, 1), (c3, 3, 1)) if small else ((c1, 8, 4), (c2, 4, 2), (c3, 3, 1))
        init = nn.initializers.orthogonal(np.sqrt(2))
        for i, (ch, k, s) in enumerate(convs):
            x = nn.relu(nn.Conv(ch, (k, k), (s, s), padding="VALID", kernel_init=init, name=f"conv_{i}")(x))
        return _dense_and_heads(self, x, d, batch_shape)


def _dense_and_heads(module: nn.Module, x, dense: int, batch_shape):
    """Flatten the feature map ``x [N, ...]``, one ReLU dense layer (``dense_0``) of ``dense`` units, then the
    policy/value (and Q) heads reshaped to ``batch_shape``: the shared end of the conv networks."""
    init = nn.initializers.orthogonal(np.sqrt(2))
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(dense, kernel_init=init, name="dense_0")(x))
    logits = nn.Dense(module.num_actions, kernel_init=nn.initializers.orthogonal(0.01), name="policy_head")(x)
    value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0), name="value_head")(x)
    logits, value = logits.reshape(batch_shape + (module.num_actions,)), value.reshape(batch_shape)
    return _with_q(module, logits, value, x, batch_shape)


def _patches(x: jax.Array, k: int) -> jax.Array:
    """The ``k x k`` patches of NHWC images, unpadded, stride 1: ``[N, H, W, C]`` ->
    ``[N, H-k+1, W-k+1, k*k*C]`` (row-major over the window, channels last, as a ``[k, k, C, out]``
    conv kernel flattens)."""
    h, w = x.shape[1] - k + 1, x.shape[2] - k + 1
    return jnp.concatenate([x[:, i:i + h, j:j + w, :] for i in range(k) for j in range(k)], axis=-1)


class MinAtarActorCritic(_ConvActorCritic):
    """The MinAtar paper's network (Young & Tian 2019, arXiv 1903.03176, section 5 and its reference code
    examples/AC_lambda.py): one 16-channel 3x3 stride-1 conv + ReLU, flatten, a 128-unit dense + ReLU, then
    the policy and value heads. ``obs [..., H, W, C]`` (``[..., C, H, W]`` with ``channels_first``)
    uint8/float -> ``(logits [..., A], value [...])``; ``widths = (conv channels, dense units)``.

    The convolution is VALID (unpadded), as the reference code's ``nn.Conv2d(in_channels, 16,
    kernel_size=3, stride=1)`` (PyTorch's default padding 0; its linear layer reads 8 x 8 x 16 units of a
    10 x 10 grid); images need at least :data:`MIN_MINATAR_SIDE` pixels a side.

    It is computed as an im2col matmul (``_patches``, then a Dense layer ``conv_0`` with kernel
    ``[9C, channels]``) rather than ``flax.linen.Conv``; the function is the convolution's
    (tests/test_networks.py). Measured on XLA:CPU (2 cores shared with other jobs, jax 0.10.2; 32 Adam
    steps in one ``lax.scan`` on a batch of 1024 = 64 x 128 / 8 grids 10x10x4, widths 16, 128; compile /
    run seconds): im2col in a rolled loop (``unroll=1``) 1.9 / 0.51; ``nn.Conv`` rolled 1.3 / 4.3 (XLA:CPU's
    slow conv gradients in loops, docs/DESIGN.md "Known XLA:CPU pitfall"); ``nn.Conv`` unrolled (what conv
    families get, :func:`accerl_jax.platform.xla.gradient_loop_unroll`) 32 / 0.58; im2col unrolled 29 / 0.41.
    So this family is no conv family for :mod:`accerl_jax.platform.xla`: its gradient loops stay rolled, and
    it compiles as fast as an MLP and runs 8x faster than the rolled conv.
    """

    @nn.compact
    def __call__(self, obs):
        x, batch_shape = _images(obs, self.channels_first)
        channels, dense = self.widths
        init = nn.initializers.orthogonal(np.sqrt(2))
        x = nn.relu(nn.Dense(channels, kernel_init=init, name="conv_0")(_patches(x, 3)))
        return _dense_and_heads(self, x, dense, batch_shape)


# Residual blocks per stack of the IMPALA ResNet (Espeholt et al. 2018, figure 3).
IMPALA_BLOCKS = 2


class ImpalaActorCritic(_ConvActorCritic):
    """IMPALA's ResNet torso (Espeholt et al. 2018, arXiv 1802.01561, figure 3 "large" network, as cleanba's
    and CleanRL's ``ppo_atari_envpool_impala``) + heads. ``obs [..., H, W, C]`` (``[..., C, H, W]`` with
    ``channels_first``) uint8/float -> ``(logits [..., A], value [...])``.

    ``widths = (c_1, ..., c_k, dense)``: ``k`` stacks (3 in the paper: 16, 32, 32), each a 3x3 SAME conv
    ``stack_s_conv`` of ``c_s`` channels, a 3x3 stride-2 SAME max pool, then :data:`IMPALA_BLOCKS` residual
    blocks ``x + conv(relu(conv(relu(x))))`` (``stack_s_res_b_conv_0``, ``stack_s_res_b_conv_1``, ``c_s``
    channels each); then ReLU, flatten, a ``dense``-unit dense + ReLU (256 in the paper), the heads. Convs
    use flax's default initialiser (as cleanba), the dense layer and heads the orthogonal ones of the other
    networks. Any image side works (each stack halves it, rounding up).
    """

    @nn.compact
    def __call__(self, obs):
        x, batch_shape = _images(obs, self.channels_first)
        for s, channels in enumerate(self.widths[:-1]):
            x = nn.Conv(channels, (3, 3), padding="SAME", name=f"stack_{s}_conv")(x)
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
            for b in range(IMPALA_BLOCKS):
                y = nn.Conv(channels, (3, 3), padding="SAME", name=f"stack_{s}_res_{b}_conv_0")(nn.relu(x))
                x = x + nn.Conv(channels, (3, 3), padding="SAME", name=f"stack_{s}_res_{b}_conv_1")(nn.relu(y))
        return _dense_and_heads(self, nn.relu(x), self.widths[-1], batch_shape)


def _with_q(module: nn.Module, logits, value, torso, batch_shape=None):
    """``(logits, value)``, plus the Q head's output when ``module.return_q`` (created when ``q_head``)."""
    if not module.q_head:
        return logits, value
    q = nn.Dense(module.num_actions, kernel_init=nn.initializers.orthogonal(1.0), name="q_head")(torso)
    if batch_shape is not None:
        q = q.reshape(batch_shape + (module.num_actions,))
    return (logits, value, q) if module.return_q else (logits, value)


class MLPGaussianActorCritic(nn.Module):
    """Diagonal Gaussian policy and value for continuous actions. ``obs [..., D_obs]`` ->
    ``(policy_out [..., 2D], value [...])`` with ``policy_out = concat(mean, log_std)``.

    The log-std is *state-independent*: one learned parameter per action dimension (``log_std``,
    initialised to 0, i.e. std 1), broadcast over the batch, as cleanrl's and Sample Factory's continuous
    PPO agents. The mean is unbounded; the env adapters clip actions to the bounds (the stored action and
    its log-prob are the unclipped Gaussian sample). Torsos as :class:`MLPActorCritic`.
    """

    widths: Sequence[int]
    action_dim: int
    activation: str = "relu"  # the hidden layers' nonlinearity: "relu" or "tanh"

    @nn.compact
    def __call__(self, obs):
        pi, v = _mlp_torsos(obs, self.widths, activation=self.activation)
        mean = nn.Dense(self.action_dim, kernel_init=nn.initializers.orthogonal(0.01), name="policy_head")(pi)
        log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
        value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0), name="value_head")(v)
        return jnp.concatenate([mean, jnp.broadcast_to(log_std, mean.shape)], axis=-1), value[..., 0]


def policy_distribution(policy_out: jax.Array, continuous: bool) -> distrax.Distribution:
    """The policy a network's first output stands for.

    Args:
      policy_out: ``[..., A]`` logits (discrete) or ``[..., 2D]`` mean then log-std (continuous).
      continuous: True for a diagonal Gaussian, False for a categorical.

    Returns:
      ``distrax.Categorical(logits)`` or ``distrax.MultivariateNormalDiag(mean, exp(log_std))``; the latter's
      ``log_prob`` and ``entropy`` are sums over the ``D`` action dimensions.
    """
    if not continuous:
        return distrax.Categorical(logits=policy_out)
    mean, log_std = jnp.split(policy_out, 2, axis=-1)
    return distrax.MultivariateNormalDiag(mean, jnp.exp(log_std))


def check_widths(family: str, widths: Sequence[int]) -> None:
    """Refuse ``widths`` that do not fit ``family`` (their count: :data:`WIDTHS_MEANING`; each >= 1).

    Raises:
      ValueError: naming the family and what its widths are.
    """
    n = len(widths)
    ok = {"mlp": n >= 1, "cnn": n == 4, "minatar": n == 2, "impala": n >= 2}.get(family)
    if ok is None:
        raise ValueError(f"unknown network family {family!r}; expected one of {', '.join(FAMILIES)}")
    if not ok or min(widths, default=0) < 1:
        raise ValueError(f"widths {' '.join(map(str, widths))} do not fit the {family} network: expected "
                         f"{WIDTHS_MEANING[family]} (positive integers), e.g. "
                         f"{' '.join(map(str, DEFAULT_WIDTHS[family]))}")


def default_spec(
    obs_shape: tuple[int, ...], num_actions: int, channels_first: bool = False, *, action_dim: int = 0,
    q_head: bool = False, network: str = "auto",
) -> NetworkSpec:
    """The learner network for an observation shape, with its family's default widths
    (:data:`DEFAULT_WIDTHS`).

    ``network`` (``--network``): ``"auto"`` is MLP(64, 64) for vectors (separate policy and value trunks,
    as PureJaxRL's and CleanRL's PPO) and the Nature CNN for images; ``"mlp"`` on images flattens them;
    ``"cnn"``, ``"minatar"`` and ``"impala"`` take images only. ``action_dim`` > 0 asks for a Gaussian
    policy over ``action_dim`` continuous actions (vector observations only); ``q_head`` for a Q head
    (discrete only).

    Raises:
      ValueError: ``network`` not in :data:`NETWORKS`; an observation rank other than 1 or 3; a conv
        family on vector observations; images smaller than the family's convolutions need
        (:data:`MIN_CNN_SIDE`, :data:`MIN_MINATAR_SIDE`; IMPALA's padded ones take any size); continuous
        actions with image observations; a Q head with continuous actions.
    """
    if network not in NETWORKS:
        raise ValueError(f"unknown network {network!r}; expected one of {', '.join(NETWORKS)}")
    if action_dim and q_head:
        raise ValueError("a Q head needs discrete actions; continuous actions have no finite Q table")
    if len(obs_shape) not in (1, 3):
        raise ValueError(f"no network for observation shape {obs_shape}; expected rank 1 or 3")
    family = network if network != "auto" else "mlp" if len(obs_shape) == 1 else "cnn"
    if len(obs_shape) == 1:
        if family != "mlp":
            raise ValueError(f"network {network!r} takes image observations; these are vectors {obs_shape}: "
                             "use mlp (or auto)")
        return NetworkSpec("mlp", DEFAULT_WIDTHS["mlp"], num_actions, tuple(obs_shape), action_dim=action_dim,
                           q_head=q_head)
    if action_dim:
        raise ValueError(f"continuous actions with image observations {obs_shape} are not supported; "
                         "Gaussian policies use the MLP (vector observations)")
    height, width = obs_shape[1:] if channels_first else obs_shape[:2]
    need = {"cnn": (MIN_CNN_SIDE, "CNN's three 3x3 convolutions"),
            "minatar": (MIN_MINATAR_SIDE, "MinAtar network's 3x3 convolution")}.get(family)
    if need and min(height, width) < need[0]:
        raise ValueError(f"image observations {obs_shape} are {height}x{width}; the {need[1]} need at least "
                         f"{need[0]}x{need[0]} pixels")
    return NetworkSpec(family, DEFAULT_WIDTHS[family], num_actions, tuple(obs_shape), channels_first,
                       q_head=q_head)


def student_spec(spec: NetworkSpec, preset: str) -> NetworkSpec:
    """The distillation student of ``spec``: every width scaled by ``STUDENT_PRESETS[preset]`` (at least 4),
    same family (a ResNet's student is a narrower ResNet of as many stacks); for ``"mlp"``, an MLP of
    :data:`MLP_STUDENT_WIDTHS` on the flattened image of an image network. On XLA:CPU a small conv student
    runs far below the matmul rate at a search's batch (its 3x3 patches and their narrow matmul), where an MLP
    of as many parameters runs its two matmuls at twice the speed (docs/RESULTS.md, "Cheaper students").

    Raises:
      ValueError: if ``preset`` is not a key of :data:`STUDENT_PRESETS`, or is ``"mlp"`` for an MLP ``spec``
        (vector observations: its students are its own family's presets).
    """
    if preset not in STUDENT_PRESETS:
        raise ValueError(f"unknown student preset {preset!r}; expected one of {', '.join(STUDENT_PRESETS)}")
    m = STUDENT_PRESETS[preset]
    if m is None:
        if spec.family == "mlp":
            raise ValueError(f"student {preset!r} is an MLP for an image network, and this network is an MLP "
                             f"already; use one of {', '.join(k for k, v in STUDENT_PRESETS.items() if v)}")
        return dataclasses.replace(spec, family="mlp", widths=MLP_STUDENT_WIDTHS)
    return dataclasses.replace(spec, widths=tuple(max(4, int(round(w * m))) for w in spec.widths))


def with_widths(spec: NetworkSpec, widths: Sequence[int]) -> NetworkSpec:
    """``spec`` with other hidden ``widths`` (same family, actions and observations), e.g. a pruned network.

    Raises:
      ValueError: if the number of widths differs from ``spec``'s or a width is < 1.
    """
    widths = tuple(int(w) for w in widths)
    if len(widths) != len(spec.widths) or min(widths) < 1:
        raise ValueError(f"widths {widths} do not fit a {spec.family} network with widths {spec.widths}; "
                         f"expected {len(spec.widths)} positive integers")
    return dataclasses.replace(spec, widths=widths)


class HiddenLayer(NamedTuple):
    """One set of hidden units of a network (:func:`hidden_layers`): ``spec.widths[width]`` units written by
    every module of ``producers`` (their kernels' and biases' last axis; several where a residual stream
    adds their outputs, so they share one unit set) and read by every module of ``consumers`` (their
    kernels' input axis: a conv's ``C_in``, a dense layer's input rows)."""

    width: int
    producers: tuple[str, ...]
    consumers: tuple[str, ...]


def hidden_layers(spec: NetworkSpec) -> list[HiddenLayer]:
    """Every hidden unit set of ``build(spec)``: :class:`HiddenLayer` s naming the modules (top-level param
    names) that write and read them, in order.

    Structured pruning (``accerl_jax.compressor.prune``) keeps ``spec.widths[width]`` units of each: the same
    units of every producer's output and every consumer's input. MLP: one set per layer of each torso. CNN
    and MinAtar: one per conv and the dense layer. IMPALA: per stack, the residual stream (written by the
    stack's conv and every block's second conv) and each block's inner conv, then the dense layer.

    Raises:
      ValueError: for an unknown family.
    """
    n = len(spec.widths)
    q = ("q_head",) if spec.q_head else ()  # the Q head reads the value torso (mlp) or the shared one (others)
    heads = ("policy_head", "value_head") + q
    if spec.family == "mlp":
        return ([HiddenLayer(i, (f"dense_{i}",), (f"dense_{i + 1}",) if i + 1 < n else ("policy_head",))
                 for i in range(n)]
                + [HiddenLayer(i, (f"value_dense_{i}",),
                               (f"value_dense_{i + 1}",) if i + 1 < n else ("value_head",) + q) for i in range(n)])
    if spec.family in ("cnn", "minatar"):
        return [HiddenLayer(i, (f"conv_{i}",), (f"conv_{i + 1}",) if i + 2 < n else ("dense_0",))
                for i in range(n - 1)] + [HiddenLayer(n - 1, ("dense_0",), heads)]
    if spec.family == "impala":
        layers = []
        for s in range(n - 1):
            blocks = [f"stack_{s}_res_{b}" for b in range(IMPALA_BLOCKS)]
            stream_readers = tuple(f"{b}_conv_0" for b in blocks) + (
                (f"stack_{s + 1}_conv",) if s + 2 < n else ("dense_0",))
            layers.append(HiddenLayer(s, (f"stack_{s}_conv",) + tuple(f"{b}_conv_1" for b in blocks),
                                      stream_readers))
            layers += [HiddenLayer(s, (f"{b}_conv_0",), (f"{b}_conv_1",)) for b in blocks]
        return layers + [HiddenLayer(n - 1, ("dense_0",), heads)]
    raise ValueError(f"unknown network family {spec.family!r}; expected one of {', '.join(FAMILIES)}")


def build(spec: NetworkSpec, return_q: bool = False) -> nn.Module:
    """The flax module for ``spec`` (``return_q``: also return the Q head's output, see :func:`make_apply_with_q`).

    Raises:
      ValueError: for an unknown family, continuous actions with another family than ``mlp``, or an
        ``activation`` other than ReLU on a conv family (or not in :data:`ACTIVATIONS`).
    """
    check_activation(spec.family, spec.activation)
    if spec.action_dim:
        if spec.family != "mlp":
            raise ValueError(f"continuous actions need the 'mlp' family, not {spec.family!r}")
        return MLPGaussianActorCritic(spec.widths, spec.action_dim, spec.activation)
    if spec.family == "mlp":
        return MLPActorCritic(spec.widths, spec.num_actions, spec.q_head, return_q, len(spec.obs_shape),
                              spec.activation)
    conv = {"cnn": CNNActorCritic, "minatar": MinAtarActorCritic, "impala": ImpalaActorCritic}.get(spec.family)
    if conv is None:
        raise ValueError(f"unknown network family {spec.family!r}; expected one of {', '.join(FAMILIES)}")
    return conv(spec.widths, spec.num_actions, spec.channels_first, spec.q_head, return_q)


def init_params(spec: NetworkSpec, key: jax.Array):
    """Initial parameters of ``build(spec)`` for one observation of ``spec.obs_shape``."""
    dummy = jnp.zeros((1,) + spec.obs_shape, jnp.float32)
    # Jitted: op-by-op initialisation compiles every primitive separately, which is slow on XLA:CPU; it
    # runs once, so it compiles with the one-shot options (accerl_jax.platform.xla.one_shot_options).
    return xla.one_shot_jit(build(spec).init, spec.family)(key, dummy)


def make_apply(spec: NetworkSpec) -> ApplyFn:
    """``apply(params, obs) -> (logits, value)`` for ``build(spec)`` (``policy_out [..., 2D]`` for Gaussians)."""
    return build(spec).apply


def make_apply_with_q(spec: NetworkSpec):
    """``apply(params, obs) -> (logits, value, q [..., A])`` for a ``spec`` with ``q_head``; same params as
    :func:`make_apply`.

    Raises:
      ValueError: if ``spec.q_head`` is False.
    """
    if not spec.q_head:
        raise ValueError("make_apply_with_q needs a NetworkSpec with q_head=True")
    return build(spec, return_q=True).apply


def param_count(params) -> int:
    """Number of scalars in a parameter pytree."""
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def param_bytes(params) -> int:
    """Bytes of a parameter pytree as stored (dtype-aware)."""
    return int(sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(params)))
