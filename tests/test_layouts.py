"""Every loop on every device layout: the sequential and Sebulba steppers on 2 and 4 forced CPU devices
(the Anakin stepper's layouts are in tests/test_devices.py).

* Sequential (gymnax, the default compressor): on N devices the same rollouts (every env its own key)
  and, to float tolerance, the same learner as on one device for the same global batch.
* Sebulba (envpool's asynchronous pool, whose step order is not deterministic): trains to the end of a
  tiny budget with its rollouts sharded along the learner's batch axis over the N devices.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from two_devices import run_device_main

TINY = dict(total_steps=8 * 8 * 4, num_envs=8, rollout_length=8, log_every=2, checkpoint_every=0, progress=False)
KEYS = ("loop", "devices", "learner_devices", "updates", "total_env_steps", "final_return_mean", "stopped")


def _train(logdir: str, **overrides) -> tuple[dict, list]:
    import jax

    from accerl_jax.config import Config
    from accerl_jax.loop import train

    trained: dict = {}
    summary = train(Config(logdir=logdir, **dict(TINY, **overrides)), trained=trained)
    params = [np.asarray(x).tolist() for x in jax.tree.leaves(jax.device_get(trained["learner_params"]))]
    return {k: summary[k] for k in KEYS}, params


def _layouts_main(folder: str) -> None:
    """In a subprocess with N devices: the sequential main job, and a Sebulba run with its rollout layout."""
    import jax

    from accerl_jax.loops import sebulba

    sequential, params = _train(os.path.join(folder, "sequential"), loop="sequential")
    specs: list = []
    real = sebulba.SebulbaStepper._take

    def take(self):  # records where each rollout the learner takes lives
        item = real(self)
        specs.extend({tuple(x.sharding.spec) for x in jax.tree.leaves(item[0])})
        return item

    sebulba.SebulbaStepper._take = take
    seb, _ = _train(os.path.join(folder, "sebulba"), env="envpool:CartPole-v1", loop="sebulba")
    print("RESULT " + json.dumps({"sequential": sequential, "params": params, "sebulba": seb,
                                  "sebulba_specs": [list(s) for s in sorted(set(specs), key=str)]}))


@pytest.fixture(scope="module")
def sequential_one_device(tmp_path_factory):
    return _train(str(tmp_path_factory.mktemp("one") / "run"), loop="sequential")


@pytest.mark.parametrize("n", [2, 4])
def test_sequential_and_sebulba_on_n_devices(tmp_path, sequential_one_device, n):
    one, want = sequential_one_device
    got = run_device_main("test_layouts", n, "_layouts_main", (str(tmp_path),))
    s = got["sequential"]
    assert s["loop"] == "sequential" and s["devices"] == s["learner_devices"] == n and s["updates"] == 4
    assert s["final_return_mean"] == one["final_return_mean"]  # the same episodes
    for a, b in zip(want, got["params"], strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    b = got["sebulba"]
    assert b["loop"] == "sebulba" and b["devices"] == n and b["stopped"] is None
    assert b["updates"] == 4 and b["total_env_steps"] == 4 * 8 * 8
    # Every rollout leaf is split along its batch (second, after time) axis over the devices.
    assert got["sebulba_specs"] == [[None, "batch"]], got["sebulba_specs"]
