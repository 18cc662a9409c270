"""XLA configuration per network family and backend: the fastest known compiler options.

On XLA:CPU, convolutions routed to YNNPACK are several times slower in fp32 than XLA's own
convolutions (docs/DESIGN.md, "A fair baseline"). :func:`jit` applies the faster
setting to conv networks on CPU; the policy-speed benchmark still tries every configuration.
"""
from __future__ import annotations

import functools

import jax

# An empty list of YNN fusion types: no YNNPACK fusions (the flag's documented overwrite mode).
NO_YNN = {"xla_cpu_experimental_ynn_fusion_type": ""}
CPU_CONFIGS = {"default": None, "no_ynn": NO_YNN}


def options_for(family: str):
    """Compiler options for a network ``family`` (``"mlp"``/``"cnn"``) on the default backend, or None."""
    return NO_YNN if family == "cnn" and jax.default_backend() == "cpu" else None


def jit(fn, family: str, **kwargs):
    """``jax.jit(fn, **kwargs)`` with :func:`options_for` ``(family)`` as compiler options.

    JAX accepts compiler options only on a top-level jit: called inside another traced function (the
    guarded update, the Anakin loop's program), the result runs as a plain nested jit, and the outer
    program's options apply.
    """
    options = options_for(family)
    if options is None:
        return jax.jit(fn, **kwargs)
    top, nested = jax.jit(fn, compiler_options=options, **kwargs), jax.jit(fn, **kwargs)

    @functools.wraps(fn)
    def call(*args, **kw):
        inside = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kw)))
        return (nested if inside else top)(*args, **kw)

    return call


def candidate_configs(family: str) -> dict:
    """Configurations a fair benchmark tries: both on CPU for conv networks, the default otherwise."""
    if family == "cnn" and jax.default_backend() == "cpu":
        return CPU_CONFIGS
    return {"default": None}
