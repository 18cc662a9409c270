"""The plan (:func:`accerl_jax.run.plan.make_plan`) as a pure function of the configuration and small typed
facts: every refusal of a training configuration in one table, and the decisions it takes once (loop,
device layout, compressor capabilities). Nothing is built: the environments, the machine and the run
folder are fake facts (:class:`~accerl_jax.envs.EnvInfo`, :class:`~accerl_jax.run.plan.Machine`,
:class:`~accerl_jax.run.plan.Folder`), the compressor is only run abstractly. The CLI's guarantees around a
refusal (exit status 2, one line, nothing written) are tests/test_bad_input.py's.
"""
from __future__ import annotations

import dataclasses
import importlib.util

import pytest

from accerl_jax.run import plan as plan_lib
from accerl_jax.run.checkpoint import ResumePoint
from accerl_jax.config import Config, ConfigError
from accerl_jax.envs import EnvInfo
from accerl_jax.run.plan import Folder, Machine, make_plan

# Facts of the environments the table plans for, as their adapters report them (EnvInfo).
ENVS = {
    "gymnax:CartPole-v1": EnvInfo("gymnax:CartPole-v1", 8, (4,), "float32", 2, False, True, 500),
    "gymnax:Breakout-MinAtar": EnvInfo("gymnax:Breakout-MinAtar", 8, (10, 10, 4), "float32", 3, False, True, 1000),
    "gymnax:Pendulum-v1": EnvInfo("gymnax:Pendulum-v1", 8, (3,), "float32", 0, False, True, 200,
                                  action_shape=(1,), action_low=(-2.0,), action_high=(2.0,)),
    "gymnax:Matrix-v0": EnvInfo("gymnax:Matrix-v0", 8, (2, 3), "float32", 2, False, True, 100),  # rank-2 obs
    "envpool:CartPole-v1": EnvInfo("envpool:CartPole-v1", 8, (4,), "float32", 2, False, False, 500,
                                   delayed_reset=True),
    "envpool:Pong-v5": EnvInfo("envpool:Pong-v5", 8, (4, 84, 84), "uint8", 6, True, False, 27000,
                               delayed_reset=True),
    "envpool:HalfCheetah-v4": EnvInfo("envpool:HalfCheetah-v4", 8, (17,), "float32", 0, False, False, 1000,
                                      action_shape=(6,), action_low=(-1.0,) * 6, action_high=(1.0,) * 6,
                                      delayed_reset=True),
    "pgx:connect_four": EnvInfo("pgx:connect_four", 8, (84,), "float32", 7, False, True, 42),
    "pgx:connect4": EnvInfo("pgx:connect4", 8, (84,), "float32", 7, False, True, 42),  # no such game
}
BASE = {"num_envs": 8, "rollout_length": 8, "total_steps": 256, "progress": False}
TWO = {"num_processes": 2}  # Machine facts of one process of a two-process run


def _config(**flags) -> Config:
    return Config(**{**BASE, **flags})


def _resumed(completed: int = 2, **saved):
    """Folder facts of a ``--resume``: a checkpoint after ``completed`` updates, written with the flags of
    the case changed by ``saved``."""
    def folder(cfg: Config) -> Folder:
        record = plan_lib.config_record(dataclasses.replace(cfg, resume=None, **saved))
        point = ResumePoint("runs/old", completed, {"config": record, "extra": {"completed": completed}})
        return Folder(logdir="runs/old", resume=point)
    return folder


def _new_folder(**facts):
    return lambda cfg: Folder(logdir="runs/new", **facts)


@pytest.fixture(scope="module")
def registered_conv_only():
    """A registered compressor stage written for conv nets only (it reads ``conv_0``)."""
    from accerl_jax.compressor import Compressor, register_compressor, unregister_compressor

    def conv_only(network, teacher_apply, arg):
        def init(params, key, obs=None):
            return params, params["params"]["conv_0"]
        return Compressor(init=init, compress=lambda params, state, obs: (params, state),
                          actor_apply=lambda apply: apply)

    register_compressor("convonly", conv_only)
    yield
    unregister_compressor("convonly")


# (id, flags, machine facts, folder facts (a function of the config) or None, [message parts])
REFUSALS = [
    # Numbers and names (accerl_jax.config.validate).
    ("lr-nan", dict(learning_rate=float("nan")), {}, None, ["bad --learning-rate nan", "finite number"]),
    ("lr-float32-overflow", dict(learning_rate=1e39), {}, None, ["bad --learning-rate 1e+39", "float32"]),
    ("seed-negative", dict(seed=-1), {}, None, ["bad --seed -1", "[0, 2^31)"]),
    ("num-envs-0", dict(num_envs=0), {}, None, ["bad --num-envs 0", "[1, 65536]"]),
    ("discount-above-1", dict(discount=1.5), {}, None, ["bad --discount 1.5", "[0, 1]"]),
    ("epochs-too-many", dict(epochs=1001), {}, None, ["bad --epochs 1001", "[1, 1000]"]),
    ("on-nan-unknown", dict(on_nan="explode"), {}, None, ["bad --on-nan 'explode'", "'stop' or 'skip'"]),
    ("actor-device-unknown", dict(actor_device="tpu"), {}, None, ["bad --actor-device 'tpu'", "'cpu-apart'"]),
    ("hidden-sizes-0", dict(hidden_sizes=(64, 0)), {}, None, ["bad --hidden-sizes 64 0", "widths in [1, 65536]"]),
    ("activation-unknown", dict(activation="gelu"), {}, None, ["bad --activation 'gelu'", "'relu' or 'tanh'"]),
    ("compile-cache-empty", dict(compile_cache=" "), {}, None, ["bad --compile-cache ' '", "'auto', 'off' or a folder"]),
    ("logdir-empty", dict(logdir=""), {}, None, ["bad --logdir ''", "empty"]),
    ("resume-and-overwrite", dict(resume="runs/old", overwrite=True), {}, None,
     ["bad --overwrite with --resume 'runs/old'", "choose one"]),
    ("wandb-not-installed", dict(wandb=True), {}, None, ["wandb"]),
    # Corrector and loss.
    ("corrector-unknown", dict(corrector="retrace2"), {}, None, ["bad --corrector 'retrace2'", "expected one of"]),
    ("loss-unknown", dict(loss="ppo"), {}, None, ["bad --loss 'ppo'", "actor-critic, appo, search or auto"]),
    ("epochs-without-appo", dict(loss="actor-critic", epochs=2), {}, None,
     ["bad --epochs 2 with --loss actor-critic:", "one gradient step per rollout"]),
    ("minibatches-with-retrace", dict(corrector="retrace", minibatches=2), {}, None,
     ["bad --minibatches 2 with --loss actor-critic (--loss auto with --corrector retrace)"]),
    ("appo-with-retrace", dict(loss="appo", corrector="retrace"), {}, None,
     ["bad --loss/--corrector combination", "loss 'appo' needs state-value advantages"]),
    ("retrace-continuous", dict(env="gymnax:Pendulum-v1", corrector="retrace"), {}, None,
     ["bad --corrector retrace for gymnax:Pendulum-v1", "continuous actions"]),
    # The loop.
    ("loop-unknown", dict(loop="podracer"), {}, None, ["bad --loop 'podracer'", "expected one of"]),
    ("auto-resume", dict(compressor="auto", resume="runs/old"), {}, _resumed(),
     ["bad --resume 'runs/old' with --compressor auto: that run ran auto's candidates", "auto_gate.resolved"]),
    ("auto-distill-async", dict(compressor="auto", distill_async=True), {}, None,
     ["bad --distill-async with --compressor auto"]),
    ("num-seeds-outside-anakin", dict(loop="sequential", num_seeds=2), {}, None,
     ["bad --num-seeds 2 with --loop sequential", "vmap of the Anakin loop"]),
    ("anakin-distill-async", dict(loop="anakin", compressor="distill:tiny", distill_async=True), {}, None,
     ["bad --distill-async with --loop anakin"]),
    ("anakin-auto-num-seeds", dict(compressor="auto", num_seeds=2, auto_min_actor_share=0.0), {}, None,
     ["bad --num-seeds 2 with --compressor auto (--auto-min-actor-share 0)", "one vmapped program"]),
    ("anakin-envpool-num-seeds", dict(env="envpool:CartPole-v1", loop="anakin", num_seeds=2), {}, None,
     ["bad --num-seeds 2 with --loop anakin and envpool:CartPole-v1", "vmap cannot copy"]),
    ("sweep-outside-anakin", dict(loop="sequential", sweep=("entropy_coef=0,0.01",)), {}, None,
     ["bad --sweep entropy_coef=0,0.01 with --loop sequential", "vmap of the Anakin loop"]),
    ("anakin-auto-sweep", dict(compressor="auto", sweep=("entropy_coef=0,0.01",), auto_min_actor_share=0.0), {},
     None, ["bad --sweep entropy_coef=0,0.01 with --compressor auto (--auto-min-actor-share 0)",
            "one vmapped program"]),
    ("auto-normalised-gate-off", dict(env="envpool:CartPole-v1", compressor="auto", normalize_rewards=True,
                                      auto_min_actor_share=0.0), {}, None,
     ["bad --normalize-rewards with --compressor auto (--auto-min-actor-share 0)",
      "do not carry normalisation statistics"]),
    ("anakin-envpool-sweep", dict(env="envpool:CartPole-v1", loop="anakin", sweep=("discount=0.9,0.99",)), {}, None,
     ["bad --sweep discount=0.9,0.99 with --loop anakin and envpool:CartPole-v1", "vmap cannot copy"]),
    # --sweep's items (accerl_jax.run.replicas.check_sweep, called by the plan's check_flags).
    ("sweep-without-values", dict(sweep=("learning_rate",)), {}, None,
     ["bad --sweep 'learning_rate'", "expected NAME=V1,V2,..."]),
    ("sweep-shape-setting", dict(sweep=("num_envs=8,16",)), {}, None,
     ["bad --sweep 'num_envs=8,16': 'num_envs' cannot be swept", "learning_rate", "change no shape"]),
    ("sweep-other-frameworks-name", dict(sweep=("lr=1e-3,2e-3",)), {}, None,
     ["'lr' cannot be swept (perhaps learning_rate)"]),
    ("sweep-name-twice", dict(sweep=("lambda=0.9,0.95", "lambda_=1")), {}, None,
     ["bad --sweep 'lambda_=1': lambda_ is swept twice"]),
    ("sweep-not-a-number", dict(sweep=("discount=0.9,high",)), {}, None,
     ["bad --sweep 'discount=0.9,high': 'high' is not a number"]),
    ("sweep-value-twice", dict(sweep=("discount=0.9,0.90",)), {}, None,
     ["bad --sweep 'discount=0.9,0.90': the value 0.90 is given twice"]),
    ("sweep-bad-value", dict(sweep=("discount=0.9,1.5",)), {}, None,
     ["bad --sweep discount=0.9,1.5: bad --discount 1.5", "[0, 1]"]),
    ("sweep-one-combination", dict(sweep=("discount=0.9",)), {}, None,
     ["bad --sweep discount=0.9: one combination", "at least two values"]),
    ("sweep-too-many-runs", dict(sweep=("discount=0.9,0.99",), num_seeds=4096), {}, None,
     ["bad --sweep discount=0.9,0.99 with --num-seeds 4096: 8192 runs", "at most 4096"]),
    ("sweep-search-discount", dict(agent="search", sweep=("discount=0.9,0.99",)), {}, None,
     ["bad --sweep discount=0.9,0.99 with --agent search", "a constant of its program"]),
    ("anakin-envpool-devices", dict(env="envpool:CartPole-v1", loop="anakin"), dict(local_devices=2), None,
     ["bad --loop anakin for envpool:CartPole-v1 on 2 local devices", "--loop sebulba"]),
    ("anakin-envpool-64-bit", dict(env="envpool:HalfCheetah-v4", loop="anakin"), {}, None,
     ["bad --loop anakin for envpool:HalfCheetah-v4", "64-bit arrays", "--loop sebulba"]),
    ("sebulba-flag-elsewhere", dict(actor_threads=2), {}, None,
     ["bad --actor-threads 2 with --loop anakin", "a Sebulba setting"]),
    ("sebulba-gymnax", dict(loop="sebulba"), {}, None, ["bad --loop sebulba for --env 'gymnax:CartPole-v1'"]),
    ("sebulba-policy-lag", dict(env="envpool:CartPole-v1", policy_lag=1), {}, None,
     ["bad --policy-lag 1 with --loop sebulba"]),
    ("sebulba-compress-every", dict(env="envpool:CartPole-v1", compress_every=2), {}, None,
     ["bad --compress-every 2 with --loop sebulba"]),
    ("sebulba-threads-split", dict(env="envpool:CartPole-v1", actor_threads=3), {}, None,
     ["bad --num-envs 8: must be a multiple of --actor-threads 3"]),
    ("sebulba-actor-batch", dict(env="envpool:CartPole-v1", actor_threads=2, actor_batch=5), {}, None,
     ["bad --actor-batch 5: at most the 4 environments of each actor thread"]),
    # Several processes.
    ("multihost-sebulba-auto", dict(env="envpool:CartPole-v1", compressor="auto", loop="sebulba",
                                    auto_min_actor_share=0.0), TWO, None,
     ["bad --compressor auto with --loop sebulba and several processes (--auto-min-actor-share 0)",
      "use a fixed --compressor"]),
    ("multihost-envpool-seed", dict(env="envpool:CartPole-v1", seed=10**9), TWO, None, ["--seed"]),
    ("multihost-anakin-envpool", dict(env="envpool:CartPole-v1", loop="anakin"), TWO, None,
     ["bad --loop anakin for envpool:CartPole-v1 with several processes", "--loop sequential"]),
    ("multihost-num-seeds", dict(num_seeds=2), TWO, None,
     ["bad --num-seeds 2 with several processes", "one multi-host run at a time"]),
    ("multihost-sweep", dict(sweep=("learning_rate=1e-3,2e-3",)), TWO, None,
     ["bad --sweep learning_rate=1e-3,2e-3 with several processes", "sweep on one process"]),
    ("multihost-resume-sequential", dict(loop="sequential", resume="runs/old"), TWO, _resumed(num_envs=16),
     ["bad --resume 'runs/old' with several processes and --loop sequential"]),
    # The conv net on CPU runs the sequential loop (the loop is chosen with the network): not resumable
    # with several processes.
    ("multihost-resume-cnn-on-cpu", dict(env="gymnax:Breakout-MinAtar", resume="runs/old"), TWO,
     _resumed(num_envs=16),
     ["bad --resume 'runs/old' with several processes and --loop sequential"]),
    # Device layout.
    ("cpu-apart-one-device", dict(actor_device="cpu-apart"), {}, None,
     ["bad --actor-device cpu-apart on 1 CPU device", "xla_force_host_platform_device_count"]),
    ("num-envs-over-devices", dict(num_envs=3), dict(local_devices=2), None,
     ["bad --num-envs 3: must be a multiple of the 2 local devices"]),
    ("num-envs-over-learner-devices", dict(num_envs=3, actor_device="cpu-apart"), dict(local_devices=3), None,
     ["bad --num-envs 3: must be a multiple of the 2 local devices of the learner (cpu:0 is the actor's)"]),
    ("num-envs-over-minibatches", dict(num_envs=6, minibatches=4), dict(local_devices=2), None,
     ["bad --num-envs 6: must be a multiple of --minibatches 4 x 2 devices = 8"]),
    ("num-envs-over-transition-minibatches", dict(num_envs=6, rollout_length=3, minibatches=4,
                                                   minibatch_unit="transitions", loss="appo"), dict(local_devices=2), None,
     ["bad --num-envs 6 with --rollout-length 3: their 18 transitions must be a multiple of --minibatches 4 x 2 "
      "devices = 8"]),
    ("total-steps-too-many-updates", dict(total_steps=2**31 * 64, num_envs=8, rollout_length=8), {}, None,
     ["bad --total-steps", "more than 2147483647 updates"]),
    # The network.
    ("obs-rank-2", dict(env="gymnax:Matrix-v0"), {}, None, ["bad --env 'gymnax:Matrix-v0'", "expected rank 1 or 3"]),
    ("cnn-hidden-sizes-length", dict(env="gymnax:Breakout-MinAtar", hidden_sizes=(64, 64)), {}, None,
     ["bad --hidden-sizes 64 64 for gymnax:Breakout-MinAtar (the cnn network)", "expected 4 numbers"]),
    ("minatar-hidden-sizes-length", dict(env="gymnax:Breakout-MinAtar", network="minatar", hidden_sizes=(16,)), {},
     None, ["bad --hidden-sizes 16 for gymnax:Breakout-MinAtar (the minatar network)", "expected 2 numbers"]),
    ("activation-on-cnn", dict(env="gymnax:Breakout-MinAtar", activation="tanh"), {}, None,
     ["bad --activation tanh for gymnax:Breakout-MinAtar (the cnn network)", "conv networks use ReLU"]),
    ("network-unknown", dict(network="resnet"), {}, None, ["bad --network 'resnet'", "'minatar'", "'impala'"]),
    ("impala-hidden-sizes-length", dict(env="gymnax:Breakout-MinAtar", network="impala", hidden_sizes=(16,)), {},
     None, ["bad --hidden-sizes 16 for gymnax:Breakout-MinAtar (the impala network)",
            "expected 2 or more numbers, each residual stack's channel count then the dense size, e.g. 16 32 32 256"]),
    ("network-conv-on-vectors", dict(network="minatar"), {}, None,
     ["bad --network 'minatar' for gymnax:CartPole-v1", "takes image observations", "use mlp"]),
    ("network-cnn-continuous", dict(env="gymnax:Pendulum-v1", network="cnn"), {}, None,
     ["bad --network 'cnn' for gymnax:Pendulum-v1", "use mlp"]),
    ("normalize-with-search", dict(normalize_rewards=True, agent="search"), {}, None,
     ["bad --normalize-rewards with --agent search", "by the sequential and Sebulba loops, with the actor-critic agent"]),
    ("normalize-with-auto", dict(normalize_observations=True, compressor="auto", auto_min_actor_share=0.0), {},
     None, ["bad --normalize-observations with --compressor auto (--auto-min-actor-share 0)",
            "do not carry normalisation statistics"]),
    ("minibatch-unit-unknown", dict(minibatch_unit="steps"), {}, None,
     ["bad --minibatch-unit 'steps'", "'columns' or 'transitions'"]),
    ("minibatch-unit-without-appo", dict(minibatch_unit="transitions", loss="actor-critic"), {}, None,
     ["bad --minibatch-unit transitions with --loss actor-critic", "use --loss appo"]),
    ("normalize-advantages-without-appo", dict(normalize_advantages=True, loss="actor-critic"), {}, None,
     ["bad --normalize-advantages with --loss actor-critic", "use --loss appo"]),
    ("clip-value-without-appo", dict(clip_value=True, loss="actor-critic"), {}, None,
     ["bad --clip-value with --loss actor-critic", "use --loss appo"]),
    # The run folder.
    ("logdir-is-a-file", {}, {}, _new_folder(is_file=True), ["bad --logdir 'runs/new': it is a file"]),
    ("logdir-holds-a-run", {}, {}, _new_folder(taken=("checkpoints", "metrics.csv")),
     ["bad --logdir 'runs/new': it already holds a run (checkpoints, metrics.csv)", "--resume", "--overwrite"]),
    ("resume-other-env", dict(resume="runs/old"), {}, _resumed(env="gymnax:Acrobot-v1"),
     ["bad --resume 'runs/old': checkpoint 2 was written by a different configuration",
      "--env 'gymnax:Acrobot-v1' (checkpoint) vs 'gymnax:CartPole-v1' (now)"]),
    ("resume-other-global-batch", dict(resume="runs/old", num_envs=4), {}, _resumed(num_envs=8),
     ["different configuration", "8 x 1 process = 8 (checkpoint) vs 4 x 1 process = 4 (now)", "give --num-envs 8"]),
    ("resume-budget-done", dict(resume="runs/old", total_steps=128), {}, _resumed(completed=2),
     ["bad --resume 'runs/old': that run already finished all 2 updates of --total-steps 128",
      "--total-steps 192 or more extends it"]),
    ("resume-smaller-budget", dict(resume="runs/old", total_steps=64), {}, _resumed(completed=2),
     ["bad --total-steps 64 with --resume 'runs/old'", "a budget of 1 update, fewer than the 2",
      "--total-steps 192 or more"]),
    # The compressor.
    ("compressor-malformed", dict(compressor="mask"), {}, None, ["bad --compressor 'mask'", "missing value"]),
    ("compressor-unknown", dict(compressor="zip:3"), {}, None, ["unknown kind 'zip'"]),
    ("compressor-chain-order", dict(compressor="fakequant:8+distill:small"), {}, None,
     ["'distill:small' cannot follow 'fakequant:8'"]),
    ("distill-async-without-distill", dict(compressor="int8", distill_async=True, loop="sequential"), {}, None,
     ["bad --distill-async with --compressor 'int8'", "no distill stage"]),
    ("auto-candidates-self", dict(compressor="auto", auto_candidates="none,auto"), {}, None,
     ["bad --auto-candidates 'none,auto'", "'auto' cannot be its own candidate"]),
    ("auto-candidate-bad", dict(compressor="auto", auto_candidates="none,zip:3"), {}, None,
     ["bad --compressor 'zip:3'", "unknown kind 'zip'"]),
    # The search agent (--agent search, accerl_jax.search).
    ("agent-unknown", dict(agent="mcts"), {}, None, ["bad --agent 'mcts'", "'actor-critic' or 'search'"]),
    ("num-simulations-0", dict(agent="search", num_simulations=0), {}, None,
     ["bad --num-simulations 0", "[1, 4096]"]),
    ("max-depth-0", dict(agent="search", max_depth=0), {}, None, ["bad --max-depth 0", "or unset"]),
    ("gumbel-scale-negative", dict(agent="search", gumbel_scale=-1.0), {}, None, ["bad --gumbel-scale -1.0", ">= 0"]),
    ("distill-children-negative", dict(agent="search", compressor="distill:small", distill_children=-1), {}, None,
     ["bad --distill-children -1", "[0, 65536]"]),
    ("distill-children-without-search", dict(compressor="distill:small", distill_children=8), {}, None,
     ["bad --distill-children 8", "--agent actor-critic has no search tree"]),
    ("distill-children-auto", dict(agent="search", compressor="auto", distill_children=8), {}, None,
     ["bad --distill-children 8", "--compressor auto picks its compressor itself"]),
    ("learner-children-without-search", dict(compressor="int8", learner_children=True), {}, None,
     ["bad --learner-children", "--agent actor-critic has no search tree"]),
    ("learner-children-none", dict(agent="search", compressor="none", learner_children=True), {}, None,
     ["bad --learner-children", "every node is the learner's already"]),
    ("learner-children-auto", dict(agent="search", compressor="auto", learner_children=True), {}, None,
     ["bad --learner-children", "--compressor auto picks its compressor itself"]),
    ("learner-children-normalized", dict(agent="search", compressor="int8", learner_children=True,
                                         normalize_observations=True), {}, None,
     ["bad --learner-children", "normalised for the compressed network only"]),
    ("distill-minibatches-zero", dict(compressor="distill:small", distill_minibatches=0), {}, None,
     ["bad --distill-minibatches 0", "[1, 65536]"]),
    ("distill-minibatches-auto", dict(compressor="auto", distill_minibatches=4), {}, None,
     ["bad --distill-minibatches 4 with --compressor auto", "--compressor distill:small"]),
    ("distill-minibatches-over-rows", dict(compressor="distill:small", distill_minibatches=999, num_envs=8,
                                           rollout_length=16), {}, None,
     ["bad --distill-minibatches 999", "128 rows", "at most 128"]),
    ("distill-sibling-coef-negative", dict(agent="search", distill_sibling_coef=-1.0), {}, None,
     ["bad --distill-sibling-coef -1.0", ">= 0"]),
    ("search-envpool", dict(agent="search", env="envpool:CartPole-v1"), {}, None,
     ["bad --env 'envpool:CartPole-v1' with --agent search", "gymnax"]),
    ("pgx-unknown-game", dict(agent="search", env="pgx:connect4"), {}, None,
     ["bad --env 'pgx:connect4'", "unknown pgx game 'connect4'", "connect_four, gardner_chess"]),
    ("pgx-actor-critic", dict(env="pgx:connect_four"), {}, None,
     ["bad --agent actor-critic for --env pgx:connect_four", "use --agent search"]),
    ("search-continuous", dict(agent="search", env="gymnax:Pendulum-v1"), {}, None,
     ["bad --agent search for gymnax:Pendulum-v1", "discrete actions"]),
    ("search-sequential", dict(agent="search", loop="sequential"), {}, None,
     ["bad --loop sequential with --agent search", "Anakin loop only"]),
    ("search-retrace", dict(agent="search", corrector="retrace"), {}, None, ["bad --corrector retrace with --agent search"]),
    ("search-loss-appo", dict(agent="search", loss="appo"), {}, None, ["bad --loss 'appo' with --agent search"]),
    ("loss-search-without-search", dict(loss="search"), {}, None,
     ["bad --loss 'search' with --agent actor-critic", "--loss auto"]),
    ("search-epochs", dict(agent="search", epochs=2), {}, None, ["bad --epochs 2 with --loss search (--agent search):"]),
    ("compressor-does-not-fit", dict(compressor="convonly"), {}, None,
     ["bad --compressor 'convonly' for the MLP categorical network", "conv_0"]),
    ("auto-candidate-does-not-fit", dict(compressor="auto", auto_candidates="none,convonly"), {}, None,
     ["bad --compressor 'convonly' for the MLP categorical network"]),
]


@pytest.mark.parametrize("case, flags, machine, folder, parts", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_every_refusal_is_the_plans(request, case, flags, machine, folder, parts):
    if case == "wandb-not-installed" and importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    message = str(_refuse(request, case, flags, machine, folder))
    assert "\n" not in message
    for part in parts:
        assert part in message, (part, message)


def _refuse(request, case, flags, machine, folder) -> ConfigError:
    """Plan one row of :data:`REFUSALS`; the ConfigError it raises."""
    if "convonly" in str(flags):
        request.getfixturevalue("registered_conv_only")
    cfg = _config(**flags)
    with pytest.raises(ConfigError) as err:
        make_plan(cfg, dataclasses.replace(ENVS[cfg.env], num_envs=cfg.num_envs), Machine(**machine),
                  folder(cfg) if folder else None)
    return err.value


def test_every_refusal_site_has_a_row(request):
    """Every ``raise ConfigError`` of the plan (accerl_jax/run/plan.py, and the numeric checks of
    :func:`accerl_jax.config.validate` that it calls) runs for some row of :data:`REFUSALS`: a new refusal
    needs a row. Lines are recorded with a tracer on those two files' frames only."""
    import ast
    import sys

    from accerl_jax import config as config_lib

    def raise_lines(module, within=None):
        tree = ast.parse(open(module.__file__).read())
        nodes = [n for n in ast.walk(tree) if within is None or (isinstance(n, ast.FunctionDef) and n.name == within)]
        return {r.lineno for node in nodes for r in ast.walk(node) if isinstance(r, ast.Raise)
                and isinstance(r.exc, ast.Call) and getattr(r.exc.func, "id", None) == "ConfigError"}

    files = {plan_lib.__file__: raise_lines(plan_lib), config_lib.__file__: raise_lines(config_lib, "validate")}
    hit = set()

    def tracer(frame, event, arg):
        if frame.f_code.co_filename not in files:
            return None

        def local(frame, event, arg):
            if event == "line":
                hit.add((frame.f_code.co_filename, frame.f_lineno))
            return local
        return local

    sys.settrace(tracer)
    try:
        for case, flags, machine, folder, _ in REFUSALS:
            if case != "wandb-not-installed":
                _refuse(request, case, flags, machine, folder)
    finally:
        sys.settrace(None)
    missed = sorted((f.rsplit("/", 1)[-1], line) for f, lines in files.items() for line in lines if (f, line) not in hit)
    assert not missed, missed


# (id, flags, env, machine facts, expected loop, expected local devices of the learner, first device)
DECISIONS = [
    ("gymnax-anakin", {}, {}, "anakin", 1, 0),
    ("envpool-sebulba", dict(env="envpool:Pong-v5"), {}, "sebulba", 1, 0),
    ("envpool-multihost-sebulba", dict(env="envpool:CartPole-v1"), TWO, "sebulba", 1, 0),
    ("distill-async-sequential", dict(compressor="distill:tiny", distill_async=True), {}, "sequential", 1, 0),
    ("cnn-on-cpu-sequential", dict(env="gymnax:Breakout-MinAtar"), {}, "sequential", 1, 0),
    ("cnn-on-gpu-anakin", dict(env="gymnax:Breakout-MinAtar"), dict(backend="gpu"), "anakin", 1, 0),
    ("cnn-on-cpu-seeds-anakin", dict(env="gymnax:Breakout-MinAtar", num_seeds=2), {}, "anakin", 1, 0),
    ("cnn-on-cpu-asked-anakin", dict(env="gymnax:Breakout-MinAtar", loop="anakin"), {}, "anakin", 1, 0),
    ("search-cnn-on-cpu-anakin", dict(env="gymnax:Breakout-MinAtar", agent="search"), {}, "anakin", 1, 0),
    ("cpu-apart", dict(env="envpool:Pong-v5", actor_device="cpu-apart"), dict(local_devices=3), "sebulba", 2, 1),
    ("cpu-apart-on-gpu", dict(env="envpool:Pong-v5", actor_device="cpu-apart"),
     dict(local_devices=2, backend="gpu"), "sebulba", 2, 0),
]


@pytest.mark.parametrize("case, flags, machine, loop, devices, first", DECISIONS, ids=[c[0] for c in DECISIONS])
def test_the_plan_decides_the_loop_and_layout_once(case, flags, machine, loop, devices, first):
    cfg = _config(**flags)
    plan = make_plan(cfg, dataclasses.replace(ENVS[cfg.env], num_envs=cfg.num_envs), Machine(**machine))
    assert (plan.loop, plan.local_devices, plan.first_learner_device) == (loop, devices, first)
    n_proc = machine.get("num_processes", 1)
    assert plan.steps_per_update == cfg.num_envs * cfg.rollout_length * n_proc
    assert plan.num_updates == max(1, cfg.total_steps // plan.steps_per_update)


def test_the_plan_records_the_folder_and_the_compressors_capabilities():
    cfg = _config(compressor="distill:small+int8", resume="runs/old", total_steps=512)
    folder = _resumed(completed=2)(cfg)
    plan = make_plan(cfg, ENVS[cfg.env], Machine(), folder)
    assert plan.takes_teacher and not plan.auto  # a distill stage takes the learner's outputs
    assert (plan.logdir, plan.resume) == ("runs/old", folder.resume)
    auto = make_plan(_config(compressor="auto"), ENVS["gymnax:CartPole-v1"], Machine(), _new_folder()(cfg))
    assert auto.auto and not auto.takes_teacher and auto.resume is None and auto.logdir == "runs/new"
    # The resumed run may extend its budget and change its cadence: no refusal.
    make_plan(dataclasses.replace(cfg, total_steps=10**6, log_every=1), ENVS[cfg.env], Machine(), folder)


def test_check_config_is_the_plan_without_the_environment():
    """What multi-host processes check before they join: the flags and the loop they choose."""
    assert plan_lib.check_config(_config(env="envpool:CartPole-v1"), num_processes=2) == "sebulba"
    assert plan_lib.check_config(_config(env="gymnax:Breakout-MinAtar")) == "anakin"  # family not known yet
    with pytest.raises(ConfigError, match="bad --num-seeds 2 with several processes"):
        plan_lib.check_config(_config(num_seeds=2), num_processes=2)


def test_transition_minibatches_need_only_the_transitions_to_split_over_the_devices():
    """--minibatch-unit transitions draws single steps: 2 envs x 8 steps split into 4 minibatches over 2
    devices (16 = 4 x 2 x 2), which whole columns (2 envs) could not; the learner update takes it too."""
    cfg = _config(num_envs=2, rollout_length=8, minibatches=4, minibatch_unit="transitions", loss="appo")
    plan = make_plan(cfg, dataclasses.replace(ENVS[cfg.env], num_envs=2), Machine(local_devices=2))
    assert plan.loss.minibatches == 4 and plan.loss.minibatch_unit == "transitions"
    from accerl_jax.learner import batch_conflict

    assert batch_conflict(2, 2, 4) == "minibatches" and batch_conflict(2, 2, 4, rollout_length=8) is None
    assert batch_conflict(3, 2, 4, rollout_length=8) == "devices"
