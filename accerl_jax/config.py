"""The training configuration: one typed dataclass whose field docstrings are the CLI's ``--help``."""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Annotated, Optional

import numpy as np
import tyro


# --actor-device values (Config.actor_device).
ACTOR_DEVICES = ("cpu", "learner", "cpu-apart")
# --agent values (Config.agent).
AGENTS = ("actor-critic", "search")
# --network's choices: 'auto' (the observations' default family) or a family (accerl_jax.networks.FAMILIES).
NETWORKS = ("auto", "mlp", "cnn", "minatar", "impala")
SEARCH_TARGETS = ("search", "learner")  # --search-target (accerl_jax.search.targets)
ACTIVATIONS = ("relu", "tanh")  # --activation: the MLP hidden layers' nonlinearity (accerl_jax.networks)
MINIBATCH_UNITS = ("columns", "transitions")  # --minibatch-unit (accerl_jax.learner.LossConfig)
# --env pgx:<game>: the pgx games (https://github.com/sotetsuk/pgx) the search agent plays by self-play:
# two-player, zero-sum, perfect information, deterministic (accerl_jax.envs.pgx_env).
PGX_GAMES = ("animal_shogi", "chess", "connect_four", "gardner_chess", "go_9x9", "go_19x19", "hex", "othello",
             "shogi", "tic_tac_toe")


class ConfigError(ValueError):
    """A setting the user chose is not accepted; the message names it and what would be. CLI exit code 2."""


@dataclasses.dataclass
class Config:
    """Train an actor-critic (IMPALA, Retrace or APPO) or a search agent (--agent search) whose actors run a
    compressed copy of the learner's policy (AcceRL)."""

    preset: Optional[str] = None
    """Start from named settings for an environment family: 'classic' (gymnax classic control; the
    defaults), 'minatar' (gymnax MinAtar), 'atari' (envpool Atari, PPO), 'mujoco' (envpool MuJoCo,
    APPO), 'search' (a search agent on CartPole), 'connect4' (Connect Four by self-play); see
    accerl_jax/tools/presets.py for each one's values and where they come from. Other flags override it."""
    config: Optional[str] = None
    """A YAML or TOML file of settings (these flags' names, e.g. 'num_envs: 64'), applied after --preset;
    flags on the command line override it."""
    env: str = "gymnax:CartPole-v1"
    """Environment: 'gymnax:<id>' (e.g. gymnax:CartPole-v1, gymnax:Breakout-MinAtar), 'envpool:<id>'
    (e.g. envpool:Pong-v5, envpool:Breakout-v5, envpool:CartPole-v1) or, with --agent search, a two-player
    board game by self-play, 'pgx:<game>' (e.g. pgx:connect_four, pgx:tic_tac_toe)."""
    compressor: str = "auto"
    """Actor policy compressor: 'auto' (default; below), 'none' (the learner's own policy);
    'distill:<tiny|small|half|mlp>' (distillation into a smaller student; mlp: an MLP on an image network's
    flattened frames); 'prune:<fraction>' (structured
    pruning: a smaller network), 'prune:<f>+distill' (pruned, then
    fine-tuned by distillation); 'mask:<sparsity>[,global][,ramp=<updates>]' (magnitude mask, per layer or
    global, gradual); quantizers 'int8' (real int8 via qwix; 'int8:all' also the heads), 'bf16',
    'fakequant:<bits 2-8>'. Chain with '+': network stage, then mask, then one quantizer, e.g.
    'distill:small+int8', 'prune:0.5+int8', 'mask:0.9+fakequant:8'. 'auto': first counts the actor's
    share of an update by FLOPs; under --auto-min-actor-share the run is the 'none' run (the model-free
    runs here: a few percent, where no compressor can pay; README "Where compression pays"); else a search
    run picks the fastest of --auto-candidates before training and a model-free run chooses among them
    while training, the fastest whose KL from the learner stays <= --max-actor-kl."""
    max_actor_kl: float = 0.05
    """--compressor auto: the bound on KL(π_learner ‖ π_actor) in nats; auto runs the fastest candidate
    measured under it (the most faithful if none is), and re-evaluates when the running one exceeds it."""
    auto_candidates: str = "none,int8,distill:tiny,distill:small,distill:small+int8,prune:0.5+distill"
    """--compressor auto: the candidate compressors, comma-separated --compressor specs; the first runs
    until the first evaluation (at the start in the Anakin loop, after update 1 in the sequential one)."""
    auto_every: int = 100
    """--compressor auto: re-evaluate at least every this many learner updates (only the candidates
    that can change the choice: faster than the running one if it is within --max-actor-kl)."""
    auto_max_clip: float = 0.2
    """--compressor auto: re-evaluate when more than this fraction of the rollout's importance ratios ρ
    exceed 1.1 × --clip-rho-threshold (checked every 10 updates, with the running policy's KL)."""
    auto_min_actor_share: float = 0.5
    """--compressor auto: compress only where the uncompressed actor is at least this fraction of an
    update by FLOPs (counted before training: actor rollout / (actor rollout + learner update)); below it
    auto keeps 'none' for the whole run. That fraction is the most any compressor can save; with students
    1.4-4.8x faster on CPU, a share under 0.5 caps the saving below ~0.4, and auto's candidate
    measurements and divergence checks cost more than that on small runs. 0: always run auto's candidates."""
    corrector: str = "vtrace"
    """Off-policy correction: 'vtrace' (IMPALA), 'retrace' (Q critic with Retrace(λ) targets; discrete
    actions only), 'is' (truncated per-decision importance sampling, ratio clipped at --clip-rho-threshold)
    or 'none' (no correction, ρ = 1). --agent search takes none: it trains on its search's own targets
    (the summary's corrector is null)."""
    loss: str = "auto"
    """Learner loss: 'actor-critic' (IMPALA's; with --corrector retrace, the Retrace actor-critic with a
    Q head), 'appo' (PPO's clipped surrogate on the corrector's advantages, --epochs passes of
    --minibatches steps per rollout; not with retrace) or 'auto' (default): 'appo', or 'actor-critic' with
    --corrector retrace."""
    ppo_clip: float = 0.2
    """APPO: the surrogate clips the ratio π/π_old to [1 - ε, 1 + ε]."""
    normalize_advantages: bool = False
    """APPO: normalise the advantages of each minibatch to mean 0 and std 1 (over the whole minibatch, on
    every device count), as PureJaxRL's and CleanRL's PPO (CleanRL's norm_adv)."""
    clip_value: bool = False
    """APPO: clip the value loss as PPO's implementations do (CleanRL's clip_vloss, PureJaxRL's): the larger
    of the squared errors of the new value and of the old value moved at most --ppo-clip towards it."""
    minibatch_unit: str = "columns"
    """APPO: what a minibatch draws: 'columns' (whole trajectories of --rollout-length steps) or
    'transitions' (single steps shuffled over the whole batch, as PureJaxRL's and CleanRL's PPO)."""
    epochs: int = 0
    """APPO: passes over each rollout; 0 (default): 8 with appo, 1 with actor-critic (which takes only 1)."""
    minibatches: int = 1
    """APPO: minibatches (groups of whole trajectories) per pass; num-envs must be a multiple of
    minibatches × devices (1 with --loss actor-critic)."""
    loop: str = "auto"
    """Execution style: 'anakin' (rollout, correction, learner update and re-compression fused into one
    jitted lax.scan over --log-every updates; gymnax, or envpool through its XLA interface when asked
    for); 'sequential' (actor, learner and compressor as separate timed jitted calls); 'sebulba'
    (envpool only: actor threads on async envpool, learner and compressor in their own threads, bounded
    queues between them); 'auto' picks the default for the env (anakin for gymnax MLP nets, sebulba for
    envpool, sequential on CPU for conv nets such as MinAtar's, whose gradient steps XLA:CPU runs much
    slower inside a fused scan: docs/DESIGN.md)."""
    compress_every: int = 1
    """Anakin and sequential loops: re-compress the actor's policy every this many learner updates (between refreshes the actor keeps
    the last compressed policy, one more version behind per update; the Monitor logs the lag as
    policy_lag_versions)."""
    num_seeds: int = 1
    """Anakin only: train this many independent seeds (--seed, --seed + 1, ...) at once with vmap; each
    gets its own <logdir>/seed<k>/ with summary.json and metrics.csv."""
    sweep: tuple[str, ...] = ()
    """Anakin only: train every combination of these values at once, as one vmapped program (each
    combination x --num-seeds seeds): items NAME=V1,V2,... of the learner's numbers that change no shape
    (learning_rate, max_grad_norm, discount, lambda_, clip_rho_threshold, clip_pg_rho_threshold, value_coef,
    entropy_coef, ppo_clip); several items form a grid, e.g. --sweep learning_rate=1e-3,3e-3
    entropy_coef=0,0.01. Each run gets its own <logdir>/<name>=<value>-seed<j>/ with summary.json and
    metrics.csv; the run's summary lists them."""
    actor_threads: int = 1
    """Sebulba: actor threads, each stepping its own envpool of num-envs / actor-threads environments
    (num-envs must be a multiple of it); the learner takes one rollout from each per update."""
    actor_batch: int = 0
    """Sebulba: environments per envpool recv in each actor thread (envpool's batch_size; 1 to that
    thread's environments); the policy acts on these while envpool steps the others. 0: half of them."""
    actor_device: str = "cpu"
    """Sebulba: where the actor threads run the compressed policy: 'cpu' (the host), 'learner' (the
    learner's first device, e.g. the GPU), or 'cpu-apart': the host, kept off the learner's devices: where
    those are the host CPU's own (XLA:CPU with N >= 2 forced devices,
    XLA_FLAGS=--xla_force_host_platform_device_count=N), the actor takes cpu:0 and the learner's mesh the
    other N - 1, a stand-in for CPU actors beside an accelerator learner (the devices share the same
    cores); on a GPU/TPU machine the same as 'cpu'."""
    queue_size: int = 2
    """Sebulba: rollouts the bounded queue between the actor threads and the learner holds; the actor's
    policy lags the learner by at most queue-size + 4 versions (logged as policy_lag_versions)."""
    agent: str = "actor-critic"
    """The agent family: 'actor-critic' (default: IMPALA, Retrace or APPO, see --loss) or 'search' (Gumbel
    MuZero search with DeepMind's mctx at every env step, run with the actor's compressed network and the
    environment's own step as the model; the learner trains on the search's action weights and n-step
    value targets; gymnax envs with discrete actions, or pgx two-player games by self-play with game-outcome
    value targets; Anakin loop)."""
    num_simulations: int = 16
    """--agent search: simulations per search (each one network evaluation; S + 1 per env step)."""
    max_depth: Optional[int] = None
    """--agent search: the deepest a simulation goes below the root."""
    max_num_considered_actions: int = 16
    """--agent search: Gumbel MuZero's m, the actions sampled at the root (without replacement) and
    narrowed by sequential halving."""
    gumbel_scale: float = 1.0
    """--agent search: scale of the Gumbel noise at the root (0: a deterministic search)."""
    search_target: str = "search"
    """--agent search: the policy target, 'search' (the actors' search's action weights, whose prior and
    root value are the compressed network's) or 'learner' (the same Gumbel MuZero improved policy
    recomputed at learner time from the search's root Q-values and visit counts with the learner's own
    prior and value)."""
    learner_children: bool = False
    """--agent search with a compressor: the learner's uncompressed network evaluates each search root's
    children (every action stepped with the env's model before the search: A forward passes of it per env
    step), the compressed network the root and every node below the children. The search compares the
    root's actions by r + γ v(child), whose differences a small student's value gets wrong (docs/RESULTS.md,
    "Breakout-MinAtar past 150k steps"); the actor carries the learner's parameters beside the compressed
    ones. Not with --compressor none or auto, nor --normalize-observations."""
    n_step: int = 10
    """--agent search: horizon of the value targets, n-step returns bootstrapped from the learner's value
    (cut at a termination, bootstrapped at a truncation and at the rollout's end)."""
    policy_lag: int = 0
    """Extra staleness of the actor: it runs the compressed parameters made this many learner updates
    before the latest (0: those made after the previous update)."""
    total_steps: int = 200_000
    """Training budget in agent steps, summed over all environments; rounded down to whole rollouts
    (num-envs × rollout-length steps each), at least one."""
    num_envs: int = 16
    """Environments stepped together (B); a multiple of the number of learner devices."""
    rollout_length: int = 16
    """Agent steps per environment per rollout (T)."""
    seed: int = 0
    """Random seed (network init, action sampling, APPO's minibatch order, environments: envpool env g of the
    run's G is seeded seed x G + g, so distinct seeds share no env seed; (seed + 1) x G must stay <= 2^31)."""
    reward_clip: bool = True
    """Atari (envpool's Atari tasks, e.g. envpool:Pong-v5): the learner trains on the sign of each reward,
    as IMPALA, CleanRL and Sample Factory do (rewards clipped to [-1, 1]); episode returns in every log and
    the summary stay the raw game score. --no-reward-clip trains on the raw score. Other environments'
    rewards are never clipped."""
    normalize_observations: bool = False
    """Normalise the network's observations by their running mean and variance (count, mean and M2 combined
    over devices by Chan et al.'s rule), clipped to [-10, 10], as gym's NormalizeObservation and CleanRL;
    each rollout is normalised with the statistics it started with (the actor and the learner see the same
    inputs), which it then updates. Saved in checkpoints; evaluate and export apply them. The Anakin loop
    with gymnax envs, the sequential loop and the Sebulba loop (whose actors get the statistics with each
    published policy)."""
    normalize_rewards: bool = False
    """Scale the learner's rewards by the running standard deviation of each environment's discounted
    return (reset at every episode end), clipped to [-10, 10], as gym's NormalizeReward and CleanRL; episode
    returns in the logs stay raw. The Anakin loop with gymnax envs, the sequential and the Sebulba loops."""
    logdir: Optional[str] = None
    """Output folder for summary.json, metrics.csv, metrics.jsonl, curves.png and TensorBoard events (the default
    folder's name has ':' and '+' written as '_')."""
    learning_rate: float = 1e-3
    """Adam learning rate of the learner, linearly annealed to 0 over the budget (see --anneal-lr)."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 over the budget; --no-anneal-lr keeps it constant."""
    network: str = "auto"
    """The learner's network (the actors' before compression): 'auto' (default: 'mlp' for vector
    observations, 'cnn' for images), 'mlp' (separate policy and value MLPs; images are flattened, uint8
    scaled by 1/255), 'cnn' (the Nature-DQN torso, Mnih et al. 2015), 'minatar' (the MinAtar paper's net,
    Young & Tian 2019: one 3x3 conv, dense 128), 'impala' (IMPALA's 15-layer ResNet, Espeholt et al.
    2018). cnn, minatar and impala need image observations. A resumed run keeps its network."""
    hidden_sizes: tuple[int, ...] = ()
    """Hidden widths of the learner's network, per --network: mlp, any number of layers (e.g. --hidden-sizes
    64 64); cnn, four numbers (three conv channel counts, then the dense size); minatar, two (the conv's
    channels, then the dense size); impala, two or more (each residual stack's channels, then the dense
    size). Unset (empty): the network's own widths (shown as the default)."""
    activation: str = "relu"
    """Nonlinearity of the MLP's hidden layers (--network mlp, vector observations' default): 'relu' (default)
    or 'tanh' (CleanRL's and PureJaxRL's PPO agents, and the mujoco preset: on Hopper-v4 it trained to
    higher returns; docs/RESULTS.md, "MuJoCo"). Conv networks keep ReLU."""
    discount: float = 0.99
    """Discount γ per agent step."""
    # The flag is --lambda (accerl_jax.tools.cli also accepts the field's own name, --lambda_, without listing it).
    lambda_: Annotated[float, tyro.conf.arg(name="lambda")] = 1.0
    """Trace λ of the corrector (V-trace, Retrace, IS); GAE's λ with --loss appo. Settings files take lambda or
    lambda_."""
    clip_rho_threshold: float = 1.0
    """ρ̄: clip of the importance ratio in the value targets (V-trace and IS)."""
    clip_pg_rho_threshold: float = 1.0
    """Clip of the importance ratio in the policy-gradient advantage."""
    entropy_coef: float = 0.01
    """Entropy bonus weight."""
    value_coef: float = 0.5
    """Value loss weight."""
    max_grad_norm: float = 40.0
    """Global gradient-norm clip of the learner."""
    distill_steps: int = 4
    """Distillation gradient steps per learner update (distill compressors)."""
    distill_learning_rate: float = 1e-3
    """Adam learning rate of the distillation student."""
    distill_reuse_teacher: bool = True
    """Distil on the teacher outputs the learner's own forward pass computed over the rollout (under the
    parameters before its update, so the student tracks the learner one update behind) instead of a second
    forward pass of the updated learner (every loop)."""
    distill_children: int = 0
    """Search runs (--agent search) with a distill compressor: per update, the student also learns the
    learner's outputs at the children of this many search roots (evenly spaced over the rollout's, each
    root's children as the actor's search tree holds them), with the sibling term that fits the value
    differences between a root's actions (--distill-sibling-coef). 0: the roots only. The search compares
    its actions by those differences, which a student fitted at the roots alone gets wrong
    (docs/RESULTS.md, "Breakout-MinAtar past 150k steps"). Costs the learner's forward pass over
    roots x actions children per update."""
    distill_sibling_coef: float = 10.0
    """Weight of the sibling term with --distill-children: the squared error of the student's children's
    values centred on each root's mean, against the learner's."""
    distill_minibatches: int = 1
    """Distil each update's rows in this many minibatches: gradient step i learns every M-th row (from
    row i mod M) of the rollout's observations (and of the --distill-children roots' children), so with
    --distill-steps equal to it each row is learnt once per update at 1/M of the student's cost of
    full-batch steps. 1: every step learns all rows. Not with --compressor auto (its candidates distil in
    full batches)."""
    distill_async: bool = False
    """Distil in a background thread beside the learner (the actor runs the last published student);
    off by default: it can only pay where cores are idle while the learner and actor run (a 2-core CPU has
    none to spare); `python -m experiments.bench run distill_overlap` measures it on the machine at hand."""
    cost_split: bool = False
    """After training, also compile and time each piece of an update alone (rollout with the acting and with
    the learner's policy, learner update, compression) and report the timed actor's share and ceiling on
    what actor compression can save (summary.json cost_split); every gymnax run counts the pieces' FLOPs
    (XLA's cost analysis, nothing compiled). Off by default: compiling four more programs costs seconds."""
    compile_cache: str = "auto"
    """Folder of XLA's persistent compilation cache: a later run with the same programs (same flags and
    shapes) loads them from it instead of compiling them again, which cuts its start-up. 'auto':
    $JAX_COMPILATION_CACHE_DIR if set, else $XDG_CACHE_HOME/accerl_jax/xla (~/.cache/accerl_jax/xla);
    'off': compile every program (no cache); else a folder (made if missing). Set by the first run of a
    process (JAX reads it once)."""
    log_every: int = 10
    """Write metrics every this many learner updates; KL(π_learner ‖ π_actor) and agreement of a freshly
    compressed actor policy (TensorBoard refresh/*) every this many refreshes of it."""
    return_window: int = 100
    """final_return_mean averages the returns of this many last finished episodes."""
    progress: bool = True
    """Show the progress bar, and every 10 logs a compact table of the latest logged row."""
    wandb: bool = False
    """Also log every metrics row to Weights & Biases (needs 'pip install wandb' and 'wandb login', or
    WANDB_MODE=offline); the W&B run is named after the log folder and kept in it."""
    wandb_project: Optional[str] = None
    """W&B project (implies --wandb)."""
    checkpoint_every: int = 500
    """Save a checkpoint (orbax, in <logdir>/checkpoints/<update>/) every this many learner updates, and
    always at the end, also when stopped by Ctrl-C/SIGTERM; 0 = only at the end."""
    keep_checkpoints: int = 3
    """Keep this many of the latest checkpoints (older ones are deleted)."""
    resume: Optional[str] = None
    """Continue a stopped run: PATH is its run folder (resumes from its latest checkpoint) or a checkpoint
    folder <run>/checkpoints/<update> (must be the latest). The run continues in its own folder
    (metrics.csv appended, TensorBoard's later steps replaced; the summary covers the whole run) with the
    settings it was started with: --resume PATH alone continues it. Flags given with it may change only
    --progress, --log-every, --checkpoint-every, --keep-checkpoints, --on-nan, --compile-cache, --return-window and
    --total-steps, made larger (extends the run; the learning rate follows the new budget's schedule
    from there). Any device count; another process count
    if --num-envs x processes stays the same. gymnax environments resume exactly; envpool environments
    restart (episodes in flight are lost)."""
    overwrite: bool = False
    """Allow --logdir to hold an earlier run: its outputs and checkpoints are deleted once this run's
    settings have been checked. Without it (or --resume) such a folder is refused."""
    on_nan: str = "stop"
    """Non-finite loss, gradients or parameters after an update: 'stop' (name the update and quantity,
    keep the last good checkpoint, exit 1) or 'skip' (keep the previous learner state; counted in
    metrics.csv and summary.json as skipped_updates)."""
    coordinator_address: Optional[str] = None
    """Multi-host training (one process per host, JAX's own runtime): HOST:PORT of process 0, where the
    coordinator listens (e.g. host0:1234); the same on every process. With it, --num-envs counts
    the environments of *this* process (the learner batch is num-processes x num-envs), --total-steps
    counts all processes' steps, and only process 0 writes logs, checkpoints and the summary. Every
    process takes the same flags (only --process-id differs). Loops: anakin (gymnax; --resume works) or
    sequential."""
    num_processes: Optional[int] = None
    """Multi-host: how many processes take part (one per host)."""
    process_id: Optional[int] = None
    """Multi-host: this process's index in [0, num-processes); 0 runs the coordinator and writes the
    outputs."""


# Other frameworks' names for Config fields (CleanRL, Stable-Baselines3, RLlib, IMPALA/Brax), normalized
# (lower case, '_' for '-'): an unknown flag or settings-file key among them is answered with our name.
COMMON_NAMES = {
    "lr": "learning_rate", "learningrate": "learning_rate",
    "gamma": "discount", "discounting": "discount",
    "gae_lambda": "lambda_", "td_lambda": "lambda_",
    "ent_coef": "entropy_coef", "entropy_coeff": "entropy_coef", "entropy_cost": "entropy_coef",
    "vf_coef": "value_coef", "vf_loss_coeff": "value_coef", "baseline_cost": "value_coef",
    "num_steps": "rollout_length", "n_steps": "rollout_length", "unroll_length": "rollout_length",
    "rollout_fragment_length": "rollout_length",
    "grad_norm_clipping": "max_grad_norm", "grad_clip": "max_grad_norm", "clip_grad_norm": "max_grad_norm",
    "clip_coef": "ppo_clip", "clip_range": "ppo_clip", "clip_param": "ppo_clip",
    "update_epochs": "epochs", "n_epochs": "epochs", "num_epochs": "epochs", "num_sgd_iter": "epochs",
    "ppo_epochs": "epochs",
    "num_minibatches": "minibatches", "n_minibatches": "minibatches",
    "clip_vloss": "clip_value", "norm_adv": "normalize_advantages", "normalize_advantage": "normalize_advantages",
    "total_timesteps": "total_steps", "num_timesteps": "total_steps", "timesteps": "total_steps",
    "n_envs": "num_envs", "num_envs_per_worker": "num_envs", "env_id": "env", "env_name": "env",
    "net_arch": "hidden_sizes", "hidden_dims": "hidden_sizes", "log_dir": "logdir", "output_dir": "logdir",
    "track": "wandb", "wandb_project_name": "wandb_project",
}


def common_name(name: str) -> str | None:
    """The Config field that another framework's name for it means (``lr`` -> ``learning_rate``, ``--ent-coef``
    -> ``entropy_coef``; see :data:`COMMON_NAMES`), or None."""
    return COMMON_NAMES.get(name.lstrip("-").replace("-", "_").lower())


def flag(name: str) -> str:
    """The CLI flag of a Config field, as tyro spells it (``num_envs`` -> ``--num-envs``, ``lambda_`` -> ``--lambda``)."""
    if name == "lambda_":
        return "--lambda"
    stem = name.rstrip("_")
    return "--" + stem.replace("_", "-") + name[len(stem):]


def validate(cfg: Config) -> None:
    """Check the numeric fields.

    Raises:
      ConfigError: naming the bad flag and value and what is accepted (finite numbers only).
    """
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        if isinstance(value, float):
            # Training runs in float32: a value that overflows or underflows there is not accepted.
            with np.errstate(over="ignore"):
                as_f32 = float(np.float32(value)) if math.isfinite(value) else value
            if not math.isfinite(as_f32) or (value != 0 and as_f32 == 0):
                raise ConfigError(f"bad {flag(field.name)} {value!r}; expected a finite number representable in float32")
    big = 2**31 - 1
    checks = [
        ("seed", 0 <= cfg.seed < 2**31, "an integer in [0, 2^31)"),
        ("total_steps", cfg.total_steps > 0, "a positive integer"),
        ("num_envs", 0 < cfg.num_envs <= 65536, "an integer in [1, 65536]"),
        ("rollout_length", 0 < cfg.rollout_length <= 65536, "an integer in [1, 65536]"),
        ("learning_rate", cfg.learning_rate > 0, "a positive number"),
        ("discount", 0.0 <= cfg.discount <= 1.0, "a number in [0, 1]"),
        ("lambda_", 0.0 <= cfg.lambda_ <= 1.0, "a number in [0, 1]"),
        ("clip_rho_threshold", cfg.clip_rho_threshold > 0, "a positive number"),
        ("clip_pg_rho_threshold", cfg.clip_pg_rho_threshold > 0, "a positive number"),
        ("entropy_coef", cfg.entropy_coef >= 0, "a number >= 0"),
        ("value_coef", cfg.value_coef >= 0, "a number >= 0"),
        ("max_grad_norm", cfg.max_grad_norm > 0, "a positive number"),
        ("distill_steps", 0 <= cfg.distill_steps <= 10_000, "an integer in [0, 10000]"),
        ("distill_learning_rate", cfg.distill_learning_rate > 0, "a positive number"),
        ("distill_children", 0 <= cfg.distill_children <= 65536, "an integer in [0, 65536]"),
        ("distill_sibling_coef", cfg.distill_sibling_coef >= 0, "a number >= 0"),
        ("distill_minibatches", 1 <= cfg.distill_minibatches <= 65536, "an integer in [1, 65536]"),
        ("log_every", 0 < cfg.log_every <= big, "an integer in [1, 2^31)"),
        ("ppo_clip", 0.0 < cfg.ppo_clip < 1.0, "a number in (0, 1)"),
        ("epochs", 0 <= cfg.epochs <= 1000, "an integer in [1, 1000], or 0 for the loss's default"),
        ("minibatches", 0 < cfg.minibatches <= 65536, "an integer in [1, 65536]"),
        ("policy_lag", 0 <= cfg.policy_lag <= 1000, "an integer in [0, 1000]"),
        ("compress_every", 0 < cfg.compress_every <= big, "an integer in [1, 2^31)"),
        ("num_seeds", 0 < cfg.num_seeds <= 4096, "an integer in [1, 4096]"),
        ("return_window", 0 < cfg.return_window <= 10_000_000, "an integer in [1, 10^7]"),
        ("checkpoint_every", 0 <= cfg.checkpoint_every <= big, "an integer in [0, 2^31) (0 = only at the end)"),
        ("keep_checkpoints", 0 < cfg.keep_checkpoints <= 10_000, "an integer in [1, 10000]"),
        ("max_actor_kl", cfg.max_actor_kl > 0, "a positive number (nats)"),
        ("auto_every", 0 < cfg.auto_every <= big, "an integer in [1, 2^31)"),
        ("auto_max_clip", 0.0 <= cfg.auto_max_clip <= 1.0, "a fraction in [0, 1]"),
        ("auto_min_actor_share", 0.0 <= cfg.auto_min_actor_share <= 1.0, "a fraction in [0, 1]"),
        ("on_nan", cfg.on_nan in ("stop", "skip"), "'stop' or 'skip'"),
        ("actor_threads", 0 < cfg.actor_threads <= 64, "an integer in [1, 64]"),
        ("actor_batch", 0 <= cfg.actor_batch <= 65536, "an integer in [0, 65536] (0: half of each thread's envs)"),
        ("actor_device", cfg.actor_device in ACTOR_DEVICES, "'cpu', 'learner' or 'cpu-apart'"),
        ("queue_size", 0 < cfg.queue_size <= 1024, "an integer in [1, 1024]"),
        ("agent", cfg.agent in AGENTS, "'actor-critic' or 'search'"),
        ("minibatch_unit", cfg.minibatch_unit in MINIBATCH_UNITS, "'columns' or 'transitions'"),
        ("activation", cfg.activation in ACTIVATIONS, " or ".join(repr(a) for a in ACTIVATIONS)),
        ("network", cfg.network in NETWORKS, ", ".join(repr(n) for n in NETWORKS)),
        ("num_simulations", 0 < cfg.num_simulations <= 4096, "an integer in [1, 4096]"),
        ("max_depth", cfg.max_depth is None or 0 < cfg.max_depth <= 4096, "an integer in [1, 4096], or unset"),
        ("max_num_considered_actions", 0 < cfg.max_num_considered_actions <= 4096, "an integer in [1, 4096]"),
        ("gumbel_scale", cfg.gumbel_scale >= 0, "a number >= 0"),
        ("n_step", 0 < cfg.n_step <= 65536, "an integer in [1, 65536]"),
        ("search_target", cfg.search_target in SEARCH_TARGETS, "'search' or 'learner'"),
    ]
    if any(w < 1 or w > 65536 for w in cfg.hidden_sizes):
        raise ConfigError(f"bad --hidden-sizes {' '.join(map(str, cfg.hidden_sizes))}; expected widths in [1, 65536]")
    if not cfg.compile_cache.strip() or (cfg.compile_cache not in ("auto", "off")
                                         and os.path.exists(cfg.compile_cache)
                                         and not os.path.isdir(cfg.compile_cache)):
        raise ConfigError(f"bad --compile-cache {cfg.compile_cache!r}; expected 'auto', 'off' or a folder "
                          "(made if missing; not an existing file)")
    if cfg.logdir is not None and not cfg.logdir.strip():
        raise ConfigError(f"bad --logdir {cfg.logdir!r}: empty; give a folder name, or leave the flag out for "
                          "the default runs/<env>-<compressor>-s<seed>-<time>-<random>")
    for name, ok, expected in checks:
        if not ok:
            raise ConfigError(f"bad {flag(name)} {getattr(cfg, name)!r}; expected {expected}")
    if cfg.resume is not None and cfg.overwrite:
        raise ConfigError(f"bad --overwrite with --resume {cfg.resume!r}: resuming continues a run, overwriting "
                          "deletes it; choose one")
