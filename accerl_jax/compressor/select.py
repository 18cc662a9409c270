"""Which parameters a weight compressor acts on: hidden-layer kernels, not biases or heads.

The policy and value heads stay in float by default (docs/DESIGN.md, "Conventions").
"""
from __future__ import annotations

HEADS = ("policy_head", "value_head", "q_head")


def _key_name(k) -> str:
    return str(getattr(k, "key", getattr(k, "name", k)))


def is_compressible(path, leaf) -> bool:
    """True for a ``kernel`` leaf outside the heads (``path`` from ``tree_map_with_path``)."""
    names = [_key_name(k) for k in path]
    return bool(names) and names[-1] == "kernel" and not any(h in names for h in HEADS) and leaf.ndim >= 2
