"""Devices and hosts: the learner and the main job over N devices and over several processes.

* With 2 and 4 forced CPU devices (one subprocess each), one update of every loss/corrector on a mesh of
  N devices equals the single-device update on the same batch (V-trace, Retrace, APPO with several
  epochs, and with several minibatches of the global batch, continuous actions; the single-device references are computed once, in this process).
* Two processes on 127.0.0.1 (JAX's multi-controller runtime, gloo collectives), one CPU device each,
  each feeding its half of a batch to :func:`accerl_jax.run.shards.make_global_update`: both end with
  bitwise-equal parameters, equal to the single-device updates on the whole batch.
* The main job (``run_training()`` with the default compressor and loop, a tiny budget) on 2 and 4 devices
  equals the one-device run with the same global batch (every env keyed by its global index,
  :mod:`accerl_jax.run.shards`), with the envs sharded along the batch axis and one compiled chunk; and the
  real CLI on two processes with 2 devices and ``--num-envs 4`` each (the Anakin loop on global arrays)
  trains it to the end with bitwise-equal learners, only process 0 writing files, equal to one process
  with the same global batch; interrupted by SIGINT and resumed, it ends with the same learner bit for bit.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest

from two_devices import ROOT, device_env, run_device_main

# The main job (default compressor, corrector and loop) at a tiny budget: 6 updates of 8 envs x 8 steps.
# The main job's settings (APPO, MLP(64, 64), the Anakin loop) with a tiny budget, and a distillation student
# acting: the default compressor, none, is the identity, so distill:small also covers the compressor's
# steps on the global batch's observations over several devices and processes.
MAIN = dict(num_envs=8, rollout_length=8, total_steps=8 * 8 * 6, log_every=2, checkpoint_every=0, progress=False,
            compressor="distill:small")
MAIN_SEED = 0  # Config's default --seed
SUMMARY_KEYS = ("loop", "compressor", "devices", "learner_devices", "updates", "learner_batch", "total_env_steps",
                "final_return_mean", "num_processes")
CASES = ("vtrace", "retrace", "appo", "appo_minibatches", "gaussian")
RTOL, ATOL = 1e-5, 1e-5  # after 2 updates (6 SGD steps for APPO) sums in another order differ by ~2e-6
STEPS = 2  # updates per case: the second starts from the state the first returned


def _random_params(spec, seed: int):
    """Random parameters for ``spec``, built in numpy (eager JAX initialisers cost seconds of compiling)."""
    import jax
    import jax.numpy as jnp

    from accerl_jax import networks

    shapes = jax.eval_shape(lambda k: networks.init_params(spec, k), jax.ShapeDtypeStruct((2,), jnp.uint32))
    rng = np.random.default_rng(seed)
    scale = lambda s: 1.0 / np.sqrt(s.shape[0]) if len(s.shape) == 2 else 0.1  # noqa: E731
    return jax.tree.map(lambda s: jnp.asarray(rng.normal(scale=scale(s), size=s.shape), s.dtype), shapes)


def _cases(names=CASES):
    """``{name: (apply, params, LossConfig, batch [8, 8])}``: every loss, corrector and action kind."""
    import jax.numpy as jnp

    import test_learner as tl
    from accerl_jax import learner, networks

    batch = tl._batch(b=8)
    rng = np.random.default_rng(1)
    g_batch = batch._replace(action=jnp.asarray(rng.normal(size=batch.action.shape + (2,)), jnp.float32))
    d_spec = networks.default_spec((tl.OBS_DIM,), tl.NUM_ACTIONS)
    q_spec = networks.default_spec((tl.OBS_DIM,), tl.NUM_ACTIONS, q_head=True)
    g_spec = networks.default_spec((tl.OBS_DIM,), 0, action_dim=2)
    build = {
        "vtrace": lambda: (networks.make_apply(d_spec), _random_params(d_spec, 0), learner.LossConfig(), batch),
        "retrace": lambda: (networks.make_apply_with_q(q_spec), _random_params(q_spec, 1),
                            learner.LossConfig(corrector="retrace"), batch),
        "appo": lambda: (networks.make_apply(d_spec), _random_params(d_spec, 2),
                         learner.LossConfig(loss="appo", corrector="is", clip_rho_threshold=2.0, epochs=3), batch),
        # Minibatches of the global batch: B=8 on 4 devices x 2 minibatches leaves each device 1 column.
        "appo_minibatches": lambda: (networks.make_apply(d_spec), _random_params(d_spec, 2),
                                     learner.LossConfig(loss="appo", corrector="is", clip_rho_threshold=2.0,
                                                        epochs=2, minibatches=2), batch),
        "gaussian": lambda: (networks.make_apply(g_spec), _random_params(g_spec, 3),
                             learner.LossConfig(corrector="none"), g_batch),
    }
    return {name: build[name]() for name in names}


def _updates(n: int, names=CASES, steps: int = STEPS) -> dict:
    """``steps`` plain-SGD updates of each case on the first ``n`` devices: params, step and metrics."""
    import jax
    import optax

    import test_learner as tl
    from accerl_jax import learner

    out = {}
    opt = optax.sgd(0.1)  # plain SGD: the param step is the gradient itself
    for name, (apply, params, cfg, batch) in _cases(names).items():
        mesh = learner.make_mesh(jax.devices()[:n])
        update = learner.make_update(apply, opt, cfg, mesh)
        state = learner.init_state(params, opt, mesh, key=learner.learner_key(0))
        for _ in range(steps):
            state, metrics = update(state, batch)
        out[name] = {"params": tl._tolist(state.params), "step": int(state.step), "initial": tl._tolist(params),
                     "metrics": {m: float(v) for m, v in metrics.items()}}
    return out


def _device_main(n: int) -> None:
    """In a subprocess with ``n`` devices: every case on ``n`` devices, and an indivisible APPO split."""
    import jax
    import optax

    import test_learner as tl
    from accerl_jax import learner

    out = {"device_count": jax.device_count(), "updates": _updates(n)}
    mesh, opt = learner.make_mesh(jax.devices()[:n]), optax.sgd(0.1)
    try:  # B=8 on n devices x 3 minibatches does not divide
        cfg = learner.LossConfig(loss="appo", minibatches=3)
        learner.make_update(tl.APPLY, opt, cfg, mesh)(None, tl._batch(b=8))  # refused before it runs
        out["mb_error"] = None
    except ValueError as e:
        out["mb_error"] = str(e)
    print("RESULT " + json.dumps(out))


def _multihost_main(pid: int, port: int) -> None:
    """One of two processes (one CPU device each): two global updates, each process feeding its half of B."""
    import jax

    from accerl_jax.run import distributed
    from accerl_jax.config import Config

    distributed.join(Config(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid))
    import optax

    import test_learner as tl
    from accerl_jax import learner
    from accerl_jax.run import shards

    apply, params, cfg, batch = _cases(("vtrace",))["vtrace"]
    mesh, opt = learner.make_mesh(jax.devices()), optax.sgd(0.1)
    update = shards.make_global_update(learner.make_update(apply, opt, cfg, mesh), mesh)
    state = learner.init_state(params, opt, learner.make_mesh(jax.local_devices()), key=learner.learner_key(0))
    half = jax.tree.map(lambda x: x[:, 4 * pid: 4 * (pid + 1)], batch)
    for _ in range(STEPS):
        state, metrics = update(state, half)
    print("RESULT " + json.dumps({"process_count": jax.process_count(), "devices": jax.device_count(),
                                  "digest": shards.params_digest(state.params), "params": tl._tolist(state.params),
                                  "metrics": {m: float(v) for m, v in metrics.items()}}))


@pytest.fixture(scope="module")
def reference():
    return _updates(1)


@pytest.fixture(scope="module", params=[2, 4])
def devices(request):
    return request.param, run_device_main("test_devices", request.param, "_device_main", (request.param,))


@pytest.mark.parametrize("name", CASES)
def test_update_on_n_devices_equals_one_device(devices, reference, name):
    n, out = devices
    assert out["device_count"] == n
    one, many = reference[name], out["updates"][name]
    for a, b in zip(one["params"], many["params"], strict=True):
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL, err_msg=name)
    # The update moved the parameters: the comparison is not between two copies of the initial ones.
    assert max(np.max(np.abs(np.subtract(a, b))) for a, b in zip(one["params"], one["initial"])) > 1e-4
    assert set(one["metrics"]) == set(many["metrics"])
    for k, v in one["metrics"].items():
        np.testing.assert_allclose(many["metrics"][k], v, rtol=RTOL, atol=ATOL, err_msg=f"{name} {k}")
    assert many["step"] == one["step"] == STEPS * {"appo": 3, "appo_minibatches": 4}.get(name, 1)


def test_appo_minibatches_must_divide_the_shard(devices):
    n, out = devices
    msg = out["mb_error"]
    assert msg is not None and "minibatches" in msg and str(3 * n) in msg, msg


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(cmds: list[list[str]], envs: list[dict], folder, timeout: float = 300, expect: int = 0) -> list[str]:
    """Run the processes of one multi-host run together; return their stdouts (all must exit ``expect``;
    with ``expect`` other than 0, their stderrs are returned).

    Output goes to files in ``folder``, not pipes: a process blocked on a full pipe would hold the other
    one in JAX's shutdown barrier.
    """
    files = [(open(os.path.join(folder, f"p{i}.out"), "w+"), open(os.path.join(folder, f"p{i}.err"), "w+"))
             for i in range(len(cmds))]
    procs = [subprocess.Popen(c, env=e, cwd=ROOT, stdout=o, stderr=r, text=True)
             for c, e, (o, r) in zip(cmds, envs, files)]
    outs = []
    try:
        for p, (o, r) in zip(procs, files):
            p.wait(timeout=timeout)
            o.seek(0), r.seek(0)
            err = r.read()
            assert p.returncode == expect, err[-3000:]
            outs.append(o.read() if expect == 0 else err)
    finally:
        for q in procs:  # one failed: the other would wait for it until JAX's timeout
            if q.poll() is None:
                q.kill()
        for o, r in files:
            o.close(), r.close()
    return outs


def _result(stdout: str) -> dict:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, stdout[-2000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_two_processes_build_the_global_batch_and_match_one_device(tmp_path, reference):
    port = _free_port()
    cmds = [[sys.executable, "-c", f"import test_devices as t; t._multihost_main({pid}, {port})"] for pid in range(2)]
    res = [_result(o) for o in _launch(cmds, [device_env(1), device_env(1)], tmp_path)]
    assert [r["process_count"] for r in res] == [2, 2] and [r["devices"] for r in res] == [2, 2]
    assert res[0]["digest"] == res[1]["digest"]  # bitwise-equal parameters on both processes
    one = reference["vtrace"]  # the whole batch on one device
    for a, b in zip(one["params"], res[0]["params"], strict=True):
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL)
    for k, v in one["metrics"].items():
        np.testing.assert_allclose(res[0]["metrics"][k], v, rtol=RTOL, atol=ATOL, err_msg=k)


def test_env_group_rollouts_depend_only_on_their_mesh_position():
    """A process stepping groups 1 and 3 gets, in its columns 0-1 and 2-3, exactly the rollouts of one
    plain actor reset with fold_in(key, 1) and fold_in(key, 3): the same as any other process (or a single
    process) stepping those groups. Two rollouts: the carry is threaded right."""
    import jax

    from accerl_jax import networks
    from accerl_jax.run import shards
    from accerl_jax.actor import AnakinActor
    from accerl_jax.envs import make_env

    env = make_env("gymnax:CartPole-v1", 2)
    spec = networks.default_spec(env.info.obs_shape, env.info.num_actions)
    apply, params = networks.make_apply(spec), _random_params(spec, 5)
    inner = AnakinActor(env, apply, 8)
    actor, key = shards.ShardedActor(inner, [1, 3]), jax.random.PRNGKey(7)
    carry = actor.reset(key)
    assert carry.obs.shape == (4,) + env.info.obs_shape
    got = []
    for _ in range(2):
        carry, rollout, _ = actor.rollout(params, carry)
        got.append(rollout)
    for j, group in enumerate([1, 3]):
        c = inner.reset(jax.random.fold_in(key, group))
        for g in got:
            c, want, _ = inner.rollout(params, c)
            cols = slice(2 * j, 2 * j + 2)
            np.testing.assert_array_equal(np.asarray(g.action[:, cols]), np.asarray(want.action))
            np.testing.assert_array_equal(np.asarray(g.terminated[:, cols]), np.asarray(want.terminated))
            np.testing.assert_allclose(np.asarray(g.obs[:, cols]), np.asarray(want.obs), rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(np.asarray(g.log_prob[:, cols]), np.asarray(want.log_prob), rtol=1e-5, atol=1e-6)
    assert not np.array_equal(np.asarray(got[0].action[:, :2]), np.asarray(got[0].action[:, 2:]))  # groups differ


def test_settings_from_environment_variables():
    from accerl_jax.run import distributed
    from accerl_jax.config import Config, ConfigError

    env = {"JAX_COORDINATOR_ADDRESS": "127.0.0.1:1234", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}
    assert distributed.resolve(Config(), env) == distributed.Cluster("127.0.0.1:1234", 2, 1)
    assert distributed.resolve(Config(process_id=0), env).process_id == 0  # a flag wins over its variable
    assert distributed.resolve(Config(), {}) is None  # one process
    with pytest.raises(ConfigError, match="bad JAX_NUM_PROCESSES 'two'; expected an integer"):
        distributed.resolve(Config(), dict(env, JAX_NUM_PROCESSES="two"))
    with pytest.raises(ConfigError, match="JAX_PROCESS_ID '1' given without --coordinator-address"):
        distributed.resolve(Config(), {"JAX_PROCESS_ID": "1"})


# --------------------------------------------------------------------------------------------------
# End to end: the main job (default compressor and loop) through run_training() and the CLI.


def _main_job(logdir: str, **overrides) -> tuple[dict, dict]:
    """The main job with the tiny :data:`MAIN` budget: its summary and its result (the final parameters)."""
    from accerl_jax.config import Config
    from accerl_jax import run_training_result

    result = run_training_result(Config(logdir=logdir, **dict(MAIN, **overrides)))
    return result.summary, result


def _leaves(tree) -> list:
    import jax

    return [np.asarray(x).tolist() for x in jax.tree.leaves(jax.device_get(tree))]


def _anakin_layout(logdir: str, num_seeds: int) -> dict:
    """Two one-update chunks of the Anakin program of the main job with ``num_seeds`` seeds, from a state
    placed as the loop places it: the sharding of the carry's leaves and the chunk's compilations."""
    import jax
    import jax.numpy as jnp

    from accerl_jax.config import Config
    from accerl_jax.loops import anakin_program, anakin_state
    from accerl_jax.run.build import setup

    run = setup(Config(logdir=logdir, num_seeds=num_seeds, **MAIN))
    try:
        chunk = anakin_program.make_chunk(run)
        states = [anakin_state.initial_state(run, MAIN_SEED + k) for k in range(num_seeds)]
        state = states[0] if num_seeds == 1 else jax.tree.map(lambda *xs: jnp.stack(xs), *states)
        state = jax.device_put(state, anakin_program.state_sharding())
        for _ in range(2):
            state, _, _ = chunk(state, 1)
        def specs(tree):
            return sorted({tuple(x.sharding.spec) for x in jax.tree.leaves(tree)}, key=str)

        return {"carry_specs": specs(state.carry), "learner_specs": specs(state.learner),
                "compiled": chunk.jitted._cache_size(), "update": int(state.update.reshape(-1)[0]),
                "timed_compress_all_reduces": _timed_compress_all_reduces(run, states[0])}
    finally:
        run.outputs.monitor.close(), run.outputs.saver.close(), run.outputs.lock.release()


def _timed_compress_all_reduces(run, state) -> int:
    """The all-reduces in the compiled compression that the Anakin stepper's cost split times
    (``--cost-split``) at the run's shapes: the student's gradient summed over the devices where its rows are
    split over them, as in the Anakin program (:func:`accerl_jax.loops.anakin_program.rows_over_devices`)."""
    import jax

    from accerl_jax.loops import pieces
    from accerl_jax.loops.shared import learner_update

    _, rollout = jax.eval_shape(run.actor.rollout_fn, state.actor_params[0], state.carry)
    outputs = jax.eval_shape(learner_update(run), state.learner, rollout)[2] if run.teacher_update else None
    compress = jax.jit(pieces._compress_fn(run, split_rows=True))
    hlo = compress.lower(state.learner.params, state.compressor, pieces._flat_obs(rollout.obs), outputs,
                         rollout).compile().as_text()
    return hlo.count(" all-reduce(")


def _main_job_devices(folder: str, num_seeds: int) -> None:
    """In a subprocess with N devices: the main job (its final learner parameters), then the layout of its
    Anakin program with ``num_seeds`` seeds."""
    import jax

    summary, trained = _main_job(os.path.join(folder, "run"))
    print("RESULT " + json.dumps({
        "devices": jax.local_device_count(), "summary": {k: summary[k] for k in SUMMARY_KEYS},
        "params": _leaves(trained.learner_params),
        "layout": _anakin_layout(os.path.join(folder, "layout"), num_seeds)}))


@pytest.fixture(scope="module")
def main_job_one_device(tmp_path_factory):
    """The main job on this process's one device: the reference for the same global batch."""
    logdir = str(tmp_path_factory.mktemp("one") / "run")
    summary, trained = _main_job(logdir)
    return logdir, summary, _leaves(trained.learner_params)


@pytest.mark.parametrize("n, num_seeds", [(2, 2), (4, 1)])
def test_main_job_on_n_devices_equals_one_device(tmp_path, main_job_one_device, n, num_seeds):
    """The main job (:data:`MAIN`: APPO, a distill:small student acting, the Anakin loop) on 2 and 4
    devices: the same rollouts (every env its own key, :mod:`accerl_jax.run.shards`) and, to float tolerance, the same learner as on one device; the
    carry is sharded along the batch axis, the learner replicated, and the chunk compiles once (with
    ``--num-seeds`` too)."""
    _, one, want = main_job_one_device
    got = run_device_main("test_devices", n, "_main_job_devices", (str(tmp_path), num_seeds))
    assert got["devices"] == n
    s = got["summary"]
    assert s["loop"] == one["loop"] == "anakin" and s["compressor"] == "distill:small"
    assert s["devices"] == s["learner_devices"] == n and s["updates"] == one["updates"] == 6
    assert s["learner_batch"] == one["learner_batch"] == 8 and s["total_env_steps"] == 6 * 8 * 8
    assert s["final_return_mean"] == one["final_return_mean"]  # the same episodes
    for a, b in zip(want, got["params"], strict=True):
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL)
    layout = got["layout"]
    # Every carry leaf split along its env axis (after the seed axis), the learner replicated.
    assert layout["carry_specs"] == [[None, "batch"] if num_seeds > 1 else ["batch"]], layout
    assert layout["learner_specs"] == [[]], layout
    assert layout["compiled"] == 1 and layout["update"] == 2
    # --cost-split times the distillation data-parallel, as the program runs it: the student's gradient is
    # summed over the devices (unsplit, XLA ran it whole on every device; docs/RESULTS.md, "The distillation
    # on two devices").
    assert layout["timed_compress_all_reduces"] > 0, layout


def _cli_args(**overrides) -> list[str]:
    """The CLI flags of the main job with the tiny :data:`MAIN` budget (and ``overrides``)."""
    args = []
    for k, v in dict(MAIN, **overrides).items():
        flag = f"--{k.replace('_', '-')}"
        args += [f"--no-{k}"] if v is False else [flag] if v is True else [flag, str(v)]
    return args


def _two_process_cmds(tmp_path, port: int, command) -> tuple[list, list]:
    """``command(pid)`` for both processes, with 2 devices each; process 1's temporary folder in ``tmp_path``."""
    envs = [dict(device_env(2), TMPDIR=str(tmp_path)) for _ in range(2)]
    return [command(pid) for pid in range(2)], envs


def _digests(outs: list[str]) -> list[str]:
    """The last learner parameters digest each process printed."""
    digests = []
    for pid, stdout in enumerate(outs):
        line = [ln for ln in stdout.splitlines() if ln.startswith(f"process {pid} of 2: learner parameters digest ")]
        assert line, stdout[-2000:]
        digests.append(line[-1].split()[-1])
    return digests


def _checkpoint_params(logdir, step: int) -> list:
    """The learner parameters saved in checkpoint ``step`` of the run in ``logdir``, in leaf order."""
    from accerl_jax.run import checkpoint

    leaves = checkpoint.read_leaves(str(logdir), step)
    return [v.tolist() for path, v in leaves.items() if path.startswith(".learner.params")]


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    """The README's multi-host command for the main job: two processes on 127.0.0.1, 2 devices and
    ``--num-envs 4`` each (global batch 8, the Anakin loop), to the end of the budget."""
    tmp_path = tmp_path_factory.mktemp("two")
    logdir = tmp_path / "run"
    (tmp_path / "out").mkdir()
    port = _free_port()
    cmds, envs = _two_process_cmds(tmp_path, port, lambda pid: [
        sys.executable, "-m", "accerl_jax.train", *_cli_args(num_envs=4), "--logdir", str(logdir),
        "--coordinator-address", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(pid)])
    outs = _launch(cmds, envs, tmp_path / "out")
    return tmp_path, logdir, outs


def test_two_processes_cli_train_the_main_job_to_the_end(two_process_run, main_job_one_device):
    """Both processes end with bitwise-equal learners, only process 0 writes, and the learner equals, to
    float tolerance, one process's with the same global batch (the Anakin program runs on global arrays:
    the same rollouts, and the distill:small student of :data:`MAIN` distils on the global observations)."""
    tmp_path, logdir, outs = two_process_run
    digests = _digests(outs)
    assert digests[0] == digests[1]  # bitwise-equal learner parameters on both processes
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["num_processes"] == 2 and summary["process_id"] == 0 and summary["learner_devices"] == 4
    assert summary["learner_batch"] == 8 and summary["total_env_steps"] == 6 * 8 * 8 and summary["updates"] == 6
    assert summary["compressor"] == "distill:small" and summary["stopped"] is None and summary["loop"] == "anakin"
    assert summary["learner_params_digest"] == digests[0]
    assert "outputs: written by process 0 only" in outs[1]
    assert sorted(os.listdir(tmp_path)) == ["out", "run"]  # process 1 left nothing behind
    _, one, want = main_job_one_device
    assert summary["final_return_mean"] == one["final_return_mean"]  # the same episodes, all seen by process 0
    for a, b in zip(want, _checkpoint_params(logdir, 6), strict=True):  # the final update's checkpoint
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL)


def _interrupted_cli(pid: int, port: int, logdir: str) -> None:
    """One of two processes: the CLI of the main job sends itself SIGINT while the chunk of updates 3-4
    runs (every process at the same update, as a signal to the whole job would), then the CLI resumes the
    run with ``--resume``. Prints the two exit codes."""
    import signal

    from accerl_jax import train
    from accerl_jax.run import distributed
    from accerl_jax.config import Config

    distributed.join(Config(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid))
    from accerl_jax.loops import anakin  # touches JAX devices: after joining

    real, done = anakin.make_chunk, {"n": 0}

    def make_chunk(run):
        chunk = real(run)

        def wrapped(state, length):
            done["n"] += length
            if done["n"] == 4 and run.start_update == 0:
                os.kill(os.getpid(), signal.SIGINT)
            return chunk(state, length)

        return wrapped

    anakin.make_chunk = make_chunk
    argv = [*_cli_args(num_envs=4, checkpoint_every=2), "--logdir", logdir, "--coordinator-address",
            f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(pid)]
    codes = [train.main(argv)]
    codes.append(train.main(argv + ["--resume", logdir]))
    print("RESULT " + json.dumps({"codes": codes}))


RESUMED_UPDATES = 8  # a resumed main job's larger budget (--total-steps of 8 updates; the first run had 6)


def _resume_main_job(folder: str) -> None:
    """In a subprocess with N devices: the main job in ``folder`` resumed to :data:`RESUMED_UPDATES` updates."""
    import jax

    summary, trained = _main_job(None, resume=folder, total_steps=8 * 8 * RESUMED_UPDATES)
    print("RESULT " + json.dumps({"devices": jax.local_device_count(), "summary": summary,
                                  "params": _leaves(trained.learner_params)}))


def test_checkpoint_resumes_on_other_device_and_process_counts(tmp_path, main_job_one_device, two_process_run):
    """A checkpoint resumes on another layout of the same global batch (its arrays are placed on this
    run's mesh): the one-device main job resumed on 2 devices, and the two-process one (2 devices and
    ``--num-envs 4`` each) resumed by one process with ``--num-envs 8`` on one device, each extended to
    :data:`RESUMED_UPDATES` updates, end with the same episodes and, to float tolerance, the same learner.
    ``--num-envs 4`` on one process (another global batch) is refused, naming the batch to give."""
    from accerl_jax.config import ConfigError

    shutil.copytree(main_job_one_device[0], tmp_path / "one")
    got = run_device_main("test_devices", 2, "_resume_main_job", (str(tmp_path / "one"),))
    two = got["summary"]
    shutil.copytree(two_process_run[1], tmp_path / "procs")
    with pytest.raises(ConfigError, match=r"8 \(checkpoint\) vs 4 x 1 process = 4 \(now\).*give --num-envs 8"):
        _main_job(None, resume=str(tmp_path / "procs"), num_envs=4, total_steps=8 * 8 * RESUMED_UPDATES)
    one, trained = _main_job(None, resume=str(tmp_path / "procs"), total_steps=8 * 8 * RESUMED_UPDATES)
    assert two["devices"] == two["learner_devices"] == 2 and one["devices"] == one["num_processes"] == 1
    for s in (one, two):
        assert s["resumed_from_update"] == 6 and s["updates"] == RESUMED_UPDATES and s["stopped"] is None
        assert s["learner_batch"] == 8 and s["total_env_steps"] == 8 * 8 * RESUMED_UPDATES
    assert one["episodes"] == two["episodes"] and one["final_return_mean"] == two["final_return_mean"]
    for a, b in zip(_leaves(trained.learner_params), got["params"], strict=True):
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL)


def test_two_processes_interrupted_and_resumed_equal_the_uninterrupted_run(tmp_path, two_process_run):
    """Two processes (2 devices each, the Anakin loop) checkpoint every 2 updates, are interrupted by
    SIGINT during updates 3-4, save update 4 and exit 130; resumed with ``--resume`` (every process reads
    the run's checkpoint, process 0 continues its folder), they end with the uninterrupted run's learner,
    bit for bit."""
    logdir = tmp_path / "run"
    (tmp_path / "out").mkdir()
    port = _free_port()
    cmds, envs = _two_process_cmds(tmp_path, port, lambda pid: [
        sys.executable, "-c", f"import test_devices as t; t._interrupted_cli({pid}, {port}, {str(logdir)!r})"])
    outs = _launch(cmds, envs, tmp_path / "out")
    assert [_result(o)["codes"] for o in outs] == [[130, 0], [130, 0]]
    digests = _digests(outs)
    assert digests[0] == digests[1] == _digests(two_process_run[2])[0]
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["resumed_from_update"] == 4 and summary["updates"] == 6 and summary["stopped"] is None
    assert sorted(os.listdir(logdir / "checkpoints")) == ["2", "4", "6"]
    _, uninterrupted, _ = two_process_run
    for a, b in zip(_checkpoint_params(uninterrupted, 6), _checkpoint_params(logdir, 6), strict=True):
        np.testing.assert_array_equal(b, a)
    assert sorted(os.listdir(tmp_path)) == ["out", "run"]  # process 1 left nothing behind


@pytest.mark.parametrize("normalised", [False, True], ids=["plain", "normalised"])
def test_two_processes_sequential_loop_equals_one_process(tmp_path, normalised):
    """The sequential loop on two processes (one device and ``--num-envs 4`` each) equals one process with
    ``--num-envs 8``: the same rollouts (every env keyed by its global index), the same learner, and the
    same distilled student, because every process distils on the observations of the whole global batch,
    with the learner's own outputs at them as the teacher's (gathered from the global update). With
    --normalize-observations/--normalize-rewards the statistics learn from the global batch too, so they
    equal one process's."""
    from accerl_jax.run import checkpoint

    flags = dict(normalize_observations=True, normalize_rewards=True) if normalised else {}
    one_dir = tmp_path / "one"
    _main_job(str(one_dir), loop="sequential", **flags)
    logdir = tmp_path / "run"
    (tmp_path / "out").mkdir()
    port = _free_port()
    envs = [dict(device_env(1), TMPDIR=str(tmp_path)) for _ in range(2)]
    cmds = [[sys.executable, "-m", "accerl_jax.train", *_cli_args(num_envs=4, **flags), "--loop", "sequential",
             "--logdir", str(logdir), "--coordinator-address", f"127.0.0.1:{port}", "--num-processes", "2",
             "--process-id", str(pid)] for pid in range(2)]
    outs = _launch(cmds, envs, tmp_path / "out")
    digests = _digests(outs)
    assert digests[0] == digests[1]
    got, want = checkpoint.read_leaves(str(logdir), 6), checkpoint.read_leaves(str(one_dir), 6)
    compared = {".actor_params": 0, ".normalizer": 0}
    for path, x in got.items():  # (the env carry is process-local in this loop: not compared)
        if (path.startswith((".learner.params", ".actor_params", ".compressor", ".normalizer"))
                and np.issubdtype(x.dtype, np.floating)):
            np.testing.assert_allclose(x, want[path], rtol=RTOL, atol=ATOL, err_msg=path)
            for part in compared:
                compared[part] += path.startswith(part)
    assert compared[".actor_params"] > 0  # the student's parameters were compared
    assert (compared[".normalizer"] > 0) == normalised and (".normalizer.obs.count" in got) == normalised


def test_a_setting_one_process_refuses_stops_all_before_anything_is_written(tmp_path):
    """Process 0's --logdir holds a run: both processes exit 2 with that error; nothing changes on disk."""
    logdir = tmp_path / "taken"
    logdir.mkdir()
    (logdir / "metrics.csv").write_text("update\n")
    (tmp_path / "out").mkdir()
    port = _free_port()
    cmds = [[sys.executable, "-m", "accerl_jax.train", "--no-progress", "--logdir", str(logdir),
             "--coordinator-address", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(pid)]
            for pid in range(2)]
    errs = _launch(cmds, [device_env(1), device_env(1)], tmp_path / "out", expect=2)
    assert "already holds a run" in errs[0].splitlines()[-1]
    assert "process 0 of the multi-host run refused its settings" in errs[1].splitlines()[-1]
    assert "already holds a run" in errs[1].splitlines()[-1]
    assert os.listdir(logdir) == ["metrics.csv"] and (logdir / "metrics.csv").read_text() == "update\n"


def test_processes_given_different_flags_stop_before_anything_is_written(tmp_path):
    """Process 1 has another --num-envs: both exit 2 naming the flag (instead of failing inside a
    collective), and nothing is written."""
    logdir = tmp_path / "run"
    (tmp_path / "out").mkdir()
    port = _free_port()
    cmds = [[sys.executable, "-m", "accerl_jax.train", "--no-progress", "--logdir", str(logdir),
             "--num-envs", str(8 * (pid + 1)), "--coordinator-address", f"127.0.0.1:{port}", "--num-processes", "2",
             "--process-id", str(pid)] for pid in range(2)]
    errs = _launch(cmds, [device_env(1), device_env(1)], tmp_path / "out", expect=2)
    for pid, err in enumerate(errs):
        line = err.splitlines()[-1]
        assert line.startswith("error: bad multi-host settings: the processes were given different flags"), err
        assert f"--num-envs {8 * (pid + 1)} (process {pid})" in line and "only --process-id differs" in line
    assert not logdir.exists()


def test_the_plan_starts_no_jax_backend():
    """A multi-host process checks its flags (the plan) before it joins the run, and joining must come before
    anything starts JAX's backend: importing the CLI, the plan and the multi-host module must not."""
    code = ("import accerl_jax.train, accerl_jax.run.plan, accerl_jax.run.distributed, accerl_jax.tools.presets, accerl_jax.tools.cli\n"
            "from accerl_jax.run.plan import check_config\nfrom accerl_jax.config import Config\n"
            "check_config(Config(env='envpool:CartPole-v1', coordinator_address='127.0.0.1:1', num_processes=2,"
            " process_id=0), 2)\n"
            "from jax._src import xla_bridge\nassert not xla_bridge._backends, 'a JAX backend was started'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_two_processes_of_sebulba_resolve_auto_to_none_or_refuse_its_candidates_after_the_count(tmp_path):
    """An envpool run of two processes with ``--compressor auto`` is the Sebulba run of what the gate resolves
    (each process counts the network's part of the global batch's rollout): resolved to none, both
    processes train the none run in Sebulba with equal learners; where the gate keeps auto's candidates (a
    threshold under the share), both refuse after the count, before anything is written (exit 2)."""
    port = _free_port()
    envs = [dict(device_env(1), TMPDIR=str(tmp_path)) for _ in range(2)]
    flags = ["--env", "envpool:CartPole-v1", "--num-envs", "4", "--rollout-length", "8", "--total-steps", str(4 * 8 * 2 * 4),
             "--compressor", "auto", "--log-every", "2", "--checkpoint-every", "0", "--no-progress"]

    def cmds(logdir, port, *extra):
        return [[sys.executable, "-m", "accerl_jax.train", *flags, *extra, "--logdir", str(logdir), "--coordinator-address",
                 f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(pid)] for pid in range(2)]

    (tmp_path / "out").mkdir()
    outs = _launch(cmds(tmp_path / "run", port), envs, tmp_path / "out")
    digests = _digests(outs)
    assert digests[0] == digests[1] and "auto kept none: the actor is" in outs[0]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["loop"] == "sebulba" and summary["compressor"] == "none" and summary["num_processes"] == 2
    assert summary["auto_gate"]["applied"] and summary["auto_gate"]["resolved"] == "none" and summary["updates"] == 4
    errs = _launch(cmds(tmp_path / "kept", _free_port(), "--auto-min-actor-share", "0.001"), envs, tmp_path / "out",
                   expect=2)
    for err in errs:
        assert "bad --compressor auto with --loop sebulba and several processes (its cost-split gate kept auto's " \
               "candidates" in err and "Traceback" not in err
    assert not (tmp_path / "kept").exists() or not os.listdir(tmp_path / "kept")


@pytest.mark.parametrize("loop_name", ["anakin", "sequential"])
def test_two_processes_count_the_auto_gate_alike_and_resolve_none(tmp_path, loop_name):
    """``--compressor auto``'s cost-split gate on two processes: each counts the FLOPs of the global batch's
    rollout and update (the sequential loop's actors step their own env groups, so the gate counts every
    group over the mesh), finds the actor's share of one process's run and resolves auto to none on both:
    the run is the --compressor none run, the same parameters on both processes."""
    from accerl_jax.run import checkpoint

    one, _ = _main_job(str(tmp_path / "one"), loop=loop_name, compressor="auto")
    assert one["auto_gate"]["resolved"] == "none"
    logdir = tmp_path / "run"
    (tmp_path / "out").mkdir()
    port = _free_port()
    devices = 2 if loop_name == "anakin" else 1
    envs = [dict(device_env(devices), TMPDIR=str(tmp_path)) for _ in range(2)]
    cmds = [[sys.executable, "-m", "accerl_jax.train", *_cli_args(num_envs=4, compressor="auto"), "--loop", loop_name,
             "--logdir", str(logdir), "--coordinator-address", f"127.0.0.1:{port}", "--num-processes", "2",
             "--process-id", str(pid)] for pid in range(2)]
    outs = _launch(cmds, envs, tmp_path / "out")
    digests = _digests(outs)
    assert digests[0] == digests[1]
    assert "auto kept none: the actor is" in outs[0]
    summary = json.loads((logdir / "summary.json").read_text())
    gate = summary["auto_gate"]
    assert summary["num_processes"] == 2 and summary["compressor"] == "none" and summary["loop"] == loop_name
    assert gate["applied"] and gate["resolved"] == "none"
    # XLA counts one device's share of a program over a mesh, the batch's work divided by the devices but
    # not the optimizer's: over 4 devices the share is ~13% lower than one device's (2 devices: ~1%); a
    # count of this process's rollout against the global update would be half.
    assert gate["ceiling"] == pytest.approx(one["auto_gate"]["ceiling"], rel=0.2)
    got, want = checkpoint.read_leaves(str(logdir), 6), checkpoint.read_leaves(str(tmp_path / "one"), 6)
    for path, x in got.items():
        if path.startswith(".learner.params"):
            np.testing.assert_allclose(x, want[path], rtol=RTOL, atol=ATOL, err_msg=path)


@pytest.mark.parametrize("loop_name", ["anakin", pytest.param("sequential", marks=pytest.mark.slow)])
def test_two_processes_take_the_same_auto_decisions(tmp_path, loop_name):
    """``--compressor auto`` on two processes (2 devices each): process 0's timings and divergences decide
    for both (each process measures its own, on its own share of the machine), so both take the same
    decisions, warm the same candidates on the global batch's observations, and end with bitwise-equal
    learner and actor parameters. (The student's KL exceeds the tiny bound, so the first evaluation
    always decides: it switches to ``none``, whatever the timings. The learner is MLP(256, 256): at the
    reset observations of the first evaluation, CartPole's ~0.05, the default MLP(64, 64)'s logits and its
    student's are so close to 0 that their KL can round below the bound, which would skip that evaluation.)"""
    logdir = tmp_path / "run"
    (tmp_path / "out").mkdir()
    port = _free_port()
    cmds, envs = _two_process_cmds(tmp_path, port, lambda pid: [
        sys.executable, "-m", "accerl_jax.train", *_cli_args(num_envs=4), "--loop", loop_name, "--compressor", "auto",
        "--auto-min-actor-share", "0",  # the gate off: this job's actor is too small a share for the candidates
        "--auto-candidates", "distill:tiny,none", "--max-actor-kl", "1e-12", "--auto-every", "2", "--hidden-sizes", "256",
        "256", "--logdir", str(logdir),
        "--coordinator-address", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(pid)])
    outs = _launch(cmds, envs, tmp_path / "out")
    decided = [[ln for ln in out.splitlines() if ln.startswith("auto, update ")] for out in outs]
    assert decided[0] and decided[0] == decided[1], outs
    actor = [[ln.split()[-1] for ln in out.splitlines() if ln.startswith(f"process {pid} of 2: actor parameters digest")]
             for pid, out in enumerate(outs)]
    assert actor[0] and actor[0] == actor[1]
    digests = _digests(outs)
    assert digests[0] == digests[1]
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["loop"] == loop_name and summary["num_processes"] == 2 and summary["stopped"] is None
    first = summary["auto_decisions"][0]
    assert (first["trigger"], first["previous"], first["chosen"]) == ("initial", "distill:tiny", "none")
    assert summary["actor_params_digest"] == actor[0][0]
    assert len(summary["auto_decisions"]) == len(decided[0])


NORMALISED = dict(compressor="none", normalize_observations=True, normalize_rewards=True)


def _normalised_job(logdir: str) -> dict:
    """The main job with observation and reward normalisation: its summary, final learner parameters and
    the statistics of its final checkpoint."""
    import jax

    from accerl_jax.run import checkpoint

    summary, trained = _main_job(logdir, **NORMALISED)
    leaves = checkpoint.read_leaves(logdir, summary["updates"])
    return {"devices": jax.local_device_count(), "summary": {k: summary[k] for k in SUMMARY_KEYS},
            "params": _leaves(trained.learner_params),
            "normalizer": {k: np.asarray(v).tolist() for k, v in leaves.items() if k.startswith(".normalizer")}}


def _normalised_job_devices(folder: str) -> None:
    print("RESULT " + json.dumps(_normalised_job(os.path.join(folder, "run"))))


def test_normalised_job_on_two_devices_equals_one_device(tmp_path):
    """--normalize-observations/--normalize-rewards on 2 devices: the statistics (combined over the
    devices' shares of the batch) and, to float tolerance, the learner equal one device's."""
    one = _normalised_job(str(tmp_path / "one"))
    got = run_device_main("test_devices", 2, "_normalised_job_devices", (str(tmp_path / "two"),))
    assert got["devices"] == 2 and got["summary"]["learner_devices"] == 2 and one["summary"]["learner_devices"] == 1
    assert got["summary"]["final_return_mean"] == one["summary"]["final_return_mean"]  # the same episodes
    assert list(got["normalizer"]) == list(one["normalizer"]) and one["normalizer"][".normalizer.obs.count"] == pytest.approx(6 * 64, abs=1e-3)
    for k, v in one["normalizer"].items():
        np.testing.assert_allclose(got["normalizer"][k], v, rtol=RTOL, atol=ATOL, err_msg=k)
    for a, b in zip(one["params"], got["params"], strict=True):
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL)
