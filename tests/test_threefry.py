"""JAX's PRNG hash lowered as straight-line code on XLA:CPU (accerl_jax.platform.threefry): the same bits
as JAX's own lowering, and no loop left in the compiled program."""
from __future__ import annotations

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry2x32_p

from accerl_jax.platform import threefry, xla  # noqa: F401  (importing xla installs the lowering)

# Random123's known answers for Threefry-2x32 with 20 rounds: (key, counter) -> output words.
KNOWN = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]

# The draws compared: run here (this lowering) and in a fresh interpreter that never imports accerl_jax
# (JAX's own CPU lowering, a rolled loop); each leaves them in ``out``.
DRAWS = """
import jax, jax.numpy as jnp
key = jax.random.PRNGKey(1234)
out = {"bits": jax.random.bits(key, (257,)).tolist(),
       "split": jax.random.key_data(jax.random.split(jax.random.key(7), 5)).tolist(),
       "uniform": jax.random.uniform(key, (3, 33)).tolist(),
       "categorical": jax.random.categorical(key, jnp.arange(6.0), shape=(64,)).tolist()}
"""


def test_installed_on_import():
    assert threefry.install() is True  # already installed by importing accerl_jax.platform.xla: idempotent


@pytest.mark.parametrize("key, count, expected", KNOWN)
def test_known_answers(key, count, expected):
    words = [jnp.asarray(np.uint32(w)) for w in (*key, *count)]
    assert tuple(int(w) for w in threefry.threefry2x32(*words)) == expected  # the function itself
    assert tuple(int(w) for w in jax.jit(threefry2x32_p.bind)(*words)) == expected  # the lowered primitive


def test_same_bits_as_jax_own_lowering():
    """Bits, key splits, uniforms and categorical samples equal those of a fresh interpreter that lowers
    the hash with JAX's rolled loop (it never imports accerl_jax)."""
    script = DRAWS + "import json; print(json.dumps(out))\n"
    fresh = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    here: dict = {}
    exec(DRAWS, here)
    assert json.loads(fresh.stdout.strip().splitlines()[-1]) == here["out"]


def test_no_loop_in_compiled_split():
    """A compiled key split on CPU holds no while loop (JAX's own CPU lowering: a 5-trip loop)."""
    hlo = jax.jit(lambda k: jax.random.split(k, 16)).lower(jax.random.PRNGKey(0)).compile().as_text()
    assert " while(" not in hlo, hlo[:2000]
