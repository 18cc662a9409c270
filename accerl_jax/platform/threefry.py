"""JAX's PRNG hash on XLA:CPU as straight-line code: the same bits, a fraction of the thunks.

Every ``jax.random`` call (a key split, a uniform or Gumbel sample) runs the Threefry-2x32 hash (Salmon
et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011; 20 rounds, Random123's rotation
constants). JAX lowers it on CPU as an XLA while loop of 5 trips (``use_rolled_loops=True`` in
``jax._src.random.threefry2x32``, to keep compile times short) and as straight-line code everywhere
else. XLA:CPU runs each trip as ~16 separate thunks, 13 of them copies, so each random call costs ~80
kernel launches whatever its size. At the default job's shapes (16 one-env groups, each with its own
key: :class:`accerl_jax.actor.ShardedActor`) the Anakin program's rollout makes six such calls per env
step: they were 88% of the program's thunks (9,623 per update; 1,111 with the hash unrolled, counted in
the compiled HLO) and the program ran at ~0.8x of the hand-written scan that makes three. Straight-line,
the hash fuses into one elementwise kernel.

:func:`install` registers :func:`threefry2x32` as the CPU lowering of
``jax.extend.random.threefry2x32_p``; :mod:`accerl_jax.platform.xla` calls it on import, so every program
the package builds (and any other JAX program in the process) lowers the hash this way. The arithmetic
is the same integer arithmetic, so every random bit, rollout and parameter digest is unchanged
(tests/test_threefry.py checks Random123's known answers and JAX's own lowering in a fresh interpreter).
"""
from __future__ import annotations

import numpy as np
from jax import lax

ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))  # Threefry-2x32's rotation constants, alternating per group
PARITY = np.uint32(0x1BD11BDA)  # the key schedule's third word is k1 ^ k2 ^ PARITY
_installed = False


def _rotate_left(x, r: int):
    return lax.shift_left(x, np.uint32(r)) | lax.shift_right_logical(x, np.uint32(32 - r))


def threefry2x32(k1, k2, x1, x2):
    """The Threefry-2x32 hash of counters ``(x1, x2)`` under key ``(k1, k2)``: 5 groups of 4 rounds, a
    key injection after each group. All four are uint32 arrays of one shape (traceable; any shape);
    returns the two uint32 output words, as JAX's ``threefry2x32_p`` (Salmon et al. 2011; Random123's
    known answers in tests/test_threefry.py). Raises nothing of its own."""
    ks = (k1, k2, k1 ^ k2 ^ PARITY)
    x1, x2 = x1 + ks[0], x2 + ks[1]
    for group in range(5):
        for r in ROTATIONS[group % 2]:
            x1 = x1 + x2
            x2 = _rotate_left(x2, r) ^ x1
        x1 = x1 + ks[(group + 1) % 3]
        x2 = x2 + ks[(group + 2) % 3] + np.uint32(group + 1)
    return x1, x2


def install() -> bool:
    """Lower ``threefry2x32_p`` on CPU with :func:`threefry2x32` (idempotent). Returns whether the lowering
    is in place: False where this JAX lacks ``jax.extend.random.threefry2x32_p`` or
    ``jax.interpreters.mlir.register_lowering`` (JAX's own lowering then stays; nothing else changes)."""
    global _installed
    if _installed:
        return True
    try:
        from jax.extend.random import threefry2x32_p
        from jax.interpreters import mlir
    except ImportError:
        return False
    mlir.register_lowering(threefry2x32_p, mlir.lower_fun(threefry2x32, multiple_results=True), platform="cpu")
    _installed = True
    return True
