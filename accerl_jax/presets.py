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
from typing import NamedTuple

from accerl_jax.config import Config, ConfigError, common_name


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
        "gymnax MinAtar (Breakout-MinAtar, Asterix-MinAtar, ...): 10x10 image channels, conv net",
        {"env": "gymnax:Breakout-MinAtar", "num_envs": 16, "rollout_length": 16, "total_steps": 2_000_000,
         "learning_rate": 1e-3, "loss": "actor-critic"},
        "measured on a 2-core CPU: Breakout-MinAtar past 5.0 within 200k steps with IMPALA's actor-critic "
        "(docs/RESULTS.md, section 2)"),
    "atari": Preset(
        "envpool Atari (Pong-v5, Breakout-v5, ...): 4 stacked 84x84 frames, Nature CNN, Sebulba loop",
        {"env": "envpool:Pong-v5", "loop": "sebulba", "loss": "actor-critic", "num_envs": 32, "rollout_length": 20,
         "total_steps": 10_000_000, "learning_rate": 6e-4, "entropy_coef": 0.01, "discount": 0.99,
         "max_grad_norm": 40.0},
        "IMPALA's Atari settings (Espeholt et al. 2018, appendix: unroll 20, learning rate 0.0006, entropy "
        "0.01, discount 0.99, gradient clip 40) with 32 environments; not tuned here"),
    "mujoco": Preset(
        "envpool MuJoCo (HalfCheetah-v4, Hopper-v4, ...): continuous actions, Gaussian policy, APPO",
        {"env": "envpool:HalfCheetah-v4", "loss": "appo", "num_envs": 32, "rollout_length": 64,
         "total_steps": 1_000_000, "learning_rate": 3e-4, "epochs": 10, "minibatches": 4, "lambda_": 0.95,
         "entropy_coef": 0.0, "max_grad_norm": 0.5, "compressor": "none"},
        "CleanRL's ppo_continuous_action (2048 steps per update, 10 epochs, learning rate 3e-4, GAE "
        "lambda 0.95, no entropy bonus, gradient clip 0.5) with 32 environments; not tuned here"),
}


def _check_fields(settings: dict, where: str) -> dict:
    names = {f.name for f in dataclasses.fields(Config)}
    fields = {}
    for key, value in settings.items():
        name = str(key).lstrip("-").replace("-", "_")
        if name == "lambda":
            name = "lambda_"
        if name not in names or name in ("preset", "config"):
            ours = common_name(name)  # another framework's name (lr, gamma, ent_coef): ours, else the closest spellings
            close = [ours] if ours else difflib.get_close_matches(name, sorted(names - {"preset", "config"}), n=2)
            hint = f" (perhaps {' or '.join(close)})" if close else ""
            raise ConfigError(f"bad {where}: unknown setting {key!r}{hint}; expected Config fields such as "
                              "env, compressor, total_steps, num_envs (see --help)")
        fields[name] = _typed(name, value, where)
    return fields


def _typed(name: str, value, where: str):
    """``value`` as Config field ``name``'s type (int, float, str, bool, optional, tuple of ints)."""
    kind = {f.name: str(f.type) for f in dataclasses.fields(Config)}[name]
    optional = kind.startswith("Optional[")
    base = kind[len("Optional["):-1] if optional else kind
    if value is None and optional:
        return None
    if base in ("int", "float") and isinstance(value, str):  # YAML 1.1 reads 3e-4 and 2e6 (no dot) as text
        try:
            number = float(value)  # also reads 1_024
        except ValueError:
            number = None
        if number is not None and (base == "float" or number.is_integer()):
            value = number if base == "float" else int(number)
    ok = {"int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool),
          "str": isinstance(value, str), "bool": isinstance(value, bool),
          "tuple[int, ...]": isinstance(value, (list, tuple)) and all(
              isinstance(v, int) and not isinstance(v, bool) for v in value)}.get(base, True)
    if not ok:
        what = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
                "tuple[int, ...]": "a list of integers"}.get(base, base)
        raise ConfigError(f"bad {where}: {name} = {value!r}; expected {what}{' or null' if optional else ''}")
    return float(value) if base == "float" else tuple(value) if base == "tuple[int, ...]" else value


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
    (``num_envs`` or ``num-envs``) to values.

    Raises:
      ConfigError: the file is missing or unreadable, not a mapping, or names an unknown setting.
    """
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".yaml", ".yml", ".toml"):
        raise ConfigError(f"bad --config {path!r}: expected a .yaml, .yml or .toml file")
    try:
        if ext == ".toml":
            import tomllib

            with open(path, "rb") as f:
                data = tomllib.load(f)
        else:
            import yaml

            with open(path) as f:
                data = yaml.safe_load(f)
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
    return _check_fields(data, f"--config {path!r}")


def resumed_settings(path: str) -> dict:
    """The settings of the run whose checkpoint ``--resume path`` names (its latest, or the one named),
    without the run-control fields (log folder, progress, logging, checkpoints, W&B, multi-host
    addresses and process count), which a resumed run takes from its own flags.

    Raises:
      ConfigError: ``path`` is not a run folder or finished checkpoint (as ``--resume`` says), or its
        record holds fields this version does not know.
    """
    from accerl_jax import checkpoint

    saved = saved_settings(checkpoint.find_checkpoint(path, "--resume", latest_only=True).meta["config"],
                           f"--resume {path!r}", "resume")
    # --num-processes too: like the coordinator's address it is given per invocation (a run of two
    # processes may be resumed by one, which gives no multi-host flags).
    return {k: v for k, v in saved.items() if k not in checkpoint.RUN_CONTROL_FIELDS and k != "num_processes"}


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
