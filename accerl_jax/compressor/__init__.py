"""Compressor: learner parameters -> the compressed policy the Actor runs.

:func:`make_compressor` parses the ``--compressor`` string: ``none``, ``mask:<sparsity>``,
``fakequant:<bits>``, ``distill:<student>`` (``tiny``, ``small``, ``half``), or a ``+`` chain such
as ``distill:small+fakequant:8`` (distillation, if present, must come first: it replaces the network).
"""
from __future__ import annotations

from accerl_jax import networks
from accerl_jax.compressor.base import Compressor, chain, identity
from accerl_jax.compressor.distill import DistillState, distill, distillation_loss
from accerl_jax.compressor.fakequant import FakeQuantState, fake_quantize, fakequant
from accerl_jax.compressor.mask import MaskState, magnitude_mask, mask
from accerl_jax.types import ApplyFn

KINDS = ("none", "mask:<sparsity>", "fakequant:<bits>", "distill:<student>")
_EXPECTED = (
    "expected 'none', 'mask:<sparsity in [0,1)>', 'fakequant:<bits 2-8>', "
    f"'distill:<{'|'.join(networks.STUDENT_PRESETS)}>', or a '+' chain like 'distill:small+fakequant:8'"
)


def _parse_number(kind: str, arg: str, cast):
    try:
        return cast(arg)
    except ValueError:
        what = "an integer" if cast is int else "a number"
        raise ValueError(f"bad --compressor part {kind}:{arg}: {arg!r} is not {what}; {_EXPECTED}") from None


def _stage(spec: str, factory, *args, **kwargs) -> Compressor:
    """Call a compressor factory, prefixing its ValueError with the ``--compressor`` string."""
    try:
        return factory(*args, **kwargs)
    except ValueError as err:
        raise ValueError(f"bad --compressor {spec!r}: {err}") from None


def make_compressor(
    spec: str,
    network: networks.NetworkSpec,
    teacher_apply: ApplyFn,
    *,
    distill_steps: int = 4,
    distill_learning_rate: float = 1e-3,
) -> Compressor:
    """Build the compressor named by ``spec`` for a learner network ``network``.

    Args:
      spec: the ``--compressor`` string.
      network: the learner's network spec (students are built from it).
      teacher_apply: the learner network's apply function.
      distill_steps, distill_learning_rate: passed to :func:`distill`.

    Returns:
      A :class:`Compressor`; a single stage is still wrapped in :func:`chain` so that its state is keyed
      by name (``state["distill"]``).

    Raises:
      ValueError: naming the bad part of ``spec`` and listing what is accepted.
    """
    parts = [p.strip() for p in spec.split("+")]
    if parts == ["none"]:
        return chain(("none", identity()))
    if not all(parts):
        raise ValueError(f"bad --compressor {spec!r}: empty stage; {_EXPECTED}")
    kinds = [p.partition(":")[0] for p in parts]
    repeated = sorted({k for k in kinds if kinds.count(k) > 1})
    if repeated:
        raise ValueError(f"bad --compressor {spec!r}: {', '.join(repeated)} appears more than once; each stage may appear once")
    stages = []
    for i, part in enumerate(parts):
        kind, sep, arg = part.partition(":")
        if kind == "none" or not sep or not arg:
            raise ValueError(f"bad --compressor {spec!r} at {part!r}; {_EXPECTED}")
        if kind == "mask":
            stages.append((kind, _stage(spec, mask, _parse_number(kind, arg, float))))
        elif kind == "fakequant":
            stages.append((kind, _stage(spec, fakequant, _parse_number(kind, arg, int))))
        elif kind == "distill":
            if i != 0:
                raise ValueError(
                    f"bad --compressor {spec!r}: distill must be the first stage (it replaces the network "
                    "that later stages compress)"
                )
            if arg not in networks.STUDENT_PRESETS:
                raise ValueError(f"bad --compressor {spec!r}: unknown student {arg!r}; {_EXPECTED}")
            student = networks.student_spec(network, arg)
            stages.append(
                (kind, _stage(spec, distill, teacher_apply, student, steps=distill_steps, learning_rate=distill_learning_rate))
            )
        else:
            raise ValueError(f"bad --compressor {spec!r}: unknown kind {kind!r}; {_EXPECTED}")
    try:
        return chain(*stages)
    except ValueError as err:
        raise ValueError(f"bad --compressor {spec!r}: {err}") from None


__all__ = [
    "Compressor", "chain", "identity", "make_compressor", "KINDS",
    "mask", "MaskState", "magnitude_mask",
    "fakequant", "FakeQuantState", "fake_quantize",
    "distill", "DistillState", "distillation_loss",
]
