"""Presets (--preset), settings files (--config) and the flags that override them; --lambda, --hidden-sizes,
--no-anneal-lr. Parsing only, except one tiny training run."""
from __future__ import annotations

import numpy as np
import pytest

from accerl_jax import train
from accerl_jax import run_training
from accerl_jax.config import Config, ConfigError, validate
from accerl_jax.tools.presets import PRESETS


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_loads_into_a_valid_configuration(name):
    cfg = train.parse_config(["--preset", name])
    validate(cfg)
    for field, value in PRESETS[name].settings.items():
        assert getattr(cfg, field) == value, field
    assert cfg.preset == name and PRESETS[name].source  # every preset says where its values come from


def test_config_file_then_flags_override(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("num-envs: 8\nlearning_rate: 0.0005\nhidden_sizes: [32, 16]\nlambda: 0.9\n")
    cfg = train.parse_config(["--preset", "minatar", "--config", str(path), "--learning-rate", "0.002"])
    assert (cfg.env, cfg.num_envs, cfg.learning_rate, cfg.hidden_sizes, cfg.lambda_) == (
        "gymnax:Breakout-MinAtar", 8, 0.002, (32, 16), 0.9)
    toml = tmp_path / "cfg.toml"
    toml.write_text('compressor = "none"\nrollout_length = 8\n')
    assert train.parse_config(["--config", str(toml)]).rollout_length == 8
    assert train.parse_config(["--lambda", "0.95"]).lambda_ == 0.95 == train.parse_config(["--lambda_", "0.95"]).lambda_


def test_settings_file_numbers_in_exponent_form_are_numbers(tmp_path):
    path = tmp_path / "cfg.yaml"  # YAML 1.1 (PyYAML) reads 3e-4 and 2e6 without a dot as strings
    path.write_text("learning_rate: 3e-4\ntotal_steps: 2e6\nnum_envs: 1_024\n")
    cfg = train.parse_config(["--config", str(path)])
    assert (cfg.learning_rate, cfg.total_steps, cfg.num_envs) == (3e-4, 2_000_000, 1024)
    assert isinstance(cfg.total_steps, int) and isinstance(cfg.learning_rate, float)
    path.write_text("total_steps: 2.5e3x\n")
    with pytest.raises(ConfigError, match="total_steps = '2.5e3x'; expected an integer"):
        train.parse_config(["--config", str(path)])
    path.write_text("num_envs: 1.5e1\n")  # 15.0 is a whole number: accepted as 15
    assert train.parse_config(["--config", str(path)]).num_envs == 15


@pytest.mark.parametrize("content, suffix, needle", [
    ("num_env: 8\n", ".yaml", "unknown setting 'num_env' (perhaps num_envs"),
    ("num_envs: eight\n", ".yaml", "num_envs = 'eight'; expected an integer"),
    ("- 1\n- 2\n", ".yaml", "expected a mapping of settings"),
    ("num_envs: [8\n", ".yaml", "not valid YAML"),
    ("num_envs = \n", ".toml", "not valid TOML"),
    ("num_envs: 8\n", ".json", "expected a .yaml, .yml or .toml file"),
])
def test_bad_settings_files_exit_2_naming_what_to_fix(tmp_path, capsys, content, suffix, needle):
    path = tmp_path / f"cfg{suffix}"
    path.write_text(content)
    assert train.main(["--config", str(path), "--logdir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and str(path) in err, err
    assert not (tmp_path / "run").exists()


def test_unknown_preset_and_missing_file_exit_2(tmp_path, capsys):
    assert train.main(["--preset", "pong"]) == 2
    assert "bad --preset 'pong'; expected one of classic, minatar, atari, mujoco, search" in capsys.readouterr().err
    assert train.main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "No such file" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="bad --hidden-sizes 0 8"):
        validate(Config(hidden_sizes=(0, 8)))


def test_preset_with_hidden_sizes_and_constant_learning_rate_trains(tmp_path):
    cfg = train.parse_config(["--preset", "classic", "--hidden-sizes", "32", "32", "32", "--no-anneal-lr",
                              "--total-steps", str(4 * 8 * 4), "--num-envs", "4", "--rollout-length", "8",
                              "--compressor", "distill:tiny", "--log-every", "2", "--checkpoint-every", "0",
                              "--logdir", str(tmp_path / "run"), "--no-progress"])
    summary = run_training(cfg)
    assert list(summary["learner_network"]["widths"]) == [32, 32, 32] and summary["updates"] == 4
    assert summary["learning_rate"] == pytest.approx(1e-3)  # not annealed: the last update's rate is the first's
    assert np.isfinite(summary["final_return_mean"] or 0.0)


def test_help_groups_every_flag_once_with_the_common_ones_first(capsys):
    import dataclasses

    from accerl_jax.tools import cli

    grouped = [f for _, _, fields in cli.GROUPS for f in fields]
    assert sorted(grouped) == sorted(f.name for f in dataclasses.fields(Config)), "a Config field is in no group or two"
    docs = cli.field_docs()
    assert set(docs) == set(grouped) and all(docs.values())  # every flag has its help
    with pytest.raises(SystemExit):
        train.parse_config(["--help-all"])
    out = capsys.readouterr().out
    import re

    # Each flag where its own help starts ("│ --flag" in a terminal, "  --flag" captured), not where another's names it.
    defined = re.findall(r"^(?:│ |  )(--[a-z0-9-]+)", out, flags=re.M)
    order = [defined.index(flag) for flag in ("--env", "--total-steps", "--seed", "--learning-rate", "--distill-steps",
                                              "--queue-size", "--checkpoint-every", "--coordinator-address")]
    assert order == sorted(order), "the common flags come first, then the groups in order"
    assert "common options" in out and "hosts options" in out


def test_resume_by_folder_alone_takes_the_runs_own_settings(tmp_path, capsys):
    """--resume RUN with no other flag continues the run with the flags it was started with; --total-steps
    given with it extends the run; a flag that changes the experiment, or --preset, is refused."""
    import json

    run = str(tmp_path / "run")
    flags = ["--compressor", "none", "--num-envs", "4", "--rollout-length", "8", "--hidden-sizes", "16",
             "--learning-rate", "0.002", "--checkpoint-every", "0", "--no-progress"]
    assert train.main(flags + ["--total-steps", "64", "--logdir", run]) == 0
    cfg = train.parse_config(["--resume", run])
    assert (cfg.compressor, cfg.num_envs, cfg.rollout_length, cfg.hidden_sizes, cfg.learning_rate, cfg.total_steps) == (
        "none", 4, 8, (16,), 0.002, 64)
    assert cfg.progress and cfg.logdir is None  # run-control flags are this session's own
    assert train.main(["--resume", run, "--total-steps", "128", "--no-progress"]) == 0
    with open(tmp_path / "run" / "summary.json") as f:
        summary = json.load(f)
    assert summary["updates"] == 4 and summary["resumed_from_update"] == 2
    capsys.readouterr()
    assert train.main(["--resume", run, "--total-steps", "192", "--compressor", "int8", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--compressor 'none' (checkpoint) vs 'int8' (now)" in err and "--resume alone takes them" in err
    assert train.main(["--resume", run, "--preset", "classic"]) == 2
    assert "a resumed run keeps its own settings" in capsys.readouterr().err
