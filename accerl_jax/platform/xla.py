"""XLA configuration per network family and backend: the fastest known compiler options.

On XLA:CPU, convolutions routed to YNNPACK are several times slower in fp32 than XLA's own
convolutions (docs/DESIGN.md, "A fair baseline"). :func:`jit` applies the faster
setting to conv networks on CPU; the policy-speed benchmark still tries every configuration.
Importing this module also lowers JAX's PRNG hash as straight-line code on XLA:CPU
(:mod:`accerl_jax.platform.threefry`).
"""
from __future__ import annotations

import functools
import os

import jax

from accerl_jax.platform import threefry

threefry.install()  # JAX's PRNG hash as straight-line code on XLA:CPU: the same bits, ~80 fewer thunks per call

# An empty list of YNN fusion types: no YNNPACK fusions (the flag's documented overwrite mode).
NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}
CPU_CONFIGS = {"default": None, "no_ynn": NO_YNN}
# Network families (accerl_jax.networks.FAMILIES) whose programs run XLA convolutions: on XLA:CPU they
# get NO_YNN and unrolled gradient loops. The MinAtar network computes its one conv as a matmul (im2col),
# so it is not among them: it compiles and runs as an MLP does (accerl_jax.networks.MinAtarActorCritic).
CONV_FAMILIES = frozenset({"cnn", "impala"})


def is_conv(family: str | None) -> bool:
    """Whether a network ``family``'s programs run XLA convolutions (:data:`CONV_FAMILIES`)."""
    return family in CONV_FAMILIES


# Programs that run once per run (initial parameters and states): on XLA:CPU compiled at LLVM optimisation
# level 1 instead of the default 2, which compiles them about a third faster (their run time does not
# matter; the training programs keep the default). The default job's initial state has the same bits at
# both levels.
ONE_SHOT_CPU = {"xla_backend_optimization_level": 1}


def one_shot_options(family: str | None = None, platform: str | None = None):
    """Compiler options for a program that runs once: :data:`ONE_SHOT_CPU` on XLA:CPU, with
    :func:`options_for` ``(family)``'s (None: a program without a network's forward pass);
    :func:`options_for`'s alone on other platforms, or where
    ``XLA_FLAGS`` sets an optimisation level (the caller's level then applies to every program alike)."""
    platform = platform or jax.default_backend()
    base = options_for(family, platform)
    if platform != "cpu" or "xla_backend_optimization_level" in os.environ.get("XLA_FLAGS", ""):
        return base
    return {**(base or {}), **ONE_SHOT_CPU}


def options_for(family: str | None, platform: str | None = None):
    """Compiler options for a network ``family`` (``"mlp"``, ``"cnn"``, ...) on ``platform`` (default: JAX's
    default backend), or None: :data:`NO_YNN` for a conv family (:func:`is_conv`) on XLA:CPU."""
    return NO_YNN if is_conv(family) and (platform or jax.default_backend()) == "cpu" else None


def gradient_loop_unroll(family: str | None, length: int, platform: str | None = None) -> int:
    """The ``unroll`` for a ``lax.scan`` of ``length`` gradient steps of a ``family`` network on ``platform``
    (default: JAX's default backend): ``length`` (straight-line code) for a conv net (:func:`is_conv`) on
    XLA:CPU, else 1.

    XLA:CPU runs a conv net's gradient steps much slower inside a loop than in straight-line code
    (docs/DESIGN.md, "Known XLA:CPU pitfall", has the measurement for APPO's passes over a rollout);
    unrolled, the update takes longer to compile.
    """
    return length if is_conv(family) and (platform or jax.default_backend()) == "cpu" else 1


def _platform(leaves) -> str:
    """The platform a jitted call on ``leaves`` runs on: that of its first committed array, else the
    default backend (uncommitted arrays follow the computation)."""
    for x in leaves:
        if isinstance(x, jax.Array) and x.committed:
            return next(iter(x.devices())).platform
    return jax.default_backend()


def jit(fn, family: str, **kwargs):
    """``jax.jit(fn, **kwargs)`` with :func:`options_for` ``(family, platform)`` as compiler options, the
    platform being where the call runs (a CPU actor beside a GPU learner gets the CPU's options).

    JAX accepts compiler options only on a top-level jit: called inside another traced function (the
    guarded update, the Anakin loop's program), the result runs as a plain nested jit, and the outer
    program's options apply.
    """
    if not is_conv(family):  # options_for gives other families none on any platform
        return jax.jit(fn, **kwargs)
    plain, cpu = jax.jit(fn, **kwargs), jax.jit(fn, compiler_options=NO_YNN, **kwargs)

    @functools.wraps(fn)
    def call(*args, **kw):
        leaves = jax.tree.leaves((args, kw))
        if _traced(leaves):
            return plain(*args, **kw)
        return (cpu if _platform(leaves) == "cpu" else plain)(*args, **kw)

    return call


def _traced(leaves) -> bool:
    """Whether a call with these argument leaves is made inside another traced function (where JAX refuses
    compiler options)."""
    return any(isinstance(x, jax.core.Tracer) for x in leaves)


def one_shot_jit(fn, family: str | None = None, **kwargs):
    """``jax.jit(fn, **kwargs)`` for a program that runs once (initial parameters and states), compiled
    with :func:`one_shot_options` ``(family)`` when called at the top level; called inside another traced
    function it runs as a plain nested jit (as :func:`jit`)."""
    options = one_shot_options(family)
    if not options:
        return jax.jit(fn, **kwargs)
    plain, once = jax.jit(fn, **kwargs), jax.jit(fn, compiler_options=options, **kwargs)

    @functools.wraps(fn)
    def call(*args, **kw):
        return (plain if _traced(jax.tree.leaves((args, kw))) else once)(*args, **kw)

    return call


def candidate_configs(family: str) -> dict:
    """Configurations a fair benchmark tries: both on CPU for conv networks, the default otherwise."""
    if is_conv(family) and jax.default_backend() == "cpu":
        return CPU_CONFIGS
    return {"default": None}
