"""The training command line's flags in groups, the common ones first.

:class:`~accerl_jax.config.Config` stays one flat dataclass (what the code and checkpoints use); for the
command line, :func:`parse` builds a dataclass of groups (each a dataclass of some of Config's fields, with
Config's field docstrings as their help) whose flags keep Config's names (tyro's ``OmitArgPrefixes``), and
flattens the result back into a Config.
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import math
import sys
import textwrap
import typing
from typing import Annotated

import tyro

from accerl_jax.config import Config, ConfigError, common_name, flag
from accerl_jax.tools.presets import PRESETS

# evaluate's and export's --policy. One default for both: the run's actor, the policy that played its episodes,
# that its summary reports and that a deployment runs (with --compressor none, the learner's own parameters).
POLICIES = ("actor", "learner")
DEFAULT_POLICY = "actor"
POLICY_HELP = ("'actor' (the default, in evaluate and export alike: the run's compressed actor as it ran, the policy "
               "its returns and summary describe and a deployment runs) or 'learner' (the full-size learner's "
               "policy; the only one of a --compressor auto run)")


def run_folder(path: str) -> str:
    """The run folder a user meant by ``path``: ``RUN`` for ``RUN/checkpoints`` (the folder of its
    checkpoints, given for the run), else ``path`` as given. Plain file checks: no JAX."""
    import os

    trimmed = os.path.normpath(path) if path.strip() else path
    if (os.path.basename(trimmed) == "checkpoints" and os.path.isdir(trimmed)
            and not os.path.isdir(os.path.join(trimmed, "checkpoints"))):
        return os.path.dirname(trimmed) or "."
    return path


def resume_run_folder(argv: list[str]) -> list[str]:
    """``argv`` with ``--resume RUN/checkpoints`` (or ``--resume=...``) read as ``--resume RUN`` (:func:`run_folder`)."""
    out = list(argv)
    for i, token in enumerate(out):
        if token == "--resume" and i + 1 < len(out):
            out[i + 1] = run_folder(out[i + 1])
        elif token.startswith("--resume="):
            out[i] = "--resume=" + run_folder(token.split("=", 1)[1])
    return out


HELP_FLAGS = frozenset({"-h", "--help", "--help-all"})  # a command line asking for help is not checked

# (group, title, Config fields), in the order --help-all shows them. Every Config field is in exactly one.
GROUPS = (
    ("common", "the run: what to train, how long, where the outputs go", (
        "preset", "config", "env", "compressor", "corrector", "loss", "total_steps", "num_envs", "rollout_length",
        "seed", "logdir", "loop", "resume", "overwrite")),
    ("learner", "the learner: optimizer, network, losses, off-policy correction", (
        "learning_rate", "anneal_lr", "network", "hidden_sizes", "activation", "reward_clip", "normalize_observations",
        "normalize_rewards", "discount", "lambda_", "clip_rho_threshold", "clip_pg_rho_threshold", "entropy_coef",
        "value_coef", "max_grad_norm", "ppo_clip", "normalize_advantages", "clip_value", "epochs", "minibatches", "minibatch_unit")),
    ("compression", "the actor's compressed policy: distillation, refresh, --compressor auto", (
        "distill_steps", "distill_learning_rate", "distill_async", "distill_reuse_teacher", "distill_children",
        "distill_sibling_coef", "distill_minibatches", "compress_every",
        "policy_lag", "max_actor_kl",
        "auto_candidates", "auto_every", "auto_max_clip", "auto_min_actor_share", "learner_children")),
    ("search", "search agents (--agent search): Gumbel MuZero search with the actor's network", (
        "agent", "search_target", "num_simulations", "max_depth", "max_num_considered_actions", "gumbel_scale",
        "n_step")),
    ("loops", "loops: seeds and sweeps in one program (Anakin), actor threads and queues (Sebulba)", (
        "num_seeds", "sweep", "actor_threads", "actor_batch", "actor_device", "queue_size")),
    ("outputs", "logging, checkpoints, failures", (
        "log_every", "return_window", "progress", "cost_split", "compile_cache", "wandb", "wandb_project", "checkpoint_every",
        "keep_checkpoints", "on_nan")),
    ("hosts", "multi-host training (one process per host)", ("coordinator_address", "num_processes", "process_id")),
)


# --help's one line for each flag of the common group (--help-all has the full help of every flag).
SHORT_HELP = {
    "preset": "named settings: " + ", ".join(PRESETS),
    "config": "a YAML or TOML file of settings (flag names)",
    "env": "gymnax:<id> or envpool:<id>, or your own env's import path",
    "compressor": "the actors' policy: auto (compress only where the actor is most of an update), none, distill:small, int8, ...",
    "corrector": "off-policy correction: vtrace, retrace, is or none",
    "loss": "appo, actor-critic or auto",
    "total_steps": "budget in agent steps, summed over the envs",
    "num_envs": "environments stepped together (B)",
    "rollout_length": "agent steps per env and rollout (T)",
    "seed": "random seed",
    "logdir": "output folder; a new one under runs/ if unset",
    "loop": "anakin, sequential, sebulba or auto (by env)",
    "resume": "continue a stopped run: its folder",
    "overwrite": "allow --logdir to hold an earlier run (deleted)",
}
# The optional fields (None = unset): the metavar --help shows for each (instead of tyro's "{None}|STR") and
# what leaving it unset does, shown where --help shows a default.
UNSET = {
    "preset": ("NAME", "unset: the built-in defaults, the same as --preset classic"),
    "config": ("FILE", "unset: no settings file"),
    "logdir": ("DIR", "unset: runs/<env>-<compressor>-s<seed>-<time>-<random>"),
    "resume": ("PATH", "unset: a new run"),
    "wandb_project": ("NAME", "unset: 'accerl_jax' with --wandb, no W&B without it"),
    "coordinator_address": ("HOST:PORT", "unset: $JAX_COORDINATOR_ADDRESS; if that and --num-processes are unset "
                                         "too, a single process"),
    "num_processes": ("INT", "unset: $JAX_NUM_PROCESSES"),
    "process_id": ("INT", "unset: $JAX_PROCESS_ID"),
    "max_depth": ("INT", "unset: no limit but the simulations"),
}
# What an empty --hidden-sizes (its default) means: networks.default_spec's widths for the observations.
HIDDEN_SIZES_UNSET = ("unset: the --network family's own: 64 64 (mlp), 32 64 64 512 (cnn), 16 128 "
                      "(minatar), 16 32 32 256 (impala)")
# Flags accepted but not listed by --help, and the flag they stand for (the field's own name, lambda_).
HIDDEN_ALIASES = {"--lambda_": "--lambda"}


def _default_hint(unset: str):
    """tyro's ``help_behavior_hint``: ``(default: <unset>)`` for an unset value, else the value given (by a
    preset, a settings file or a resumed run)."""
    return lambda shown: f"(default: {unset})" if shown in ("None", "", "()") else f"(default: {shown})"


def field_docs() -> dict[str, str]:
    """Config's field docstrings (the string under each field in its source), by field name."""
    tree = ast.parse(inspect.getsource(Config))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())  # one paragraph: the help wraps it
    return docs


@functools.lru_cache(maxsize=1)
def grouped_class():
    """The dataclass of groups tyro parses (built once)."""
    hints = typing.get_type_hints(Config, include_extras=True)
    docs = field_docs()
    defaults = Config()
    groups = []
    for name, title, fields in GROUPS:
        members = []
        for f in fields:
            hint, meta = hints[f], {}
            if typing.get_origin(hint) is Annotated:  # e.g. lambda_'s own name and alias
                hint, *extra = typing.get_args(hint)
                for m in extra:
                    meta.update(name=m.name, aliases=m.aliases)
            if f in UNSET:
                meta.update(metavar=UNSET[f][0], help_behavior_hint=_default_hint(UNSET[f][1]))
            elif f == "hidden_sizes":
                meta.update(help_behavior_hint=_default_hint(HIDDEN_SIZES_UNSET))
            elif f == "sweep":
                meta.update(metavar="NAME=V1,V2,...", help_behavior_hint=_default_hint("unset: no sweep"))
            arg = tyro.conf.arg(help=docs.get(f, ""), **{k: v for k, v in meta.items() if v is not None})
            members.append((f, Annotated[hint, arg], dataclasses.field(default=getattr(defaults, f))))
        cls = dataclasses.make_dataclass(name.capitalize(), members)
        groups.append((name, Annotated[cls, tyro.conf.OmitArgPrefixes, tyro.conf.arg(help=title)],
                       dataclasses.field(default_factory=cls)))
    return dataclasses.make_dataclass("TrainArgs", groups)


def known_flags(cls=Config) -> set[str]:
    """Every flag a command line of dataclass ``cls`` takes (default: training's), hyphenated (``--num-envs``,
    ``--no-anneal-lr``, ``--lambda``, ``--lambda_``, ``--help``); tyro also takes them with ``_`` for ``-``
    (:func:`_normal` maps both to one)."""
    flags = {*HELP_FLAGS, *(HIDDEN_ALIASES if cls is Config else ()), *(flag(f.name) for f in dataclasses.fields(cls))}
    return {_normal(x) for x in flags} | switch_flags(cls)


# Words a user may write after an on/off flag (``--progress off``); tyro's switches take no value.
SWITCH_WORDS = {"on", "off", "true", "false", "yes", "no", "0", "1"}


def switch_flags(cls=Config) -> set[str]:
    """The on/off flags of dataclass ``cls`` (a ``bool`` field's ``--name`` and ``--no-name``), as
    :func:`known_flags` spells them."""
    hints = typing.get_type_hints(cls)
    return {_normal(x) for f in dataclasses.fields(cls) if hints[f.name] is bool
            for x in (flag(f.name), "--no-" + flag(f.name)[2:])}


def _switch_error(name: str, value: str, known: set[str]) -> ConfigError:
    other = "--" + name[5:] if name.startswith("--no-") else "--no-" + name[2:]
    pair = f" ({other} for the opposite)" if other in known else ""
    return ConfigError(f"bad {name} {value!r}; {name} is a switch and takes no value: write {name} alone{pair}")


def _normal(token: str) -> str:
    """A flag as :func:`known_flags` spells it: the part before ``=``, ``_`` read as ``-`` (``--num_envs=8`` ->
    ``--num-envs``; ``--lambda_`` -> ``--lambda-``)."""
    name = token.split("=", 1)[0]
    return name[:2] + name[2:].replace("_", "-") if name.startswith("--") else name


# Flags of other frameworks (CleanRL's Args, cleanba's, PureJaxRL's config keys, ...) whose meaning is
# reached another way here than by one of our training flags (those are config.COMMON_NAMES): name (lower
# case, underscores) -> our way, in words.
_EVALUATE_VIDEO = "after training, python -m accerl_jax.evaluate RUN_DIR --video episode.gif (or .mp4)"
_EXPORT = ("checkpoints are saved in <logdir>/checkpoints (--checkpoint-every, --keep-checkpoints); a deployable "
           "policy: python -m accerl_jax.export RUN_DIR --out DIR")
OTHER_WAYS = {
    "capture_video": _EVALUATE_VIDEO, "video": _EVALUATE_VIDEO, "record_video": _EVALUATE_VIDEO,
    "render": _EVALUATE_VIDEO, "render_mode": _EVALUATE_VIDEO, "save_video": _EVALUATE_VIDEO,
    "save_model": _EXPORT, "save_path": _EXPORT, "upload_model": _EXPORT + " (no upload to a model hub)",
    "hf_entity": _EXPORT + " (no upload to a model hub)",
    "exp_name": "--logdir runs/NAME (the run folder names the run)",
    "run_name": "--logdir runs/NAME (the run folder names the run)",
    "torch_deterministic": "no such switch: randomness follows --seed through JAX's PRNG",
    "cuda": "nothing to set: JAX uses an accelerator when one is installed; JAX_PLATFORMS=cpu keeps to the CPU",
    "eval_freq": "the run logs its own episodes' return every --log-every updates; after training, "
                 "python -m accerl_jax.evaluate RUN_DIR --episodes N",
    "eval_episodes": "after training, python -m accerl_jax.evaluate RUN_DIR --episodes N",
    "save_freq": "--checkpoint-every (in updates)", "checkpoint_freq": "--checkpoint-every (in updates)",
    "log_freq": "--log-every (in updates)", "log_interval": "--log-every (in updates)",
    "clip_eps": "--ppo-clip", "num_actor_threads": "--actor-threads (--loop sebulba)",
    "local_num_envs": "--num-envs (this process's environments)",
    "distributed": "--coordinator-address, --num-processes and --process-id (one process per host)",
    "resume_from": "--resume RUN_DIR", "load_model": "--resume RUN_DIR",
    "batch_size": "--num-envs x --rollout-length (the learner's batch); --minibatches splits it",
    "minibatch_size": "--minibatches (the number of minibatches of the --num-envs x --rollout-length batch)",
    "wandb_entity": "WANDB_ENTITY in the environment (W&B reads it); --wandb-project names the project",
    "wandb_mode": "WANDB_MODE in the environment (W&B reads it), with --wandb",
}


def other_way(name: str) -> str | None:
    """How a flag of another framework (``--capture-video``) is done here (:data:`OTHER_WAYS`), or None."""
    return OTHER_WAYS.get(name.lstrip("-").replace("-", "_").lower())


def check_sweep_flags(argv: list[str], cfg: Config) -> None:
    """Refuse what a command line says twice about a swept value: ``--sweep`` given more than once (a later
    flag would replace the earlier one's grid) and a swept name's own flag (``--sweep learning_rate=...``
    with ``--learning-rate``: the sweep's values would replace it).

    Raises:
      ConfigError: naming the flags and how to give them.
    """
    given = [_normal(HIDDEN_ALIASES.get(t.split("=", 1)[0], t)) for t in argv if t.startswith("--")]
    if given.count("--sweep") > 1:
        raise ConfigError("bad --sweep given twice: the later one would replace the earlier; give every NAME=V1,V2 "
                          "item after one --sweep (e.g. --sweep learning_rate=1e-3,3e-3 entropy_coef=0,0.01)")
    from accerl_jax.run.replicas import parse_sweep

    for name, _ in parse_sweep(cfg.sweep):
        if _normal(flag(name)) in given:
            raise ConfigError(f"bad {flag(name)} with --sweep {name}=...: the sweep's values replace it; drop "
                              f"{flag(name)}, or its item of --sweep")


def check_flags(argv: list[str], cls=Config, prog: str = "python -m accerl_jax.train") -> None:
    """Refuse an unknown flag in ``argv`` (a command line of dataclass ``cls``, default: training's) with one
    line that suggests ours: for training, how another framework's flag is done here (``--capture-video`` ->
    ``evaluate --video``; :data:`OTHER_WAYS`) or the field its name means (``--lr`` -> ``--learning-rate``,
    ``--gamma`` -> ``--discount``; :data:`~accerl_jax.config.COMMON_NAMES`); else the closest spelling.

    Nothing is checked when ``argv`` asks for ``--help`` or ``--help-all``.

    Raises:
      ConfigError: for the first unknown flag (tyro would print a box of several lines instead).
    """
    if HELP_FLAGS & set(argv):
        return
    known, switches = known_flags(cls), switch_flags(cls)
    every = f"{prog} {'--help-all' if cls is Config else '--help'} lists every flag"
    previous = None
    for token in argv:
        if token == "--":  # what follows is values only
            return
        if previous in switches and (token.lower() in SWITCH_WORDS or  # --progress off: tyro's box otherwise
                                     not token.startswith("-") and not positional_fields(cls)):  # --progress x
            raise _switch_error(previous, token, known)
        previous = _normal(token) if token.startswith("--") else None
        if previous in switches and "=" in token:  # --progress=off
            raise _switch_error(previous, token.split("=", 1)[1], known)
        if not token.startswith("-") or _normal(token) in known or _is_number(token):
            continue
        name = token.split("=", 1)[0]
        way = other_way(name) if cls is Config else None
        if way is not None:  # another framework's flag with no flag of ours: how it is done here
            raise ConfigError(f"unknown flag {name}; here: {way}. {every}")
        # another framework's name: ours for it, else the closest spellings
        ours = common_name(name) if cls is Config else None
        close = [flag(ours)] if ours else difflib.get_close_matches(_normal(name), sorted(known - {"-h"}), n=2)
        hint = f" (perhaps {' or '.join(close)})" if close else ""
        raise ConfigError(f"unknown flag {name}{hint}; {every}")


def positional_fields(cls) -> list[str]:
    """The fields of dataclass ``cls`` given without a flag (``tyro.conf.Positional``: evaluate's RUN_DIR)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return [f.name for f in dataclasses.fields(cls) if "Positional" in repr(hints[f.name])]


def _many(cls, name: str) -> bool:
    """Whether field ``name`` of ``cls`` takes several values (plot's RUN_DIRS: a list, which tyro lets be
    empty, and which the tool itself then refuses with its own message)."""
    hint = repr(typing.get_type_hints(cls, include_extras=True)[name])
    return any(word in hint for word in ("list", "List", "tuple", "Tuple", "Sequence"))


def check_required(argv: list[str], cls, prog: str) -> None:
    """Refuse a command line of dataclass ``cls`` that lacks a required argument (a field without a default:
    a positional such as RUN_DIR, or a flag such as export's ``--out``) in one line naming it and the usage;
    nothing is checked when ``argv`` asks for help.

    Raises:
      ConfigError: for the first missing argument (tyro would print a box of several lines instead).
    """
    if HELP_FLAGS & set(argv):
        return
    switches, positional = switch_flags(cls), positional_fields(cls)
    bare, previous = [], None  # the tokens that are no flag's value: the positionals
    for i, token in enumerate(argv):
        if token == "--":
            bare += argv[i + 1:]
            break
        if token.startswith("--"):
            previous = None if "=" in token else _normal(token)
            continue
        if previous is None or previous in switches:
            bare.append(token)
        previous = None
    given = {_normal(t) for t in argv if t.startswith("--")}
    usage = f"usage: {prog} {' '.join(f.upper() for f in positional)} [FLAGS]; {prog} --help lists every flag"
    for name in [f.name for f in dataclasses.fields(cls)
                 if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]:
        if name in positional and len(bare) <= positional.index(name) and not _many(cls, name):
            raise ConfigError(f"missing {name.upper()}, the run folder to read; {usage}")
        if name not in positional and flag(name) not in given:
            raise ConfigError(f"missing {flag(name)}, which is required; {usage}")


def numeric_flags(cls=Config) -> dict[str, str]:
    """The numeric flags of a command line of dataclass ``cls``: flag -> ``"int"``, ``"float"`` or ``"ints"``
    (several integers, e.g. ``--hidden-sizes``); an optional field (``Optional[int]``) counts as its type."""
    kinds = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if typing.get_origin(hint) is typing.Union:
            members = [a for a in typing.get_args(hint) if a is not type(None)]
            hint = members[0] if len(members) == 1 else hint
        if hint is int:
            kinds[flag(f.name)] = "int"
        elif hint is float:
            kinds[flag(f.name)] = "float"
        elif typing.get_origin(hint) is tuple and typing.get_args(hint)[:1] == (int,):
            kinds[flag(f.name)] = "ints"
    return kinds


def check_numbers(argv: list[str], cls=Config) -> list[str]:
    """``argv`` with every value of a numeric flag of ``cls`` checked: an integer flag takes an integer-valued
    number in any notation, written back as an integer (``--total-steps 1e6`` -> ``1000000``, ``2.5e5``,
    ``100.0``); nothing else changes. Nothing is checked when ``argv`` asks for ``--help``.

    Raises:
      ConfigError: a value that is not a number, or not an integer for an integer flag, naming the flag, the
        value and what is accepted (tyro would print a box of several lines instead).
    """
    if HELP_FLAGS & set(argv):
        return list(argv)
    kinds = numeric_flags(cls)
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if token == "--":
            return out + [token] + list(argv[i:])
        name, eq, value = token.partition("=")
        kind = kinds.get(_normal(name)) if token.startswith("--") else None
        if kind is None:
            out.append(token)
        elif eq:
            out.append(f"{name}={_number(name, value, kind)}")
        else:
            out.append(token)
            while i < len(argv) and not (argv[i].startswith("-") and not _is_number(argv[i])):
                out.append(_number(name, argv[i], kind))
                i += 1
                if kind != "ints":
                    break
    return out


def parse_args(cls, argv: list[str] | None, prog: str):
    """Parse the command line ``argv`` (None: ``sys.argv[1:]``) of a tool whose flags are dataclass ``cls``'s
    (``accerl_jax.evaluate``, ``accerl_jax.export``) with tyro, after :func:`check_flags` and
    :func:`check_numbers`; ``--help`` prints and exits.

    Raises:
      ConfigError: an unknown flag or a bad numeric value, in one line.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    check_flags(argv, cls, prog)
    check_required(argv, cls, prog)
    return tyro.cli(cls, args=check_numbers(argv, cls), prog=prog)


def _number(name: str, value: str, kind: str) -> str:
    """``value`` of flag ``name`` as :func:`check_numbers` passes it on (an integer flag's as an integer)."""
    if kind == "float":
        if _is_number(value):
            return value
        raise ConfigError(f"bad {name} {value!r}; expected a number")
    try:
        return str(int(value))
    except ValueError:
        pass
    number = float(value) if _is_number(value) else float("nan")
    if math.isfinite(number) and number == int(number):
        return str(int(number))
    raise ConfigError(f"bad {name} {value!r}; expected an integer (whole numbers may be written like 2e5)")


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def short_help(default: Config, prog: str, width: int = 80) -> str:
    """What ``--help`` prints: the flags most runs need (the ``common`` group of :data:`GROUPS`) with their
    one-line :data:`SHORT_HELP` and default (``default``'s value: a preset's where one is given), then the
    other groups' flag names; ``--help-all`` (tyro's full reference, the same as docs/CLI.md) explains every
    flag. At most ``width`` columns."""
    values = dataclasses.asdict(default)
    wrap = functools.partial(textwrap.wrap, width=width, break_on_hyphens=False)
    _, title, fields = GROUPS[0]
    lines = [f"usage: {prog} [FLAGS]", "", *wrap(inspect.cleandoc(Config.__doc__ or "").split("\n\n")[0]),
             "", f"{title}:"]
    for f in fields:
        value = values[f]
        shown = "unset" if value is None else ("on" if value else "off") if isinstance(value, bool) else \
            " ".join(map(str, value)) if isinstance(value, tuple) else value
        lines += wrap(f"{SHORT_HELP[f]} [{shown}]", initial_indent=f"  {flag(f):<18} ", subsequent_indent=" " * 21)
    lines += ["", "more flags:"]
    for name, _, fields in GROUPS[1:]:
        lines += wrap(" ".join(flag(f) for f in fields), initial_indent=f"  {name + ':':<13} ",
                      subsequent_indent=" " * 16)
    lines += wrap("every flag's help, default and accepted values: --help-all (or docs/CLI.md)")
    return "\n".join(lines)


def parse(argv: list[str], default: Config, prog: str) -> Config:
    """Parse ``argv`` (tyro) with ``default``'s values as the defaults; ``--help`` prints :func:`short_help`
    and exits, ``--help-all`` the groups of every flag (tyro's help) and exits.

    ``argv``'s flags are expected checked by :func:`check_flags` already (``train.parse_config`` does it
    before any settings file is read, so that an unknown flag is named first)."""
    if {"-h", "--help"} & set(argv) and "--help-all" not in argv:
        print(short_help(default, prog))
        raise SystemExit(0)
    argv = check_numbers(["--help" if token == "--help-all" else _alias(token) for token in argv])
    cls = grouped_class()
    values = dataclasses.asdict(default)
    start = cls(**{name: typing.get_args(t)[0](**{f: values[f] for f in fields})
                   for (name, _, fields), t in zip(GROUPS, typing.get_type_hints(cls, include_extras=True).values())})
    args = tyro.cli(cls, args=argv, default=start, prog=prog, description=inspect.cleandoc(Config.__doc__ or ""))
    return Config(**{f: getattr(getattr(args, name), f) for name, _, fields in GROUPS for f in fields})


def _alias(token: str) -> str:
    """``token`` with a :data:`HIDDEN_ALIASES` flag replaced by the flag it stands for (``--lambda_=0.9`` ->
    ``--lambda=0.9``)."""
    name, eq, value = token.partition("=")
    return HIDDEN_ALIASES[name] + eq + value if name in HIDDEN_ALIASES else token
