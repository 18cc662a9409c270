"""Named starting points for a run (``--preset``), settings files (``--config``), and the settings of a
resumed run (``--resume``).

A preset is a set of :class:`~accerl_jax.config.Config` fields for one environment family; a settings
file (YAML or TOML, Config field names with ``_`` or ``-``) is applied after it; flags on the command line
override both. Where a preset's values come from is in :data:`PRESETS` (``source``): measured here, or
taken from the reference implementation named there and not tuned here.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import re
from typing import NamedTuple

from accerl_jax.config import Config, ConfigError, common_name, flag


class Preset(NamedTuple):
    family: str  # what it is for
    settings: dict  # Config fields
    source: str  # where the values come from


PRESETS = {
    "classic": Preset(
        "gymnax classic control (CartPole-v1, Acrobot-v1, MountainCar-v0, ...)",
        {"env": "gymnax:CartPole-v1", "num_envs": 16, "rollout_length": 16, "total_steps": 200_000,
         "learning_rate": 1e-3, "loss": "appo", "epochs": 8},
        "the defaults, measured on a 2-core CPU: CartPole solved (return >= 475) within 200k steps on every "
        "seed tried (docs/RESULTS.md, \"The default job\")"),
    "minatar": Preset(
        "gymnax MinAtar (Breakout-MinAtar, SpaceInvaders-MinAtar, ...): PPO-style APPO, MLP on the grid",
        {"env": "gymnax:Breakout-MinAtar", "network": "mlp", "loss": "appo", "num_envs": 64, "rollout_length": 128,
         "epochs": 4, "minibatches": 8, "minibatch_unit": "transitions", "normalize_advantages": True,
         "clip_value": True, "learning_rate": 5e-3, "lambda_": 0.95, "max_grad_norm": 0.5,
         "total_steps": 2_000_000},
        "PureJaxRL's MinAtar config (64 envs x 128 steps, 4 epochs x 8 minibatches of shuffled transitions, "
        "advantages normalised per minibatch, the value loss clipped, LR 5e-3, lambda 0.95, gradient clip 0.5, "
        "MLP(64, 64) on the flattened grid), measured beside it on a 2-core CPU at 2M steps, mean of the last "
        "100 episodes, seeds 0-2: Breakout-MinAtar 22.5, 37.8, 28.9 against PureJaxRL's 28.8, 27.2, 25.1 "
        "(whole process 0.98x and 1.00x of its, two runs); SpaceInvaders-MinAtar 142.8, 134.9, 131.0 against "
        "124.5, 120.2, 117.1 (0.92x) (docs/RESULTS.md; the suite's minatar_*_vs_purejaxrl)"),
    "atari": Preset(
        "envpool Atari (Pong-v5, Breakout-v5, ...): 4 stacked 84x84 frames, Nature CNN, PPO as CleanRL's",
        {"env": "envpool:Pong-v5", "loop": "sequential", "loss": "appo", "num_envs": 8, "rollout_length": 128,
         "total_steps": 10_000_000, "learning_rate": 2.5e-4, "epochs": 4, "minibatches": 4,
         "minibatch_unit": "transitions", "normalize_advantages": True, "ppo_clip": 0.1, "clip_value": True,
         "lambda_": 0.95, "entropy_coef": 0.01, "value_coef": 0.5, "discount": 0.99, "max_grad_norm": 0.5},
        "CleanRL's ppo_atari_envpool_xla_jax.py (8 environments x 128 steps, 4 epochs x 4 minibatches of shuffled "
        "transitions, learning rate 2.5e-4 annealed, clip 0.1 on the ratio and the value, GAE lambda 0.95, entropy "
        "0.01, gradient clip 0.5) in the sequential loop (on-policy, as CleanRL): 324 agent steps/s on a 2-core "
        "CPU; on Pong-v5 its return rose from -20.3 to 8.2 over 2M agent steps (seed 0, one run; docs/RESULTS.md, "
        "quality_atari_pong). IMPALA's settings (unroll 20, one pass per sample, learning rate 6e-4) were 3x faster "
        "per step but still at -20.25 after 2M agent steps"),
    "mujoco": Preset(
        "envpool MuJoCo (HalfCheetah-v4, Hopper-v4, ...): continuous actions, Gaussian policy, APPO",
        {"env": "envpool:HalfCheetah-v4", "loop": "sequential", "loss": "appo", "num_envs": 32, "rollout_length": 64,
         "total_steps": 1_000_000, "learning_rate": 3e-4, "epochs": 10, "minibatches": 32,
         "minibatch_unit": "transitions", "normalize_advantages": True, "lambda_": 0.95,
         "entropy_coef": 0.0, "max_grad_norm": 0.5, "compressor": "none", "normalize_observations": True,
         "normalize_rewards": True, "activation": "tanh"},
        "CleanRL's ppo_continuous_action (2048 steps per update, 10 epochs x 32 minibatches of shuffled "
        "transitions, advantages normalised per minibatch, learning rate 3e-4, GAE lambda 0.95, no entropy bonus, "
        "gradient clip 0.5, observation normalisation and reward scaling as its gym wrappers, tanh hidden layers) "
        "with 32 environments, in the sequential loop (on-policy as CleanRL's, and a run repeats exactly); "
        "measured on a 2-core CPU at 1M steps against CleanRL's published returns (the suite's quality_mujoco; "
        "docs/RESULTS.md, \"MuJoCo\"; 3 seeds, each run about a minute): mean returns HalfCheetah 2025, Hopper "
        "2721, Walker2d 2975, all above CleanRL's. In the Sebulba loop (runs of one seed differ) 2166, 2528, 2767 "
        "over 3 seeds x 2 runs; with ReLU hidden layers Hopper reached 1901 (3 seeds); without the normalisation "
        "653 (seed 0)"),
    "search": Preset(
        "a search agent on gymnax CartPole-v1: Gumbel MuZero (8 simulations) with int8 actors, MLP 256 256",
        {"env": "gymnax:CartPole-v1", "agent": "search", "compressor": "int8", "hidden_sizes": (256, 256),
         "num_envs": 16, "rollout_length": 16, "num_simulations": 8, "learning_rate": 3e-3,
         "total_steps": 300_000},
        "measured on a 2-core CPU (seeds 0, 1): the search's return reached 500 after 180k and 230k of its "
        "300k steps"),
    "connect4": Preset(
        "Connect Four by self-play (pgx): Gumbel MuZero (16 simulations), game-outcome value targets, MLP 128 128",
        {"env": "pgx:connect_four", "agent": "search", "hidden_sizes": (128, 128), "num_envs": 32,
         "rollout_length": 64, "num_simulations": 16, "learning_rate": 3e-3, "total_steps": 300_000},
        "chosen here, not tuned (one seed, a 2-core CPU, about a minute): against uniformly random legal moves and "
        "a 64-simulation random-rollout MCTS, the numbers in docs/GUIDE.md (\"Two-player games\")"),
}


def _kind(name: str) -> tuple[str, bool] | None:
    """Config field ``name``'s base type (``"int"``, ``"float"``, ``"str"``, ``"bool"``, ``"tuple[int, ...]"``)
    and whether it is optional; None for a name that is no field."""
    kinds = {f.name: str(f.type) for f in dataclasses.fields(Config)}
    if name not in kinds:
        return None
    optional = kinds[name].startswith("Optional[")
    return (kinds[name][len("Optional["):-1] if optional else kinds[name]), optional


def _field_name(key) -> str:
    """A settings file's key as a Config field name (``num-envs`` -> ``num_envs``, ``lambda`` -> ``lambda_``)."""
    name = str(key).lstrip("-").replace("-", "_")
    return "lambda_" if name == "lambda" else name


def _check_fields(settings: dict, where: str, nulls: dict | None = None) -> dict:
    """``settings`` (a settings file's or preset's mapping) as Config fields, each as its field's type.
    ``nulls``: the text a YAML null was written as, by key (named in the error if it is refused).

    Raises:
      ConfigError: an unknown setting, or a value its field does not take.
    """
    names = {f.name for f in dataclasses.fields(Config)}
    fields = {}
    for key, value in settings.items():
        name = _field_name(key)
        if name not in names or name in ("preset", "config"):
            ours = common_name(name)  # another framework's name (lr, gamma, ent_coef): ours, else the closest spellings
            close = [ours] if ours else difflib.get_close_matches(name, sorted(names - {"preset", "config"}), n=2)
            hint = f" (perhaps {' or '.join(close)})" if close else ""
            raise ConfigError(f"bad {where}: unknown setting {key!r}{hint}; expected Config fields such as "
                              "env, compressor, total_steps, num_envs (see --help)")
        fields[name] = _typed(name, value, where, (nulls or {}).get(key))
    return fields


def _number(name: str, value, kind: str):
    """``value`` (a number, or its text) read as the CLI reads flag ``name``'s (:func:`accerl_jax.tools.cli._number`:
    an integer field takes a whole number in any notation, 1e3 or 1000.0); ``value`` unchanged where it is
    not a number of that ``kind`` (``"int"`` or ``"float"``), for the caller to refuse."""
    from accerl_jax.tools import cli

    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return value
    try:
        text = cli._number(flag(name), value if isinstance(value, str) else repr(value), kind)
    except ConfigError:
        return value
    return int(text) if kind == "int" else float(text)


def _typed(name: str, value, where: str, null_text: str | None = None):
    """``value`` as Config field ``name``'s type (int, float, str, bool, optional, tuple of ints); numbers as
    the CLI's flags read them (:func:`_number`). ``null_text``: how a null ``value`` was written.

    Raises:
      ConfigError: ``bad <where>: <name> = <value>; expected ...`` for a value the field does not take.
    """
    base, optional = _kind(name)
    if value is None and optional:
        return None
    if base in ("int", "float"):
        value = _number(name, value, base)
    elif base == "tuple[int, ...]" and isinstance(value, (list, tuple)):
        value = [_number(name, v, "int") for v in value]
    elif base == "tuple[str, ...]" and isinstance(value, str):  # one item (--sweep NAME=V1,V2)
        value = [value]
    ok = {"int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool),
          "str": isinstance(value, str), "bool": isinstance(value, bool),
          "tuple[int, ...]": isinstance(value, (list, tuple)) and all(
              isinstance(v, int) and not isinstance(v, bool) for v in value),
          "tuple[str, ...]": isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)}.get(base, True)
    if not ok and base == "tuple[str, ...]" and isinstance(value, (list, tuple)):
        raise ConfigError(f"bad {where}: {name} = {value!r}; expected a list of strings: quote each item, e.g. "
                          f"{name}: [\"learning_rate=1e-3,2e-3\"] (an unquoted YAML list splits an item at its commas)")
    if not ok:
        what = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
                "tuple[int, ...]": "a list of integers", "tuple[str, ...]": "a list of strings"}.get(base, base)
        shown = f"{null_text or 'empty'} (null)" if value is None and null_text is not None else repr(value)
        raise ConfigError(f"bad {where}: {name} = {shown}; expected {what}{' or null' if optional else ''}")
    return float(value) if base == "float" else tuple(value) if base.startswith("tuple[") else value


# YAML 1.1 literals that YAML 1.2 (and TOML) read otherwise, in a setting that is not a string.
_LEADING_ZERO = re.compile(r"[-+]?0[0-9_]+")
_BASE_60 = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")
_YAML11_BOOLS = {w: v for words, v in (("yes Yes YES on On ON", True), ("no No NO off Off OFF", False))
                 for w in words.split()}


def _refuse_ambiguous(name: str, text: str, base: str, where: str) -> None:
    """Refuse plain scalar ``text`` of non-string field ``name`` (of type ``base``) if YAML 1.1 and 1.2 read it
    differently: a leading zero (octal in 1.1, decimal in 1.2), base 60 (``1:30``: 90 in 1.1, text in
    1.2), or yes/no/on/off for a bool field (booleans in 1.1, text in 1.2). They are refused rather than
    read as YAML 1.2 says, because the same file read by a YAML 1.1 tool (PyYAML's own ``safe_load``, an
    older accerl_jax) would silently mean another number; TOML refuses leading zeros too.

    Raises:
      ConfigError: naming the setting, the literal, both readings and what to write instead.
    """
    if _LEADING_ZERO.fullmatch(text):
        digits = text.lstrip("+-").replace("_", "")
        sign = "-" if text.startswith("-") else ""
        decimal = int(sign + digits, 10)
        octal = (f"octal {int(sign + digits, 8)} in YAML 1.1" if set(digits) <= set("01234567")
                 else "text in YAML 1.1")
        fix = f"write {decimal}" + (f", or {sign}0o{digits.lstrip('0') or '0'} for octal" if "octal" in octal else "")
        raise ConfigError(f"bad {where}: {name}: {text} is ambiguous ({octal}, decimal {decimal} in YAML 1.2); {fix}")
    if base != "str" and _BASE_60.fullmatch(text):
        import yaml

        value = yaml.safe_load(text)
        raise ConfigError(f"bad {where}: {name}: {text} is ambiguous (base 60 in YAML 1.1: {value}; text in "
                          f"YAML 1.2); write {value}")
    if base == "bool" and text in _YAML11_BOOLS:
        raise ConfigError(f"bad {where}: {name}: {text} is not a boolean in YAML 1.2 (YAML 1.1 reads it as "
                          f"{str(_YAML11_BOOLS[text]).lower()}); write true or false")


def _yaml12_loader():
    """A PyYAML SafeLoader whose implicit types follow YAML 1.2's core schema: null (``~``, ``null``, empty),
    bool (``true``/``false`` only), int (decimal, ``0o`` octal, ``0x`` hex), float (``1e3`` and ``.5``
    too, ``.inf``, ``.nan``); every other plain scalar is text (``off``, ``yes``, ``1:30``)."""
    import yaml

    class Loader(yaml.SafeLoader):
        yaml_implicit_resolvers: dict = {}

        def construct_yaml_int(self, node):  # YAML 1.2: a leading 0 is decimal, 0o octal, 0x hex
            text = self.construct_scalar(node)
            sign = -1 if text.startswith("-") else 1
            digits = text.lstrip("+-")
            base = 8 if digits.startswith("0o") else 16 if digits.startswith("0x") else 10
            return sign * int(digits[2:] if base != 10 else digits, base)

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    for tag, pattern, first in (
            ("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
            ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
            ("int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
            ("float", r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
                      r"|\.(?:nan|NaN|NAN))$", list("-+.0123456789"))):
        Loader.add_implicit_resolver(f"tag:yaml.org,2002:{tag}", re.compile(pattern), first)
    return Loader


def _read_yaml(f, where: str) -> tuple[object, dict]:
    """The settings of YAML stream ``f`` read against Config's field types (:func:`_yaml12_loader`), and the
    text each null was written as, by key. A string field's plain scalar is the text as written
    (``compile_cache: off`` is ``'off'``, as ``--compile-cache off``); a YAML 1.1/1.2-ambiguous literal in
    another field is refused (:func:`_refuse_ambiguous`). Not a mapping: what the document holds.

    Raises:
      ConfigError: an ambiguous literal. yaml.YAMLError: not valid YAML.
    """
    import yaml

    loader = _yaml12_loader()(f)
    try:
        root = loader.get_single_node()
        if not isinstance(root, yaml.MappingNode):
            return (None if root is None else loader.construct_document(root)), {}
        data, nulls = {}, {}
        for key_node, node in root.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else loader.construct_object(key_node, True)
            kind = _kind(_field_name(key))
            if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
                data[key], nulls[key] = None, node.value or "empty"
                continue
            if kind is not None and isinstance(node, yaml.ScalarNode) and kind[0] == "str":
                data[key] = node.value  # the text as written
                continue
            if kind is not None:
                for item in [node] if isinstance(node, yaml.ScalarNode) else getattr(node, "value", []):
                    if isinstance(item, yaml.ScalarNode) and item.style is None:
                        _refuse_ambiguous(_field_name(key), item.value, kind[0], where)
            data[key] = loader.construct_object(node, deep=True)
        return data, nulls
    finally:
        loader.dispose()


def apply_preset(cfg: Config, name: str) -> Config:
    """``cfg`` with preset ``name``'s settings.

    Raises:
      ConfigError: for an unknown name.
    """
    if name not in PRESETS:
        raise ConfigError(f"bad --preset {name!r}; expected one of {', '.join(PRESETS)}")
    return dataclasses.replace(cfg, **PRESETS[name].settings)


def load_settings(path: str) -> dict:
    """The settings in a YAML (``.yaml``/``.yml``) or TOML (``.toml``) file: a mapping of Config field names
    (``num_envs`` or ``num-envs``) to values, each as its field's type. YAML is read as YAML 1.2's core
    schema (:func:`_read_yaml`): a string setting takes the text as written (``compile_cache: off``), numbers
    are read as in TOML and as the CLI reads them (``total_steps: 1e3`` is 1000), and the literals YAML 1.1
    reads otherwise (``010``, ``1:30``, ``yes``/``on`` for a bool) are refused.

    Raises:
      ConfigError: the file is missing or unreadable, not a mapping, names an unknown setting, gives a value
        its field does not take, or an ambiguous literal (one line naming it and what to write).
    """
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".yaml", ".yml", ".toml"):
        raise ConfigError(f"bad --config {path!r}: expected a .yaml, .yml or .toml file")
    where, nulls = f"--config {path!r}", {}
    try:
        if ext == ".toml":
            import tomllib

            with open(path, "rb") as f:
                data = tomllib.load(f)
        else:
            with open(path) as f:
                data, nulls = _read_yaml(f, where)
    except ConfigError:
        raise
    except OSError as err:
        raise ConfigError(f"bad --config {path!r}: {err.strerror or err}") from None
    except Exception as err:  # noqa: BLE001 - a parse error of either format
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"bad --config {path!r}: not valid {ext[1:].upper()} ({first})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"bad --config {path!r}: expected a mapping of settings (e.g. 'num_envs: 64'), got a "
                          f"{type(data).__name__}")
    return _check_fields(data, where, nulls)


def resumed_settings(path: str) -> dict:
    """The settings of the run whose checkpoint ``--resume path`` names (its latest, or the one named),
    with its cadence (:data:`~accerl_jax.run.checkpoint.RUN_CADENCE_FIELDS`: --log-every, --checkpoint-every,
    --keep-checkpoints, --on-nan) and without the per-invocation fields (log folder, progress, W&B,
    multi-host addresses, compile cache; :data:`~accerl_jax.run.checkpoint.PER_INVOCATION_FIELDS`), which a
    resumed run takes from its own flags.

    Raises:
      ConfigError: ``path`` is not a run folder or finished checkpoint (as ``--resume`` says), or its
        record holds fields this version does not know.
    """
    from accerl_jax.run import checkpoint

    saved = saved_settings(checkpoint.find_checkpoint(path, "--resume", latest_only=True).meta["config"],
                           f"--resume {path!r}", "resume")
    # --num-processes too: like the coordinator's address it is given per invocation (a run of two
    # processes may be resumed by one, which gives no multi-host flags).
    return {k: v for k, v in saved.items() if k not in checkpoint.PER_INVOCATION_FIELDS and k != "num_processes"}


def saved_settings(config: dict, where: str, verb: str) -> dict:
    """The Config fields of a configuration saved with a checkpoint (``config``: its JSON record), each as
    its field's type (a saved list becomes a tuple).

    Raises:
      ConfigError: ``bad <where>: ...`` if the record names fields this version does not know (``verb``
        it with the version that wrote it), or holds a value of the wrong type.
    """
    names = {f.name for f in dataclasses.fields(Config)}
    unknown = sorted(set(config) - names)
    if unknown:
        raise ConfigError(f"bad {where}: its checkpoint's configuration has fields this version of accerl_jax does "
                          f"not know ({', '.join(unknown)}); {verb} it with the version that wrote it")
    return {k: _typed(k, v, where) for k, v in config.items()}


def base_config(argv: list[str]) -> Config:
    """The defaults the command line's flags apply to: :class:`Config`'s, then ``--preset NAME``'s, then
    ``--config FILE``'s, or with ``--resume PATH`` the resumed run's own settings (so ``--resume PATH``
    alone continues the run as it was started; flags given with it may change the budget and logging).
    ``--preset``, ``--config`` and ``--resume`` are read from ``argv``, where tyro parses them again as
    ordinary flags.

    Raises:
      ConfigError: an unknown preset, a bad settings file, a bad ``--resume`` folder.
    """
    def value(name: str):
        for i, arg in enumerate(argv):
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
        return None

    cfg = Config()
    preset, path, resume = value("--preset"), value("--config"), value("--resume")
    if resume is not None and (preset is not None or path is not None):
        raise ConfigError(f"bad --resume {resume!r} with {'--preset' if preset is not None else '--config'}: a "
                          "resumed run keeps its own settings; give --resume alone (with --total-steps to extend it)")
    if resume is not None:
        return dataclasses.replace(cfg, **resumed_settings(resume))
    if preset is not None:
        cfg = apply_preset(cfg, preset)
    if path is not None:
        cfg = dataclasses.replace(cfg, **load_settings(path))
    return dataclasses.replace(cfg, preset=preset, config=path)
