"""Every loop on every device layout: the sequential and Sebulba steppers on 2 and 4 forced CPU devices
(the Anakin stepper's layouts are in tests/test_devices.py).

* Sequential (gymnax, the default compressor): on N devices the same rollouts (every env its own key)
  and, to float tolerance, the same learner as on one device for the same global batch.
* Sebulba (envpool's asynchronous pool, whose step order is not deterministic): trains to the end of a
  tiny budget with its rollouts sharded along the learner's batch axis over the N devices.
* Sebulba with ``--actor-device cpu-apart`` (the stand-in for CPU actors beside an accelerator learner),
  on 4 devices: the actor's parameters (the compressor's publications) and its sampled actions live on
  ``cpu:0`` only; the learner's state, the rollouts it takes and the compressor's own output and state on
  the other 3 devices.
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
    from accerl_jax import run_training_result

    result = run_training_result(Config(logdir=logdir, **dict(TINY, **overrides)))
    summary = result.summary
    params = [np.asarray(x).tolist() for x in jax.tree.leaves(jax.device_get(result.learner_params))]
    return {k: summary[k] for k in KEYS}, params


def _layouts_main(folder: str, apart: bool = False) -> None:
    """In a subprocess with N devices: the sequential main job, a Sebulba run with its rollout layout and,
    if ``apart``, the ``--actor-device cpu-apart`` run of :func:`_apart_main`."""
    import jax

    from accerl_jax.loops import sebulba

    sequential, params = _train(os.path.join(folder, "sequential"), loop="sequential")
    specs: list = []
    real = sebulba.take

    def take(*args):  # records where each rollout the learner takes lives
        item = real(*args)
        specs.extend({tuple(x.sharding.spec) for x in jax.tree.leaves(item[0])})
        return item

    sebulba.take = take
    seb, _ = _train(os.path.join(folder, "sebulba"), env="envpool:CartPole-v1", loop="sebulba")
    apart = _apart_main(os.path.join(folder, "apart")) if apart else None
    print("RESULT " + json.dumps({"sequential": sequential, "params": params, "sebulba": seb,
                                  "sebulba_specs": [list(s) for s in sorted(set(specs), key=str)], "apart": apart}))


def _apart_main(logdir: str) -> dict:
    """A tiny Sebulba run with ``--actor-device cpu-apart`` (int8: a compressor whose output is a new
    tree each refresh); returns its summary's layout and the devices each kind of array was seen on."""
    import jax

    from accerl_jax.actor import HostActor
    from accerl_jax.config import Config
    from accerl_jax import run_training_result
    from accerl_jax.loops import sebulba

    seen: dict[str, set] = {}

    def record(kind: str, tree) -> None:
        seen.setdefault(kind, set()).update(str(d) for x in jax.tree.leaves(tree) for d in x.devices())

    def spy(cls, name: str, kind: str, what):
        real = getattr(cls, name)

        def wrapped(self, *args):
            out = real(self, *args)
            record(kind, what(self, args, out))
            return out

        setattr(cls, name, wrapped)

    spy(sebulba.SebulbaStepper, "_to_actor", "actor_params", lambda self, args, out: out)
    real_take = sebulba.take

    def take(*args):  # the rollouts the learner takes
        item = real_take(*args)
        record("rollout", item[0])
        return item

    sebulba.take = take
    spy(sebulba.SebulbaStepper, "_snapshot", "learner_and_compressor",
        lambda self, args, out: (out.learner, out.actor_params, out.compressor))
    spy(HostActor, "act", "actions", lambda self, args, out: out)
    envs = 2 * (jax.local_device_count() - 1)  # two per learner device
    sizes = dict(TINY, num_envs=envs, total_steps=4 * envs * TINY["rollout_length"])
    result = run_training_result(Config(logdir=logdir, **sizes, env="envpool:CartPole-v1", loop="sebulba",
                                 actor_device="cpu-apart", compressor="int8"))
    summary = result.summary
    record("final_learner", result.learner_params)
    return {"summary": {k: summary[k] for k in ("devices", "learner_devices", "actor_device", "updates", "stopped")},
            "seen": {k: sorted(v) for k, v in seen.items()}}


@pytest.fixture(scope="module")
def sequential_one_device(tmp_path_factory):
    return _train(str(tmp_path_factory.mktemp("one") / "run"), loop="sequential")


@pytest.mark.parametrize("n", [2, 4])
def test_sequential_and_sebulba_on_n_devices(tmp_path, sequential_one_device, n):
    one, want = sequential_one_device
    got = run_device_main("test_layouts", n, "_layouts_main", (str(tmp_path), n == 4))
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
    if n != 4:
        return
    # cpu-apart on 4 devices (one run, the 3-device learner mesh): the actor's arrays on cpu:0, the rest not.
    apart, learner = got["apart"], [f"cpu:{i}" for i in range(1, n)]
    assert apart["summary"] == {"devices": n - 1, "learner_devices": n - 1, "actor_device": "cpu:0", "updates": 4,
                                "stopped": None}
    assert apart["seen"] == {"actor_params": ["cpu:0"], "actions": ["cpu:0"], "rollout": learner,
                             "learner_and_compressor": learner, "final_learner": learner}, apart["seen"]
