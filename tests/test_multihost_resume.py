"""``--resume`` of multi-host runs from the command line, in fresh processes (as after a crash or a preemption).

* The CLI's stages before :func:`jax.distributed.initialize` (parsing, ``--preset``, ``--config``, reading
  ``--resume``'s settings from the checkpoint, the plan's checks) start no JAX backend: a process that had
  started one could no longer join the multi-host run.
* The README's multi-host command, then the same command with ``--resume`` in fresh processes: two
  processes train a tiny run and exit 0; two new processes resume it with a larger ``--total-steps`` and
  end at the same update with bitwise-equal learners. Elastic: a one-process run resumed by two
  processes (the same global batch, ``--num-envs`` halved), and a two-process run resumed by one.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from test_devices import RTOL, ATOL, _checkpoint_params, _digests, _free_port, _launch
from two_devices import ROOT, device_env

# A tiny run: a global batch of 4 CartPole envs x 4 steps (16 env steps per update), a small MLP.
STEPS_PER_UPDATE = 4 * 4
TINY = ["--rollout-length", "4", "--hidden-sizes", "16", "--log-every", "1", "--no-progress"]
FIRST, RESUMED, LAST = 2, 4, 5  # updates: the first session's budget, the resumed ones', the 2 -> 1 resume's


def _train(logdir, processes: int, updates: int, folder, *extra) -> list[str]:
    """``python -m accerl_jax.train`` on ``processes`` fresh processes (one CPU device each, the global
    batch of 4 envs split over them), to ``updates`` updates; returns their stdouts (all must exit 0)."""
    port = _free_port()
    hosts = lambda pid: (["--coordinator-address", f"127.0.0.1:{port}", "--num-processes", str(processes),
                          "--process-id", str(pid)] if processes > 1 else [])
    cmds = [[sys.executable, "-m", "accerl_jax.train", *TINY, "--num-envs", str(4 // processes),
             "--total-steps", str(STEPS_PER_UPDATE * updates), *extra, *hosts(pid)] for pid in range(processes)]
    envs = [dict(device_env(1), TMPDIR=str(folder)) for _ in range(processes)]
    assert all("xla_backend_optimization_level" in e["XLA_FLAGS"] for e in envs)  # conftest's fast compiles
    os.makedirs(folder, exist_ok=True)
    return _launch(cmds, envs, folder, timeout=240)


def _summary(logdir) -> dict:
    return json.loads((logdir / "summary.json").read_text())


def test_one_process_run_resumed_by_two_processes_equals_its_one_process_resume(tmp_path):
    """Elastic, in the default tests (the slow test below also resumes two processes' run by two fresh ones
    and by one; the default tests cover those in test_devices): a one-process run of 4 envs trains 2
    updates; two fresh processes of 2 envs each ``--resume`` it to 4 updates and end with bitwise-equal
    learners that equal, to float tolerance, the same run resumed to 4 updates by one process (the budget,
    hence the learning-rate schedule, changes at the resume: a run trained to 4 updates at once differs)."""
    import shutil

    one, whole = tmp_path / "one", tmp_path / "whole"
    _train(one, 1, FIRST, tmp_path / "o1", "--logdir", str(one))
    shutil.copytree(one, whole)
    outs = _train(one, 2, RESUMED, tmp_path / "o2", "--resume", str(one))
    digests = _digests(outs)
    assert digests[0] == digests[1]
    summary = _summary(one)
    assert summary["resumed_from_update"] == FIRST and summary["updates"] == RESUMED and summary["stopped"] is None
    assert summary["num_processes"] == 2 and summary["learner_batch"] == 4
    assert summary["learner_params_digest"] == digests[0]
    _train(whole, 1, RESUMED, tmp_path / "o3", "--resume", str(whole))
    for a, b in zip(_checkpoint_params(whole, RESUMED), _checkpoint_params(one, RESUMED), strict=True):
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL)


@pytest.mark.slow  # 88 s of a test worker; its parts run in the default tests above and in test_devices
def test_two_processes_resume_in_fresh_processes_and_elastically(tmp_path):
    """Two processes train 2 updates; two fresh processes ``--resume`` the run folder to 4 updates (exit 0,
    equal digests on both, the summary's update counts); a one-process run of the same global batch
    resumed by two processes ends, to float tolerance, with the same learner; the two-process run is then
    resumed by one process to a 5th update."""
    two, one = tmp_path / "two", tmp_path / "one"
    _train(two, 2, FIRST, tmp_path / "o1", "--logdir", str(two))
    assert _summary(two)["updates"] == FIRST and _summary(two)["num_processes"] == 2
    outs = _train(two, 2, RESUMED, tmp_path / "o2", "--resume", str(two))
    digests = _digests(outs)
    assert digests[0] == digests[1]  # bitwise-equal learners on both processes
    summary = _summary(two)
    assert summary["resumed_from_update"] == FIRST and summary["updates"] == RESUMED and summary["stopped"] is None
    assert summary["learner_params_digest"] == digests[0] and summary["num_processes"] == 2

    # Elastic: one process of 4 envs, resumed by two of 2 (the guide's "one process continuing as two").
    _train(one, 1, FIRST, tmp_path / "o3", "--logdir", str(one))
    outs = _train(one, 2, RESUMED, tmp_path / "o4", "--resume", str(one))
    assert _digests(outs)[0] == _digests(outs)[1]
    summary = _summary(one)
    assert summary["resumed_from_update"] == FIRST and summary["updates"] == RESUMED
    assert summary["num_processes"] == 2 and summary["learner_batch"] == 4
    for a, b in zip(_checkpoint_params(two, RESUMED), _checkpoint_params(one, RESUMED), strict=True):
        np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL)

    # And two processes' run resumed by one (4 envs).
    _train(two, 1, LAST, tmp_path / "o5", "--resume", str(two))
    summary = _summary(two)
    assert summary["resumed_from_update"] == RESUMED and summary["updates"] == LAST and summary["num_processes"] == 1


def _fake_run(run) -> None:
    """A run folder whose latest checkpoint (update 3) records the default configuration (only the JSON
    record: enough for reading ``--resume``'s settings)."""
    from accerl_jax.run.checkpoint import FORMAT
    from accerl_jax.config import Config

    meta = run / "checkpoints" / "3" / "meta"
    meta.mkdir(parents=True)
    record = {"format": FORMAT, "step": 3, "config": dataclasses.asdict(Config(total_steps=1_000_000)),
              "extra": {"num_processes": 2}, "leaves": []}
    (meta / "metadata").write_text(json.dumps(record))


# In a fresh interpreter: train.main up to the point where it joins the multi-host run, which records
# whether a JAX backend had been started by then (and the run's settings) instead of contacting anything.
UNTIL_JOIN = """
import json, sys
from accerl_jax import train
from accerl_jax.run import distributed

def initialize(cluster):
    from jax._src import xla_bridge
    backends = sorted(xla_bridge._backends)  # what train.main started before joining
    cfg = train.parse_config(sys.argv[1:])
    print("JOIN " + json.dumps({"backends": backends, "total_steps": cfg.total_steps,
                                "num_envs": cfg.num_envs, "pid": cluster.process_id}), flush=True)
    sys.exit(0)

distributed.initialize = initialize
sys.exit(train.main(sys.argv[1:]))
"""


def test_no_jax_backend_before_joining_the_multi_host_run(tmp_path):
    """Each CLI path a multi-host process takes (``--resume`` of a run folder or of its latest checkpoint
    folder, ``--config``, ``--preset``) reaches :func:`jax.distributed.initialize` with no JAX backend
    started (JAX refuses to join after one), and with the resumed run's own settings."""
    run = tmp_path / "run"
    _fake_run(run)
    (tmp_path / "s.yaml").write_text("num_envs: 8\n")
    hosts = ["--coordinator-address", "127.0.0.1:1", "--num-processes", "2", "--process-id", "1"]
    cases = {
        "resume": (["--resume", str(run), "--total-steps", "2000000"], 2_000_000, 16),
        "resume-checkpoint": (["--resume", str(run / "checkpoints" / "3")], 1_000_000, 16),
        "config": (["--config", str(tmp_path / "s.yaml"), "--logdir", str(tmp_path / "new")], 200_000, 8),
        "preset": (["--preset", "classic", "--logdir", str(tmp_path / "new")], 200_000, 16),
    }
    for name, (argv, total_steps, num_envs) in cases.items():
        proc = subprocess.run([sys.executable, "-c", UNTIL_JOIN, *argv, *hosts], env=device_env(1), cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("JOIN ")]
        assert proc.returncode == 0 and lines, (name, proc.stdout[-2000:], proc.stderr[-2000:])
        got = json.loads(lines[-1][len("JOIN "):])
        assert got == {"backends": [], "total_steps": total_steps, "num_envs": num_envs, "pid": 1}, (name, got)
