"""Compressor: learner parameters -> the compressed policy the Actor runs.

:func:`make_compressor` parses the ``--compressor`` string, a ``+`` chain of stages:

* ``none``: the learner's policy itself (jitted like every actor, the fair baseline);
* ``distill:<student>`` (``tiny``, ``small``, ``half``: the learner's network at a fraction of its widths;
  ``mlp``: an MLP on the flattened image, for an image network): knowledge distillation into a smaller student;
* ``prune:<fraction>``: structured pruning (a physically smaller network); ``prune:<f>+distill``
  fine-tunes the pruned network by distillation from the learner (one stage, keyed ``distill``);
* ``mask:<sparsity>[,global][,ramp=<updates>]``: unstructured magnitude pruning;
* ``fakequant:<bits>`` (2-8), ``int8[:all]`` (real int8 via qwix; ``all`` also quantizes the heads),
  ``bf16``: quantizers.

A chain must go: one network-changing stage (``distill:<student>`` or ``prune:<f>[+distill]``), then
``mask``, then one quantizer -- each part optional, each at most once. E.g. ``distill:small+int8``,
``prune:0.5+int8``, ``mask:0.9+fakequant:8``, ``distill:small+bf16``. Anything else (a quantizer
before pruning or distillation, two quantizers such as ``bf16+int8``) is rejected with a message
naming the chain and the rule.

:func:`register_compressor` adds a kind of one's own (e.g. from a notebook), which ``--compressor``
then accepts like a built-in one (notebooks/custom_compressor.ipynb).
"""
from __future__ import annotations

import functools

from accerl_jax import networks
from accerl_jax.compressor.base import Compressor, chain, identity
from accerl_jax.compressor.bf16 import Bf16State, bf16
from accerl_jax.compressor.distill import DistillState, children_loss, distill, distillation_loss
from accerl_jax.compressor.fakequant import FakeQuantState, fake_quantize, fakequant
from accerl_jax.compressor.int8 import Int8State, int8
from accerl_jax.compressor.mask import MaskState, gradual_sparsity, magnitude_mask, mask, mask_updates
from accerl_jax.compressor.prune import PruneState, prune, prune_params, pruned_widths
from accerl_jax.types import ApplyFn

KINDS = ("none", "distill:<student>", "prune:<fraction>", "prune:<fraction>+distill",
         "mask:<sparsity>[,global][,ramp=<n>]", "fakequant:<bits>", "int8[:all]", "bf16")
_EXPECTED = (
    "expected 'none', 'distill:<" + "|".join(networks.STUDENT_PRESETS) + ">', 'prune:<fraction in [0,1)>', "
    "'mask:<sparsity in [0,1)>[,global][,ramp=<updates>]', 'fakequant:<bits 2-8>', 'int8', 'int8:all', 'bf16', "
    "or a '+' chain like 'distill:small+int8'"
)
_ORDER_RULE = (
    "a chain goes: one network-changing stage (distill:<student> or prune:<f>, optionally followed by a "
    "bare 'distill' fine-tune), then mask, then at most one quantizer (fakequant, int8 or bf16) last"
)
# Rank of each kind in a chain: ranks must strictly increase along the chain.
_RANK = {"distill": 0, "prune": 0, "finetune": 1, "mask": 2, "fakequant": 3, "int8": 3, "bf16": 3}
QUANTIZERS = ("fakequant", "int8", "bf16")
# Kinds added by register_compressor: kind -> (factory(network, teacher_apply, arg) -> Compressor, rank).
_REGISTERED: dict = {}


def uses_registered(spec: str) -> bool:
    """Whether the ``--compressor`` string ``spec`` has a stage registered with :func:`register_compressor`
    (the built-in stages fit every network family the trainer builds; a registered one may not)."""
    return any(part.partition(":")[0] in _REGISTERED for part in spec.split("+"))


def register_compressor(kind: str, factory, *, rank: int = _RANK["fakequant"]) -> None:
    """Make ``--compressor <kind>[:<arg>]`` build ``factory(network, teacher_apply, arg)``.

    Args:
      kind: the new stage's name (letters, digits, ``_``, ``-``; not a built-in kind); its state is keyed by it.
      factory: ``(network: NetworkSpec, teacher_apply: ApplyFn, arg: str) -> Compressor``; ``network`` is the
        spec of the network whose params the stage receives (the student's after ``distill:<student>``),
        ``arg`` the text after ``:`` ('' if none). A ValueError it raises becomes a ``--compressor`` error.
      rank: its place in a chain (ranks strictly increase along a chain): 0 network-changing, 2 mask,
        3 (default) last, like a quantizer.

    Raises:
      ValueError: for a built-in or malformed ``kind``.
    """
    if kind in _RANK or kind == "none" or not kind.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"cannot register compressor kind {kind!r}: it must be a new name of letters, digits, "
                         f"'_' or '-', not one of {', '.join(['none', *_RANK])}")
    _REGISTERED[kind] = (factory, rank)


def unregister_compressor(kind: str) -> None:
    """Remove a kind added by :func:`register_compressor` (no error if absent)."""
    _REGISTERED.pop(kind, None)


def _rank(role: str) -> int:
    return _RANK[role] if role in _RANK else _REGISTERED[role][1]


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
    distill_async: bool = False,
    distill_children: int = 0,
    distill_sibling_coef: float = 10.0,
    distill_minibatches: int = 1,
) -> Compressor:
    """Build the compressor named by ``spec`` for a learner network ``network``.

    Args:
      spec: the ``--compressor`` string (see the module docstring).
      network: the learner's network spec (students and pruned networks are built from it).
      teacher_apply: the learner network's apply function.
      distill_steps, distill_learning_rate, distill_async, distill_children, distill_sibling_coef,
        distill_minibatches: passed to :func:`distill` as ``steps``, ``learning_rate``, ``asynchronous``,
        ``children``, ``sibling_coef`` and ``minibatches``.

    Returns:
      A :class:`Compressor`; a single stage is still wrapped in :func:`chain` so that its state is keyed
      by name (``state["distill"]``).

    Raises:
      ValueError: naming ``spec``, the bad part and what is accepted, or the chain rule broken.
    """
    if any(c.isspace() for c in spec):
        raise ValueError(f"bad --compressor {spec!r}: contains spaces; write the spec without them, e.g. "
                         "'distill:small+int8'")
    parts = spec.split("+")
    if parts == ["none"]:
        return chain(("none", identity()))
    if not all(parts):
        raise ValueError(f"bad --compressor {spec!r}: empty stage; {_EXPECTED}")
    kinds = [p.partition(":")[0] for p in parts]
    # A bare 'distill' right after 'prune:<f>' is the pruned network's distillation fine-tune.
    roles = ["finetune" if (k == "distill" and p == "distill" and i > 0 and kinds[i - 1] == "prune") else k
             for i, (k, p) in enumerate(zip(kinds, parts))]
    repeated = sorted({k for k in kinds if kinds.count(k) > 1})
    if repeated:
        raise ValueError(f"bad --compressor {spec!r}: {', '.join(repeated)} appears more than once; each stage may appear once")
    quantizers = [k for k in kinds if k in QUANTIZERS]
    if len(quantizers) > 1:
        raise ValueError(f"bad --compressor {spec!r}: two quantizers ({' and '.join(quantizers)}); {_ORDER_RULE}")
    for i, (kind, part) in enumerate(zip(kinds, parts)):
        if kind == "none":
            raise ValueError(f"bad --compressor {spec!r}: 'none' stands alone (no compression) and cannot be "
                             f"chained; drop it, e.g. {'+'.join(p for p in parts if p != 'none') or 'none'!r}")
        if kind not in _RANK and kind not in _REGISTERED:
            raise ValueError(f"bad --compressor {spec!r}: unknown kind {kind!r} in {part!r}; {_EXPECTED} (a compressor "
                             "added with register_compressor is known only in the Python process that registered "
                             "it: evaluate, export or resume its runs from Python after registering it again)")
        if i and _rank(roles[i]) <= _rank(roles[i - 1]):
            raise ValueError(f"bad --compressor {spec!r}: {part!r} cannot follow {parts[i - 1]!r}; {_ORDER_RULE}")

    if distill_async and "distill" not in kinds:
        raise ValueError(f"bad --distill-async with --compressor {spec!r}: it runs distillation in a background "
                         "thread, and this chain has no distill stage; drop the flag or use e.g. 'distill:small'")
    if distill_children and "distill" not in kinds:
        raise ValueError(f"bad --distill-children {distill_children} with --compressor {spec!r}: it distils the "
                         "student on search roots' children, and this chain has no distill stage; drop the flag "
                         "or use e.g. 'distill:small'")
    if distill_minibatches != 1 and "distill" not in kinds:
        raise ValueError(f"bad --distill-minibatches {distill_minibatches} with --compressor {spec!r}: it splits "
                         "the distillation's rows, and this chain has no distill stage; drop the flag or use e.g. "
                         "'distill:small'")
    distilling = dict(steps=distill_steps, learning_rate=distill_learning_rate, asynchronous=distill_async,
                      children=distill_children, sibling_coef=distill_sibling_coef, minibatches=distill_minibatches)
    stages = []
    current = network  # the network whose params the next stage receives
    stage = functools.partial(_stage, spec)
    for i, (kind, role, part) in enumerate(zip(kinds, roles, parts)):
        _, sep, arg = part.partition(":")
        if role == "finetune":
            continue  # built together with its prune stage below
        if kind in _REGISTERED:
            stages.append((kind, stage(_REGISTERED[kind][0], current, teacher_apply, arg)))
            continue
        if kind not in ("int8", "bf16", "distill") and (not sep or not arg):
            raise ValueError(f"bad --compressor {spec!r} at {part!r}: missing value; {_EXPECTED}")
        if kind == "mask":
            stages.append((kind, stage(_make_mask, arg)))
        elif kind == "fakequant":
            stages.append((kind, stage(fakequant, _parse_number(kind, arg, int))))
        elif kind == "int8":
            if sep and arg != "all":
                raise ValueError(f"bad --compressor {spec!r} at {part!r}: int8 takes no value or 'all'; {_EXPECTED}")
            stages.append((kind, stage(int8, current, quantize_heads=arg == "all")))
        elif kind == "bf16":
            if sep:
                raise ValueError(f"bad --compressor {spec!r} at {part!r}: bf16 takes no value; {_EXPECTED}")
            stages.append((kind, stage(bf16)))
        elif kind == "prune":
            fraction = _parse_number(kind, arg, float)
            pruner = stage(prune, current, fraction)
            pruned = networks.with_widths(current, pruned_widths(current, fraction))
            if i + 1 < len(roles) and roles[i + 1] == "finetune":
                init_student = lambda p, f=fraction, n=current: prune_params(p, n, f)[0]  # noqa: E731
                stages.append(("distill", stage(distill, teacher_apply, pruned, init_student=init_student,
                                                **distilling)))
            else:
                stages.append((kind, pruner))
            current = pruned
        elif kind == "distill":
            if arg not in networks.STUDENT_PRESETS:
                raise ValueError(f"bad --compressor {spec!r}: unknown student {arg!r} in {part!r} (a bare "
                                 f"'distill' only follows prune:<f>); {_EXPECTED}")
            try:
                current = networks.student_spec(network, arg)
            except ValueError as err:
                raise ValueError(f"bad --compressor {spec!r}: {err}") from None
            stages.append((kind, stage(distill, teacher_apply, current, **distilling)))
    try:
        return chain(*stages)
    except ValueError as err:
        raise ValueError(f"bad --compressor {spec!r}: {err}") from None


def _make_mask(arg: str) -> Compressor:
    """``mask:<sparsity>[,global][,ramp=<n>]``."""
    first, *options = arg.split(",")
    sparsity = _parse_number("mask", first, float)
    scope, ramp = "layer", 0
    names = [o.partition("=")[0] for o in options]
    if len(set(names)) != len(names):
        raise ValueError(f"mask options {','.join(options)!r} repeat an option; give each of 'global' and "
                         "'ramp=<updates>' at most once")
    for opt in options:
        if opt == "global":
            scope = "global"
        elif opt.startswith("ramp="):
            value = opt[len("ramp="):]
            try:
                ramp = int(value)
            except ValueError:
                raise ValueError(f"mask option {opt!r}: {value!r} is not an integer; expected 'ramp=<updates>', "
                                 "e.g. mask:0.9,ramp=100") from None
        else:
            raise ValueError(f"unknown mask option {opt!r}; expected 'global' or 'ramp=<updates>'")
    return mask(sparsity, scope, ramp)


__all__ = [
    "Compressor", "chain", "identity", "make_compressor", "register_compressor", "unregister_compressor", "uses_registered",
    "KINDS",
    "QUANTIZERS",
    "mask", "MaskState", "magnitude_mask", "gradual_sparsity", "mask_updates",
    "prune", "PruneState", "prune_params", "pruned_widths",
    "fakequant", "FakeQuantState", "fake_quantize",
    "int8", "Int8State",
    "bf16", "Bf16State",
    "distill", "DistillState", "distillation_loss", "children_loss",
]
