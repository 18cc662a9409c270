"""``int8``: post-training quantization with real int8 arithmetic, through qwix.

Every hidden layer (dense and conv; not the policy/value heads, which stay float by default, and
``int8:all`` quantizes them too) runs with

* weights stored as int8 with one float32 scale per output channel (``absmax / 127.5``, qwix's
  symmetric bound), quantized by :func:`qwix.quantize_params`;
* activations (the layer inputs) quantized to int8 with a **static** per-tensor scale, calibrated on
  recent actor observations: the scale is ``max |x|`` of the layer input over the calibration batch
  (run through the float network), so calibration data is never clipped (static-range PTQ, Jacob et
  al. 2018, https://arxiv.org/abs/1712.05877). Inputs larger than the calibrated range at run time are
  clipped to it; scales are re-calibrated at every ``compress`` that is given observations;
* int8 x int8 products accumulated in int32 (qwix emits ``dot_general`` / ``conv_general_dilated`` with
  int32 results), then rescaled to float32, bias added in float32.

qwix (https://github.com/google/qwix) intercepts the flax module's ops (:class:`qwix.PtqProvider`),
selected by rules on the module path (first match wins). Static calibration needs observations, so
``init`` must be given ``obs`` (``Compressor.init(params, key, obs)``).
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from accerl_jax import networks
from accerl_jax.platform import lazy
from accerl_jax.compressor.base import Compressor
from accerl_jax.compressor.select import HEADS

qwix = lazy.lazy_module("qwix")  # loaded when an int8 compressor is built, not with every run

_SCALE_SUFFIX = "_lhs_scale"  # qwix's name of a static activation scale: <op name><n>_lhs_scale


class Int8State(NamedTuple):
    act_absmax: Any  # {module name: [] float32 calibrated max |input|}, from the last calibration
    calibrations: jax.Array  # [] int32, how many times the activation ranges were calibrated


def int8_rules(quantize_heads: bool = False) -> list:
    """qwix rules: int8 weights and activations everywhere, heads in float unless ``quantize_heads``."""
    quant = qwix.QuantizationRule(module_path=".*", weight_qtype=jnp.int8, act_qtype=jnp.int8, act_static_scale=True)
    if quantize_heads:
        return [quant]
    return [qwix.QuantizationRule(module_path=".*(" + "|".join(HEADS) + ").*"), quant]


def layer_input_absmax(model: nn.Module, params, obs: jax.Array) -> dict:
    """``{module name: max |input|}`` of every ``nn.Dense``/``nn.Conv`` of ``model`` on ``obs`` (float run)."""
    found = {}

    def record(next_fun, args, kwargs, context):
        if isinstance(context.module, (nn.Dense, nn.Conv)) and context.method_name == "__call__":
            x = args[0].astype(jnp.float32)
            found[context.module.name] = jnp.max(jnp.abs(x))
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        model.apply(params, obs)
    return found


def int8(spec: networks.NetworkSpec, quantize_heads: bool = False) -> Compressor:
    """int8 post-training-quantization compressor of a network ``spec`` (the stage's input network).

    Args:
      spec: the network whose parameters this stage receives (learner, pruned or student network).
      quantize_heads: also quantize the policy and value heads (default: heads stay float32).

    Raises (from ``init``):
      ValueError: if ``init`` is given no observations to calibrate on.
    """
    model = networks.build(spec)

    @functools.cache
    def quantized():
        """The qwix model and its abstract parameters' static-scale entries, built at first use (importing
        qwix and tracing the model takes host time that a run which only checks the spec, e.g. an
        ``auto`` candidate its gate never runs, should not pay)."""
        qmodel = qwix.quantize_model(model, qwix.PtqProvider(int8_rules(quantize_heads)))
        dummy = jax.ShapeDtypeStruct((1,) + tuple(spec.obs_shape), jnp.float32)
        abstract = jax.eval_shape(qmodel.init, jax.random.PRNGKey(0), dummy)["params"]
        flat = flax.traverse_util.flatten_dict(abstract)
        return qmodel, abstract, {path: flat[path] for path in flat if path[-1].endswith(_SCALE_SUFFIX)}

    def _quantize(params, absmax):
        _, abstract, scale_ops = quantized()
        stats = {}
        for path, abs_scale in scale_ops.items():
            module = path[-2]
            stats[path[:-1] + (path[-1][: -len("_scale")],)] = {
                "count": 1,  # a Python int: qwix checks it in Python (count == 0), so it must not be traced
                "sum_of_absmax": jnp.broadcast_to(absmax[module], abs_scale.array.shape).astype(jnp.float32),
            }
        stats = flax.traverse_util.unflatten_dict(stats)
        return {"params": qwix.quantize_params(params["params"], abstract, stats)}

    @jax.jit
    def _calibrate_and_quantize(params, obs, calibrations):
        absmax = layer_input_absmax(model, params, obs)
        return _quantize(params, absmax), Int8State(absmax, calibrations + 1)

    _requantize = jax.jit(lambda params, state: (_quantize(params, state.act_absmax), state))

    def init(params, key, obs=None):
        if obs is None:
            raise ValueError("int8 calibrates activation ranges on observations: call init(params, key, obs)")
        return _calibrate_and_quantize(params, obs, jnp.zeros((), jnp.int32))

    def compress(params, state, obs):
        if obs is None:
            return _requantize(params, state)
        return _calibrate_and_quantize(params, obs, state.calibrations)

    def actor_apply(apply):
        return lambda params, obs, *args, **kwargs: quantized()[0].apply(params, obs, *args, **kwargs)

    return Compressor(init, compress, actor_apply=actor_apply)
