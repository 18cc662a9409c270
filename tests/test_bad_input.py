"""Bad input: every bad flag value or combination exits with status 2 and a one-line error
naming the value and what is accepted, with no traceback, and changes nothing on disk.

Each case runs in a fresh folder holding a copy of a real, resumable run (stopped after 2 of 4 updates,
checkpoints 1 and 2); every file under the folder is hashed before and after. Most cases run in-process
through :func:`accerl_jax.train.main` (the CLI's own code path: parse, train, map errors to exit codes);
the ones marked ``SUB`` also run as real ``python -m accerl_jax.train`` subprocesses. Every refusal of
the plan, and its message, is tabled in tests/test_plan.py without building anything; the plan's cases
here are the ones the CLI adds something to (flag parsing, a real checkpoint's record, the run folder).
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import tyro

from accerl_jax import train
from accerl_jax import run_training
from accerl_jax.run import folder as run_folder
from accerl_jax.config import Config
from actor_hooks import interrupt

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = ["--total-steps", "256", "--num-envs", "8", "--rollout-length", "8", "--log-every", "2", "--no-progress"]
SUB = "subprocess"


def _over(t):  # an existing run that --overwrite would replace: a bad flag must still leave it intact
    return ["--logdir", str(t / "run"), "--overwrite"]


def _resume(*parts):
    return lambda t: ["--resume", str(t.joinpath("run", *parts))]


def _truncate_data(t):
    data = max(glob.glob(str(t / "run" / "checkpoints" / "2" / "state" / "**" / "d" / "*"), recursive=True),
               key=os.path.getsize)
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)


def _flip_byte(t):
    data = max(glob.glob(str(t / "run" / "checkpoints" / "2" / "state" / "**" / "d" / "*"), recursive=True),
               key=os.path.getsize)
    raw = bytearray(open(data, "rb").read())
    raw[len(raw) // 2] ^= 0xFF
    open(data, "wb").write(bytes(raw))


def _half_written(t):
    ck = t / "run" / "checkpoints"
    for step in ("1", "2"):
        os.rename(ck / step, ck / f"{step}.orbax-checkpoint-tmp-1234")


def _other_network(t):
    meta = t / "run" / "checkpoints" / "2" / "meta" / "metadata"
    record = json.loads(meta.read_text())
    record["leaves"][1]["shape"] = [4, 128]  # as if written by a run with another first layer
    meta.write_text(json.dumps(record))


_HELD = []  # locks held by a case, as if another process were running the run


def _running(t):
    _HELD.append(run_folder.lock_run(str(t / "run")))


def _hosts(address, n, pid):
    return ["--coordinator-address", address, "--num-processes", str(n), "--process-id", str(pid)]


def _a_file(t):
    (t / "a_file").write_text("keep")


def _no_checkpoints(t):
    (t / "plain").mkdir()
    (t / "plain" / "notes.txt").write_text("keep")


def _settings(content):
    def write(t):
        (t / "settings.yaml").write_text(content)
    return write


def _config(t):
    return ["--config", str(t / "settings.yaml")]


# (id, extra args (a function of the case folder), prepare (or None), [message parts], SUB or "")
CASES = [
    ("switch-with-value", lambda t: _over(t) + ["--progress", "off"], None,
     ["bad --progress 'off'", "takes no value", "--no-progress for the opposite"], SUB),
    ("switch-with-a-word", lambda t: _over(t) + ["--progress", "bogus"], None,
     ["bad --progress 'bogus'", "takes no value", "--no-progress for the opposite"], SUB),
    ("switch-with-equals", lambda t: _over(t) + ["--no-anneal-lr=true"], None,
     ["bad --no-anneal-lr 'true'", "write --no-anneal-lr alone (--anneal-lr for the opposite)"], ""),
    ("normalize-auto", lambda t: _over(t) + ["--normalize-observations", "--compressor", "auto",
                                             "--auto-min-actor-share", "0"], None,
     ["bad --normalize-observations with --compressor auto (--auto-min-actor-share 0)",
      "auto's candidates do not carry normalisation statistics"], SUB),
    ("normalize-search", lambda t: _over(t) + ["--normalize-rewards", "--agent", "search"], None,
     ["bad --normalize-rewards with --agent search", "by the sequential and Sebulba loops"], ""),
    ("normalize-envpool-anakin", lambda t: _over(t) + ["--normalize-rewards", "--env", "envpool:CartPole-v1",
                                                       "--loop", "anakin"], None,
     ["bad --normalize-rewards with --loop anakin and --env envpool:CartPole-v1", "and by the sequential and Sebulba loops"], ""),
    ("env-no-backend", lambda t: _over(t) + ["--env", "CartPole-v1"], None,
     ["bad --env 'CartPole-v1'", "expected 'gymnax:<id>'"], SUB),
    ("env-unknown-backend", lambda t: _over(t) + ["--env", "gym:CartPole-v1"], None,
     ["bad --env 'gym:CartPole-v1'", "'envpool:<id>'", "or 'pgx:<game>'"], ""),
    ("env-unknown-gymnax-id", lambda t: _over(t) + ["--env", "gymnax:NoSuchEnv"], None,
     ["unknown gymnax environment 'NoSuchEnv'", "known ones include"], ""),
    ("env-unknown-envpool-id", lambda t: _over(t) + ["--env", "envpool:NoSuchGame-v5"], None,
     ["unknown envpool task 'NoSuchGame-v5'", "e.g. Pong-v5"], ""),
    ("compressor-malformed", lambda t: _over(t) + ["--compressor", "mask"], None,
     ["bad --compressor 'mask'", "missing value", "'mask:<sparsity in [0,1)>"], ""),
    ("compressor-unknown-method", lambda t: _over(t) + ["--compressor", "zip:3"], None,
     ["unknown kind 'zip'", "expected 'none'"], ""),
    ("sparsity-1", lambda t: _over(t) + ["--compressor", "mask:1.0"], None,
     ["bad --compressor 'mask:1.0'", "outside [0, 1)"], ""),
    ("sparsity-negative", lambda t: _over(t) + ["--compressor", "mask:-0.1"], None,
     ["bad --compressor 'mask:-0.1'", "outside [0, 1)"], ""),
    ("sparsity-not-a-number", lambda t: _over(t) + ["--compressor", "mask:half"], None,
     ["'half' is not a number", "expected 'none'"], ""),
    ("bits-1", lambda t: _over(t) + ["--compressor", "fakequant:1"], None,
     ["bad --compressor 'fakequant:1'", "integer in [2, 8]"], ""),
    ("bits-9", lambda t: _over(t) + ["--compressor", "fakequant:9"], None,
     ["bad --compressor 'fakequant:9'", "integer in [2, 8]"], ""),
    ("chain-impossible-order", lambda t: _over(t) + ["--compressor", "fakequant:8+distill:small"], None,
     ["bad --compressor 'fakequant:8+distill:small'", "'distill:small' cannot follow 'fakequant:8'", "a chain goes"], SUB),
    ("chain-empty-stage", lambda t: _over(t) + ["--compressor", "mask:0.5+"], None,
     ["bad --compressor 'mask:0.5+'", "empty stage"], ""),
    ("compressor-spaces", lambda t: _over(t) + ["--compressor", "distill:small + int8"], None,
     ["bad --compressor 'distill:small + int8'", "contains spaces"], ""),
    ("compressor-none-chained", lambda t: _over(t) + ["--compressor", "none+int8"], None,
     ["bad --compressor 'none+int8'", "cannot be chained", "'int8'"], ""),
    ("mask-option-repeated", lambda t: _over(t) + ["--compressor", "mask:0.9,ramp=5,ramp=6"], None,
     ["bad --compressor 'mask:0.9,ramp=5,ramp=6'", "repeat an option"], ""),
    ("mask-ramp-not-an-integer", lambda t: _over(t) + ["--compressor", "mask:0.9,ramp=abc"], None,
     ["mask option 'ramp=abc'", "'abc' is not an integer"], ""),
    ("max-actor-kl-0", lambda t: _over(t) + ["--compressor", "auto", "--max-actor-kl", "0"], None,
     ["bad --max-actor-kl 0.0", "expected a positive number (nats)"], SUB),
    ("max-actor-kl-nan", lambda t: _over(t) + ["--compressor", "auto", "--max-actor-kl", "nan"], None,
     ["bad --max-actor-kl nan", "expected a finite number"], ""),
    ("auto-candidates-bad-spec", lambda t: _over(t) + ["--compressor", "auto", "--auto-candidates", "none,zip:3"], None,
     ["bad --compressor 'zip:3'", "unknown kind 'zip'"], ""),
    ("auto-every-0", lambda t: _over(t) + ["--compressor", "auto", "--auto-every", "0"], None,
     ["bad --auto-every 0", "expected an integer in [1, 2^31)"], ""),
    ("auto-min-actor-share-negative", lambda t: _over(t) + ["--compressor", "auto", "--auto-min-actor-share", "-0.1"],
     None, ["bad --auto-min-actor-share -0.1", "expected a fraction in [0, 1]"], ""),
    ("auto-min-actor-share-over-1", lambda t: _over(t) + ["--compressor", "auto", "--auto-min-actor-share", "1.5"],
     None, ["bad --auto-min-actor-share 1.5", "expected a fraction in [0, 1]"], ""),
    ("auto-min-actor-share-not-a-number", lambda t: _over(t) + ["--compressor", "auto", "--auto-min-actor-share",
                                                               "half"], None,
     ["bad --auto-min-actor-share 'half'", "expected a number"], SUB),
    ("config-leading-zero", lambda t: _over(t) + _config(t), _settings("seed: 010\n"),
     ["bad --config", "seed: 010 is ambiguous (octal 8 in YAML 1.1, decimal 10 in YAML 1.2)", "write 10"], SUB),
    ("config-base-60", lambda t: _over(t) + _config(t), _settings("total_steps: 1:30\n"),
     ["bad --config", "total_steps: 1:30 is ambiguous", "write 90"], ""),
    ("logdir-empty", lambda t: ["--logdir", ""], None,
     ["bad --logdir ''", "empty"], ""),
    ("student-unknown", lambda t: _over(t) + ["--compressor", "distill:huge"], None,
     ["unknown student 'huge'", "distill:<half|small|tiny|mlp>"], ""),
    ("student-mlp-of-an-mlp", lambda t: _over(t) + ["--compressor", "distill:mlp"], None,
     ["student 'mlp' is an MLP for an image network", "use one of half, small, tiny"], ""),
    ("num-envs-0", lambda t: _over(t) + ["--num-envs", "0"], None,
     ["bad --num-envs 0", "expected an integer in [1, 65536]"], SUB),
    ("num-envs-negative", lambda t: _over(t) + ["--num-envs", "-4"], None,
     ["bad --num-envs -4", "expected an integer in [1, 65536]"], ""),
    ("rollout-length-0", lambda t: _over(t) + ["--rollout-length", "0"], None,
     ["bad --rollout-length 0", "expected an integer in [1, 65536]"], ""),
    ("total-steps-0", lambda t: _over(t) + ["--total-steps", "0"], None,
     ["bad --total-steps 0", "expected a positive integer"], ""),
    ("total-steps-negative", lambda t: _over(t) + ["--total-steps", "-64"], None,
     ["bad --total-steps -64", "expected a positive integer"], ""),
    ("lr-0", lambda t: _over(t) + ["--learning-rate", "0"], None,
     ["bad --learning-rate 0.0", "expected a positive number"], ""),
    ("lr-nan", lambda t: _over(t) + ["--learning-rate", "nan"], None,
     ["bad --learning-rate nan", "expected a finite number"], ""),
    ("seed-negative", lambda t: _over(t) + ["--seed", "-1"], None,
     ["bad --seed -1", "expected an integer in [0, 2^31)"], ""),
    ("compile-cache-a-file", lambda t: _over(t) + ["--compile-cache", str(t / "plain" / "notes.txt")], _no_checkpoints,
     ["bad --compile-cache", "notes.txt", "expected 'auto', 'off' or a folder"], ""),
    ("checkpoint-every-negative", lambda t: _over(t) + ["--checkpoint-every", "-1"], None,
     ["bad --checkpoint-every -1", "expected an integer in [0, 2^31)"], ""),
    ("keep-checkpoints-0", lambda t: _over(t) + ["--keep-checkpoints", "0"], None,
     ["bad --keep-checkpoints 0", "expected an integer in [1, 10000]"], ""),
    ("logdir-is-a-file", lambda t: ["--logdir", str(t / "a_file")], _a_file,
     ["bad --logdir", "it is a file; expected a folder"], ""),
    ("logdir-unwritable", lambda t: ["--logdir", str(t / "a_file" / "run")], _a_file,
     ["bad --logdir", "cannot write there"], ""),
    ("logdir-holds-a-run", lambda t: ["--logdir", str(t / "run")], None,
     ["bad --logdir", "already holds a run", "--resume", "--overwrite"], SUB),
    ("resume-missing", _resume("nothing_here"), None,
     ["bad --resume", "no such folder; expected a run folder"], ""),
    ("resume-no-checkpoints", lambda t: ["--resume", str(t / "plain")], _no_checkpoints,
     ["bad --resume", "no checkpoints/ folder there"], ""),
    ("resume-half-written", _resume(), _half_written,
     ["bad --resume", "no finished checkpoint", "half-written one is never used"], ""),
    ("resume-half-written-path", _resume("checkpoints", "2.orbax-checkpoint-tmp-1234"), _half_written,
     ["bad --resume", "not a finished checkpoint"], ""),
    ("resume-truncated", _resume(), _truncate_data,
     ["bad --resume", "checkpoints/2' is damaged"], SUB),
    ("resume-altered", _resume(), _flip_byte,
     ["bad --resume", "is damaged"], ""),
    ("resume-not-latest", _resume("checkpoints", "1"), None,
     ["bad --resume", "update 1 is not the run's latest checkpoint (2)"], ""),
    ("resume-other-env", lambda t: _resume()(t) + ["--env", "gymnax:Acrobot-v1"], None,
     ["different configuration", "--env 'gymnax:CartPole-v1' (checkpoint) vs 'gymnax:Acrobot-v1' (now)",
      "--resume alone takes them"], SUB),
    ("resume-other-compressor", lambda t: _resume()(t) + ["--compressor", "distill:tiny"], None,
     ["different configuration", "--compressor 'auto' (checkpoint) vs 'distill:tiny' (now)"], ""),
    ("resume-smaller-budget", lambda t: _resume()(t) + ["--total-steps", "64"], None,
     ["bad --total-steps 64 with --resume", "a budget of 1 update, fewer than the 2 its checkpoint has done",
      "--total-steps 192 or more"], ""),
    ("resume-other-network", _resume(), _other_network,
     ["bad --resume", "does not fit this run's networks"], ""),
    ("resume-while-running", _resume(), _running,
     ["bad --logdir", "another process is writing this run now"], ""),
    ("overwrite-while-running", _over, _running, ["bad --logdir", "another process is writing this run now"], ""),
    ("resume-other-logdir", lambda t: _resume()(t) + ["--logdir", str(t / "elsewhere")], None,
     ["bad --logdir", "a resumed run continues in its own folder"], ""),
    # Multi-host settings: refused before jax.distributed.initialize contacts anything.
    ("coordinator-port-out-of-range", lambda t: _over(t) + _hosts("127.0.0.1:99999", 2, 0), None,
     ["bad --coordinator-address '127.0.0.1:99999'", "expected HOST:PORT with a port in [1, 65535]"], SUB),
    ("coordinator-without-port", lambda t: _over(t) + _hosts("host0", 2, 0), None,
     ["bad --coordinator-address 'host0'", "expected HOST:PORT"], ""),
    ("coordinator-unresolvable", lambda t: _over(t) + _hosts("no-such-host.invalid:1234", 2, 1), None,
     ["bad --coordinator-address 'no-such-host.invalid:1234'", "cannot resolve host"], ""),
    ("process-id-too-large", lambda t: _over(t) + _hosts("127.0.0.1:1234", 2, 2), None,
     ["bad --process-id 2", "expected an integer in [0, 1]"], SUB),
    ("process-id-negative", lambda t: _over(t) + _hosts("127.0.0.1:1234", 2, -1), None,
     ["bad --process-id -1", "expected an integer in [0, 1]"], ""),
    ("num-processes-0", lambda t: _over(t) + _hosts("127.0.0.1:1234", 0, 0), None,
     ["bad --num-processes 0", "expected an integer in [1, 65536]"], ""),
    ("multihost-incomplete", lambda t: _over(t) + ["--num-processes", "2"], None,
     ["bad multi-host settings: --num-processes 2 given without --coordinator-address", "--process-id",
      "give all three"], ""),
    ("multihost-resume-sequential", lambda t: _resume()(t) + _hosts("127.0.0.1:1234", 2, 0) + ["--loop", "sequential"],
     None, ["bad --resume", "with several processes and --loop sequential", "only a multi-host run of the Anakin loop"],
     ""),
    # The Anakin loop steps envpool through its XLA interface: one pool, one seed, 32-bit arrays.
    ("anakin-envpool-num-seeds", lambda t: _over(t) + ["--env", "envpool:CartPole-v1", "--loop", "anakin",
                                                       "--num-seeds", "2"], None,
     ["bad --num-seeds 2 with --loop anakin and envpool:CartPole-v1", "vmap cannot copy", "--num-seeds 1"], SUB),
    ("multihost-sebulba-auto", lambda t: _over(t) + _hosts("127.0.0.1:1234", 2, 0) + [
        "--env", "envpool:CartPole-v1", "--compressor", "auto", "--loop", "sebulba", "--auto-min-actor-share", "0"], None,
     ["bad --compressor auto with --loop sebulba and several processes", "use a fixed --compressor"], ""),
]


def _tree_hashes(root) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = "dir"
        for f in filenames:
            with open(os.path.join(dirpath, f), "rb") as fh:
                out[os.path.relpath(os.path.join(dirpath, f), root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A real run stopped (as by Ctrl-C) after update 2 of 4, with checkpoints 1 and 2."""
    logdir = tmp_path_factory.mktemp("base") / "run"
    with pytest.MonkeyPatch.context() as mp:
        interrupt(mp, at=3)
        cfg = tyro.cli(Config, args=COMMON + ["--logdir", str(logdir), "--checkpoint-every", "1"])
        summary = run_training(cfg)
    assert summary["stopped"] == "interrupted" and summary["updates"] == 2
    assert sorted(os.listdir(logdir / "checkpoints")) == ["1", "2"]
    return logdir


def _prepare(tmp_path, base_run, prepare):
    shutil.copytree(base_run, tmp_path / "run")
    if prepare is not None:
        prepare(tmp_path)
    return _tree_hashes(tmp_path)


def _check_error(err: str, parts: list[str]) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for part in parts:
        assert part in lines[0], (part, lines[0])
    return lines[0]


@pytest.mark.parametrize("case, args, prepare, parts, mode", CASES, ids=[c[0] for c in CASES])
def test_bad_input_in_process(tmp_path, base_run, capsys, record_property, case, args, prepare, parts, mode):
    before = _prepare(tmp_path, base_run, prepare)
    capsys.readouterr()
    code = train.main(COMMON + args(tmp_path))
    assert code == 2
    record_property("error", _check_error(capsys.readouterr().err, parts))  # in --junitxml reports
    assert _tree_hashes(tmp_path) == before  # nothing created, changed or deleted
    while _HELD:
        _HELD.pop().release()


def _run_cli(args, extra_env=None):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), **(extra_env or {}))
    return subprocess.run([sys.executable, "-m", "accerl_jax.train", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


SUB_CASES = [c for c in CASES if c[4] == SUB]


@pytest.mark.parametrize("case, args, prepare, parts, mode", SUB_CASES, ids=[c[0] for c in SUB_CASES])
def test_bad_input_cli(tmp_path, base_run, case, args, prepare, parts, mode):
    before = _prepare(tmp_path, base_run, prepare)
    proc = _run_cli(COMMON + args(tmp_path))
    assert proc.returncode == 2, proc.stderr[-2000:]
    _check_error(proc.stderr, parts)
    assert _tree_hashes(tmp_path) == before


def test_num_envs_not_divisible_by_devices_cli(tmp_path):
    """Two forced host devices; 3 environments cannot be split over them."""
    proc = _run_cli(COMMON + ["--num-envs", "3", "--logdir", str(tmp_path / "new")],
                    {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    _check_error(proc.stderr, ["bad --num-envs 3", "must be a multiple of the 2 local devices"])
    assert not (tmp_path / "new").exists()


def test_orphaned_reads_of_a_damaged_checkpoint_are_not_logged_but_other_asyncio_errors_are(tmp_path, caplog):
    """After one read of a damaged checkpoint fails, the other reads' tasks are garbage-collected at any
    later moment and asyncio logs "Task exception was never retrieved" with a traceback (the CI failure of
    stop 34: 36 lines under the one-line error, depending on timing; for a bare future asyncio says "Future
    exception ..." instead, the failure after stop 37). The guard drops exactly those
    records: ones naming a file under the checkpoint folder being read, and no others."""
    import logging

    from accerl_jax.run import checkpoint

    root = str(tmp_path / "run" / "checkpoints")
    checkpoint._ignore_closed_loop_callbacks(root)
    asyncio_log = logging.getLogger("asyncio")
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio_log.error("Task exception was never retrieved\nfuture: <Task finished exception=ValueError("
                          f"'OUT_OF_RANGE: Error reading \"leaf_00034/0.0\" in OCDBT database at local file "
                          f"\"{root}/2/state/\"')>")
        asyncio_log.error("Task exception was never retrieved\nfuture: <Task finished exception="
                          "ValueError('something else entirely')>")
        # a bare future's orphaned read (the CI failure after stop 37: 9 lines under the one-line error)
        asyncio_log.error("Future exception was never retrieved\nfuture: <Future finished exception=ValueError("
                          f"'OUT_OF_RANGE: Error reading \"leaf_00028/0.0\" in OCDBT database at local file "
                          f"\"{root}/2/state/\": Requested byte range [63049, 78081) is not valid')>")
        asyncio_log.error(f"Unclosed client session under {root}")
    messages = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert len(messages) == 2, messages
    assert "something else entirely" in messages[0] and messages[1].startswith("Unclosed client session")
